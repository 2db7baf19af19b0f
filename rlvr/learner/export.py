"""`rlvr export --merge CKPT OUT`: a LoRA checkpoint (PEFT adapter) merged into its base model, written as a plain HF
model directory that transformers and vLLM load without peft.

The checkpoint is untrusted data: its adapter is read from JSON and safetensors only, and the base model (named by
the adapter's `base_model_name_or_path`, or `--base`) is loaded from safetensors only (`use_safetensors=True`), so
nothing is unpickled. The merge runs in float32 (W + (alpha / r) B A) and the result is saved in the base's dtype.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from rlvr.cli.outpaths import check_new_dir

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
)


def merge_checkpoint(ckpt: str | Path, out: str | Path, base: str | None = None) -> Path:
    """Write the merged model (+ the checkpoint's tokenizer files) to `out`; ValueError for a bad checkpoint or
    an `out` that must not be written: it must not exist yet (or be an empty directory), and is never the
    checkpoint, inside it, or the base model. Checked before anything is loaded. The model is written into a
    temporary directory beside `out`, renamed to `out` at the end: a failure leaves nothing behind."""
    ckpt, out = Path(ckpt), Path(out)
    out = check_new_dir(out, "OUT", inputs=[ckpt, *([base] if base else [])])

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlvr.rollout import lora

    if not (ckpt / lora.CONFIG_FILE).is_file():
        raise ValueError(
            f"{ckpt}: no LoRA adapter ({lora.CONFIG_FILE}); a checkpoint of full fine-tuning is already "
            "a merged HF model: load it directly"
        )
    config, tensors = lora.read_adapter_dir(ckpt)
    base = base or config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{ckpt / lora.CONFIG_FILE} names no base model: pass --base PATH")
    dtype = getattr(AutoConfig.from_pretrained(base), "dtype", None) or torch.float32
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, use_safetensors=True)
    targets = config.get("target_modules")  # read_adapter_dir checked the fields used here (check_adapter_config)
    if targets is None:
        raise ValueError(f"{ckpt / lora.CONFIG_FILE}: target_modules is missing (the modules the adapter adapts)")
    spec = lora.LoraSpec(
        config["r"],
        config.get("lora_alpha", config["r"]),
        0.0,
        tuple([targets] if isinstance(targets, str) else targets),
    )
    wrapped = lora.wrap(model, spec, base)
    lora.load_adapter_tensors(wrapped, tensors)
    merged = wrapped.merge_and_unload().to(dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype)))
    check_new_dir(out, "OUT", inputs=[ckpt, base])  # again: a model dir named only by the adapter, or a race
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        merged.save_pretrained(tmp, safe_serialization=True)
        for name in TOKENIZER_FILES:
            if (ckpt / name).is_file():
                shutil.copyfile(ckpt / name, tmp / name)
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 -> what mkdir would have made
        os.replace(tmp, out)  # an empty `out` is replaced; one that filled up meanwhile makes this fail
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rlvr export", description="Export a LoRA checkpoint as a merged HF model.")
    p.add_argument("--merge", action="store_true", help="merge the checkpoint's LoRA adapter into its base model")
    p.add_argument("checkpoint", help="RUN_DIR/checkpoints/step_N of a run with --learner.lora-rank > 0")
    p.add_argument(
        "out", help="new directory for the merged model (safetensors, config, tokenizer); must not exist or be empty"
    )
    p.add_argument("--base", default=None, help="base model directory (default: the adapter's base_model_name_or_path)")
    a = p.parse_args(argv)
    if not a.merge:
        print("rlvr export: only --merge is supported (rlvr export --merge CKPT OUT)", file=sys.stderr)
        return 2
    try:
        out = merge_checkpoint(a.checkpoint, a.out, a.base)
    except (ValueError, OSError) as e:
        print(f"rlvr export: error: {e}", file=sys.stderr)
        return 2
    print(f"merged model written to {out}")
    return 0
