"""Learner microbenchmark (issue 7): the exact `LearnerWorker.train_batch` on a synthetic packed batch, per
model shape and per flag variant, with learner MFU, tokens/s, forward-only time, peak memory, and (optionally)
a torch.profiler breakdown of one training step by kernel class. One JSON line per measurement.

    python3 bench/gpu_learner.py --shapes qwen2.5-0.5b,qwen2.5-1.5b --samples 64 --max-new-tokens 512 \
        --variants "before=--model.attn-implementation sdpa --learner.fused-head False;now=" --profile now
    (the default --variants compares the learner before the fast path with configs/gpu-2x.yaml as it is)

The batch has the shape of one rlvr step: prompts from the built-in copy4 task (rlvr's own PromptStream),
completions of exactly --max-new-tokens random tokens, packed with rlvr's packer into --pack-length rows
(configs/gpu-2x.yaml: DeepSpeed ZeRO-2, bf16, torch_varlen attention, fused head, compiled layers, no
activation checkpointing, 16k-token rows, unless a variant overrides it). The first train_batch is warm-up; the figure is the mean of the next --reps.
MFU = (6 N + 6 L d S) * tokens / (seconds * peak), N = matmul parameters incl. the lm_head, S = mean sample
length, peak 989e12 (H100/H200 bf16 dense datasheet). Gradient checkpointing's recompute is not counted (MFU,
not HFU). `forward_mfu` is the forward-only pass (no grad) against its own 2 N + 2 L d S flops per token.
`gpu_grpo.py` runs the same measurement as its `learner` lane.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import shlex
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# the learner as it was before the fast path (sdpa block masks, autograd head, checkpointing, 4k rows)
BEFORE = "--model.attn-implementation sdpa --learner.fused-head False --learner.compile False --model.gradient-checkpointing True --learner.pack-length 4096"
PEAKS = {"H100": 989e12, "H200": 989e12, "GH200": 989e12, "H800": 989e12, "A100": 312e12, "B200": 2250e12}


_print_lock = threading.Lock()


def emit(obj: dict[str, Any], out_file: Path | str | None = None) -> None:
    """One JSON line to stdout (and appended to out_file); whole lines even from several threads."""
    line = json.dumps(obj, default=str)
    with _print_lock:
        print(line, flush=True)
        if out_file is not None:
            with open(out_file, "a") as f:
                f.write(line + "\n")


def rnd(x: Any, n: int = 4) -> Any:
    """Rounded float; None for NaN/inf (JSON has neither)."""
    if isinstance(x, float):
        return None if math.isnan(x) or math.isinf(x) else round(x, n)
    return x


def model_facts(model_dir: str) -> dict[str, Any]:
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    d, L, inter, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["vocab_size"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    kv_dim = d // heads * kv
    per_layer = d * d + 2 * d * kv_dim + d * d + 3 * d * inter  # q, k, v, o, gate/up/down
    return {"N_matmul": L * per_layer + V * d, "L": L, "d": d, "heads": heads, "kv_heads": kv, "vocab": V}


def peak_for(card: str) -> float | None:
    for key in ("GH200", "H200", "H100", "H800", "A100", "B200"):
        if key in card:
            return PEAKS[key]
    return None


def mfu(
    facts: dict[str, Any], tokens: float, seq_len: float, seconds: float, gpus: int, peak: float | None, passes: int = 6
) -> Any:
    """passes = 6 for forward + backward (2 + 4), 2 for a forward only."""
    if not peak or not seconds or not tokens:
        return None
    flops = (passes * facts["N_matmul"] + passes * facts["L"] * facts["d"] * seq_len) * tokens
    return flops / (seconds * gpus * peak)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def train_argv(model_dir: str, max_new_tokens: int, group_size: int) -> list[str]:
    return [
        "--config",
        "configs/gpu-2x.yaml",
        "--model.path",
        model_dir,
        "--data.datasets",
        "builtin:copy4",
        "--data.apply-chat-template",
        "False",
        "--generation.max-new-tokens",
        str(max_new_tokens),
        "--generation.num-samples",
        str(group_size),
        "--learner.lr",
        "1e-6",
    ]


def attention_probe(facts: dict[str, Any], T: int, card: str) -> dict[str, Any]:
    """One layer's attention forward+backward at the pack length: SDPA plain causal, SDPA with the block-causal
    bool mask transformers builds for packed rows, and torch's varlen flash kernel on ~520-token segments."""
    import torch
    import torch.nn.functional as F

    from rlvr.learner import attention

    h, d = facts["heads"], facts["d"] // facts["heads"]
    res: dict[str, Any] = {
        "kind": "attention_probe",
        "card": card,
        "T": T,
        "heads": h,
        "head_dim": d,
        "layers": facts["L"],
    }
    try:
        q, k, v = (torch.randn(1, h, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        pos = torch.arange(T, device="cuda") % 520
        seg = torch.arange(T, device="cuda") // 520
        mask = (seg[:, None] == seg[None, :]) & (pos[:, None] >= pos[None, :])
        meta = attention.varlen_metadata(pos[None].clone())
        cases = {
            "sdpa_causal_no_mask": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "sdpa_block_mask": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None]),
            "torch_varlen": lambda: attention.varlen_attention_forward(torch.nn.Module(), q, k, v, None, **meta)[0],
        }
        for label, fn in cases.items():
            for i in range(5):
                if i == 2:
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                fn().float().sum().backward()
            torch.cuda.synchronize()
            res[f"{label}_ms_per_layer"] = round((time.perf_counter() - t) / 3 * 1e3, 3)
    except Exception as e:  # a probe failing must not stop the microbench
        res["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return res


def _kernel_class(name: str) -> str:
    n = name.lower()
    if any(k in n for k in ("gemm", "cutlass", "sm90_xmma", "cublas", "matmul", "nvjet", "ampere_bf16", "sm80_xmma")):
        return "gemm"
    if any(k in n for k in ("flash", "fmha", "attention", "attn")):
        return "attention"
    if any(k in n for k in ("nccl", "allreduce", "reduce_scatter", "all_gather")):
        return "communication"
    if "memcpy" in n or "memset" in n:
        return "copy"
    return "elementwise/other"


def profile_step(worker: Any, pb: Any) -> dict[str, Any]:
    """CUDA time of one train_batch by kernel class and the top kernels (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        worker.train_batch([pb])
        _sync("cuda")
    rows = []
    for e in prof.key_averages():
        dev_us = getattr(e, "self_device_time_total", None)
        if dev_us is None:
            dev_us = getattr(e, "self_cuda_time_total", 0)
        if dev_us and e.device_type.name == "CUDA":
            rows.append((e.key, dev_us, e.count))
    total = sum(r[1] for r in rows) or 1.0
    classes: dict[str, float] = {}
    for key, us, _ in rows:
        classes[_kernel_class(key)] = classes.get(_kernel_class(key), 0.0) + us
    top = sorted(rows, key=lambda r: -r[1])[:15]
    return {
        "kind": "learner_profile",
        "gpu_kernel_s": round(total / 1e6, 3),
        "share_by_class": {k: round(v / total, 3) for k, v in sorted(classes.items(), key=lambda kv: -kv[1])},
        "top_kernels": [
            {"name": k[:90], "s": round(us / 1e6, 4), "calls": c, "share": round(us / total, 3)} for k, us, c in top
        ],
    }


def run_variants(spec: dict[str, Any]) -> None:
    """Every variant of spec["variants"] on one model dir; emits one `learner_microbench` line each.

    Each variant runs in its own process (spec["isolate"], default on): DeepSpeed engines are not freed by
    `del`, and in one process the third 1.5B variant ran out of memory on an 80 GB GPU."""
    if spec.get("isolate", True) and len(spec["variants"]) > 1:
        import subprocess
        import tempfile

        deadline = time.time() + spec["timeout_s"]
        for i, variant in enumerate(spec["variants"]):
            left = deadline - time.time()
            if left < 25:
                emit({"kind": "learner_microbench", "variant": variant[0], "skipped": "out of time"}, spec.get("out"))
                continue
            child = {
                **spec,
                "variants": [list(variant)],
                "isolate": False,
                "timeout_s": left,
                "attention_probe": spec.get("attention_probe", True) and i == 0,
                "out": str(spec["out"]) if spec.get("out") else None,
            }
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(child, f)
            try:
                subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--variant-spec", f.name],
                    timeout=left + 10,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                emit({"kind": "learner_microbench", "variant": variant[0], "error": "timed out"}, spec.get("out"))
        return
    import torch
    from transformers import AutoTokenizer

    from rlvr.algorithms.packing import PackInput, build_packed_batches
    from rlvr.cli import parse_train_args
    from rlvr.data import PromptStream
    from rlvr.learner.worker import LearnerWorker

    facts, peak, card = spec["facts"], spec["peak"], spec["card"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    deadline = time.time() + spec["timeout_s"] - 5
    if device == "cuda" and spec.get("attention_probe", True):
        emit({**attention_probe(facts, spec["pack_length"], card), "shape": spec.get("shape")}, spec.get("out"))
    for name, flags in spec["variants"]:
        if time.time() > deadline - 20:
            emit({"kind": "learner_microbench", "variant": name, "skipped": "out of time"}, spec.get("out"))
            continue
        rec: dict[str, Any] = {
            "kind": "learner_microbench",
            "shape": spec.get("shape"),
            "variant": name,
            "flags": flags,
            "card": card,
            "peak_flops": peak,
            "device": device,
        }
        try:
            cfg = parse_train_args(spec["argv"] + shlex.split(flags)).experiment
            stream = PromptStream(cfg, tok)
            G, M, V = cfg.generation.num_samples, cfg.generation.max_new_tokens, facts["vocab"]
            plens = [len(stream.next_request().prompt_token_ids) for _ in range(spec["samples"] // G + 1)]
            rng = random.Random(0)
            inputs = [
                PackInput(
                    i,
                    [rng.randrange(2, V) for _ in range(plens[i // G])],
                    [rng.randrange(2, V) for _ in range(M)],
                    [-12.0] * M,
                    1.0 if i % 2 else -1.0,
                )
                for i in range(spec["samples"])
            ]
            pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
            pb = build_packed_batches(
                inputs,
                pack_length=cfg.learner.pack_length,
                num_ranks=1,
                micro_batch_rows=cfg.learner.micro_batch_rows,
                pad_token_id=pad,
            )[0]
            tokens = sum(x.num_tokens for x in inputs)
            t = time.perf_counter()
            w = LearnerWorker(cfg, spec["model_dir"], 0, 1, "127.0.0.1", port, device=device)
            rec["load_s"] = round(time.perf_counter() - t, 2)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            times = []
            for _ in range(1 + spec["reps"]):  # the first call is warm-up
                _sync(device)
                t = time.perf_counter()
                w.train_batch([pb])
                _sync(device)
                times.append(time.perf_counter() - t)
            w._recompute(w.model, [pb])  # warm-up (torch.compile builds the inference graphs here)
            _sync(device)
            t = time.perf_counter()
            w._recompute(w.model, [pb])  # forward-only log-probs (what num_mini_batches > 1 adds per step)
            _sync(device)
            fwd = time.perf_counter() - t
            train_s = sum(times[1:]) / len(times[1:])
            seq = tokens / len(inputs)
            rec.update(
                {
                    "samples": len(inputs),
                    "tokens": tokens,
                    "rows": sum(mb.input_ids.shape[0] for mb in pb.micro_batches),
                    "micro_batches": len(pb.micro_batches),
                    "pack_length": cfg.learner.pack_length,
                    "micro_batch_rows": cfg.learner.micro_batch_rows,
                    "zero_stage": cfg.learner.zero_stage,
                    "gradient_checkpointing": cfg.model.gradient_checkpointing,
                    "fused_head": cfg.learner.fused_head,
                    "compile": cfg.learner.compile,
                    "logprob_chunk_size": cfg.learner.logprob_chunk_size,
                    "attn_implementation": str(getattr(w.model.config, "_attn_implementation", "?")),
                    "train_s": round(train_s, 3),
                    "train_s_all": [round(x, 3) for x in times],
                    "tokens_per_s": round(tokens / train_s, 1),
                    "mfu": rnd(mfu(facts, tokens, seq, train_s, 1, peak)),
                    "forward_logprobs_s": round(fwd, 3),
                    "forward_mfu": rnd(mfu(facts, tokens, seq, fwd, 1, peak, 2)),
                    "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if device == "cuda" else None,
                    "padding_waste": rnd(1 - pb.metrics.get("perf/padded_token_efficiency", float("nan"))),
                    "packing_efficiency": rnd(pb.metrics.get("perf/packing_efficiency", float("nan"))),
                }
            )
            if device == "cuda" and name in spec.get("profile", []):
                emit(
                    {**profile_step(w, pb), "shape": spec.get("shape"), "variant": name, "card": card}, spec.get("out")
                )
            del w
        except (Exception, SystemExit) as e:  # one variant failing (OOM, bad flag) must not stop the rest
            rec["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        emit(rec, spec.get("out"))


def parse_variants(text: str) -> list[tuple[str, str]]:
    return [tuple(v.split("=", 1)) if "=" in v else (v, "") for v in text.split(";") if v.strip()]  # type: ignore[misc]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-1.5b")
    p.add_argument(
        "--variants",
        default=f"before={BEFORE};now=",
        help="';'-separated NAME=FLAGS (rlvr train flags on top of configs/gpu-2x.yaml)",
    )
    p.add_argument("--profile", default="", help="comma-separated variant names to profile once")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=400.0, help="per shape")
    p.add_argument("--out", default=None, help="append the JSON lines to this file too")
    p.add_argument("--variant-spec", help=argparse.SUPPRESS)  # one isolated variant (run_variants' child)
    a = p.parse_args()
    if a.variant_spec:
        run_variants(json.loads(Path(a.variant_spec).read_text()))
        return 0
    import torch

    from rlvr.data import builtin_corpus
    from rlvr.models.shaped import build_shaped_model_dir

    card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    out = Path(a.out) if a.out else None
    for shape in [s for s in a.shapes.split(",") if s]:
        model_dir = f"/tmp/rlvr-bench-model-{shape}"
        build_shaped_model_dir(shape, list(builtin_corpus("copy4")), model_dir, 0)
        facts = model_facts(model_dir)
        run_variants(
            {
                "argv": train_argv(model_dir, a.max_new_tokens, a.group_size),
                "model_dir": model_dir,
                "card": card,
                "facts": facts,
                "peak": peak_for(card),
                "variants": parse_variants(a.variants),
                "samples": a.samples,
                "reps": a.reps,
                "timeout_s": a.budget_s,
                "pack_length": 4096,
                "shape": shape,
                "profile": [x for x in a.profile.split(",") if x],
                "out": str(out) if out else None,
            }
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
