"""`rlvr export --merge CKPT OUT`: a LoRA checkpoint (PEFT adapter) merged into its base model, written as a plain HF
model directory that transformers and vLLM load without peft.

The checkpoint is untrusted data: its adapter is read from JSON and safetensors only, and the base model (named by
the adapter's `base_model_name_or_path`, or `--base`) is loaded from safetensors only (`use_safetensors=True`), so
nothing is unpickled. The merge runs in float32 (W + (alpha / r) B A) and the result is saved in the base's dtype.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

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
    """Write the merged model (+ the checkpoint's tokenizer files) to `out`; ValueError for a bad checkpoint."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlvr.rollout import lora

    ckpt, out = Path(ckpt), Path(out)
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
    targets = config.get("target_modules") or []
    spec = lora.LoraSpec(
        int(config["r"]),
        int(config.get("lora_alpha", config["r"])),
        0.0,
        tuple([targets] if isinstance(targets, str) else targets),
    )
    wrapped = lora.wrap(model, spec, base)
    lora.load_adapter_tensors(wrapped, tensors)
    merged = wrapped.merge_and_unload().to(dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype)))
    out.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (ckpt / name).is_file():
            shutil.copyfile(ckpt / name, out / name)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rlvr export", description="Export a LoRA checkpoint as a merged HF model.")
    p.add_argument("--merge", action="store_true", help="merge the checkpoint's LoRA adapter into its base model")
    p.add_argument("checkpoint", help="RUN_DIR/checkpoints/step_N of a run with --learner.lora-rank > 0")
    p.add_argument("out", help="directory for the merged model (safetensors, config, tokenizer)")
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
