"""Does the demo task get SOLVED, on a GPU (vLLM + DeepSpeed) or on CPU? Prints ONE JSON line per run.

Each seed runs `rlvr train --config CONFIG --seed S` in a fresh subprocess (its own local Ray cluster) and reads
its eval.jsonl: greedy eval reward and exact-match pass@1 on the held-out split at step 0 and every
`eval.every_n_steps` steps after.

    {"card": "NVIDIA H100 80GB HBM3" | "cpu", "config": "configs/gpu-demo.yaml", "seed": 0,
     "curve": [[step, eval_reward, pass@1], ...], "pass@1": final pass@1, "gain": final - step-0 reward,
     "wall_s": whole run (Ray start, model build, engine start, training, evals, shutdown), "rc": exit status,
     "solved": pass@1 >= 0.5 and gain >= 0.5}

Run:
    python bench/gpu_learning.py                          # configs/gpu-demo.yaml on the GPU, seeds 0 1 2
    python bench/gpu_learning.py --device cpu             # the CPU demo (`rlvr train` with no arguments)
    python bench/gpu_learning.py --config configs/gpu-demo.yaml --seeds 0 -- --cluster.colocate False \
        --cluster.gpus-per-node 2                         # the 2-GPU variant (1 learner + 1 engine, NCCL)
Extra `rlvr train` flags go after `--`. `--out FILE` also appends each line to FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_learning import read_curve  # noqa: E402  ([[step, eval reward, pass@1], ...] from eval.jsonl)
SOLVED_PASS_AT_1 = 0.5
SOLVED_GAIN = 0.5


def card(device: str) -> str:
    if device == "cpu":
        return "cpu"
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (no CUDA)"
    except ImportError:
        return "cpu (no torch)"


def run_one(config: str | None, seed: int, out_dir: Path, extra: list[str]) -> dict[str, Any]:
    name = f"seed{seed}"
    argv = [sys.executable, "-m", "rlvr.cli", "train"]
    if config:
        argv += ["--config", config]
    argv += ["--seed", str(seed), "--checkpoint.output-dir", str(out_dir), "--logging.run-name", name,
             "--checkpoint.save-final", "False", "--checkpoint.resume", "never",
             "--logging.console-progress", "False", *extra]
    t0 = time.perf_counter()
    log = out_dir / f"{name}.log"
    with open(log, "w") as f:
        proc = subprocess.run(argv, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=os.environ.copy())
    wall = time.perf_counter() - t0
    try:
        curve = read_curve(out_dir / name)
    except (OSError, json.JSONDecodeError, KeyError):
        curve = []
    if proc.returncode != 0 or len(curve) < 2:
        tail = log.read_text(errors="replace")[-3000:]
        print(f"seed {seed}: rlvr train exited {proc.returncode}; log tail:\n{tail}", file=sys.stderr)
    final_pass = curve[-1][2] if curve else None
    gain = round(curve[-1][1] - curve[0][1], 4) if len(curve) >= 2 else None
    return {"curve": curve, "pass@1": final_pass, "gain": gain, "wall_s": round(wall, 1), "rc": proc.returncode,
            "solved": bool(final_pass is not None and gain is not None and final_pass >= SOLVED_PASS_AT_1
                           and gain >= SOLVED_GAIN)}


def main() -> None:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--config", default=None,
                    help="preset (default: configs/gpu-demo.yaml on cuda; the built-in demo on cpu)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--output-dir", default=None, help="parent of the run directories (default: a temp dir)")
    ap.add_argument("--out", default=None, help="also append each JSON line to this file")
    args = ap.parse_args(argv)
    config = args.config or ("configs/gpu-demo.yaml" if args.device == "cuda" else None)
    out_dir = Path(args.output_dir or tempfile.mkdtemp(prefix="rlvr-learning-")).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    the_card = card(args.device)
    for seed in args.seeds:
        res = run_one(config, seed, out_dir, extra)
        line = json.dumps({"card": the_card, "config": config or "default (configs/tiny-cpu.yaml)",
                           "extra_flags": extra, "seed": seed, **res})
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
