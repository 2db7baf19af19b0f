"""Does the demo task get SOLVED, on a GPU (vLLM + DeepSpeed) or on CPU? Prints ONE JSON line per run.

Each seed runs `rlvr train --config CONFIG --seed S` in a fresh subprocess (its own local Ray cluster) and reads
its eval.jsonl: greedy eval reward and exact-match pass@1 on the held-out split at step 0 and every
`eval.every_n_steps` steps after.

    {"card": "NVIDIA H100 80GB HBM3" | "cpu", "config": "configs/gpu-demo.yaml", "seed": 0,
     "curve": [[step, eval_reward, pass@1], ...], "pass@1": final pass@1, "gain": final - step-0 reward,
     "wall_s": whole run (Ray start, model build, engine start, training, evals, shutdown), "rc": exit status,
     "solved": pass@1 >= 0.5 and gain >= 0.5}

With several eval sets (the real-model preset), `curve`, `pass@1` and `gain` are the headline set's (the first
of `eval.datasets`) and `by_dataset` holds every set's curve, first and final pass@1 and pass@1 gain; "solved"
is then the preset's own targets (`TARGETS`).

Run:
    python bench/gpu_learning.py                          # configs/gpu-demo.yaml on the GPU, seeds 0 1 2
    python bench/gpu_learning.py --config configs/gpu-real-smollm2.yaml --parallel   # SmolLM2, 3 seeds at once
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
SMOLLM2_TARGETS = {"arith-l2": {"pass@1": 0.8}, "word-problems": {"gain": 0.2}}
TARGETS: dict[str, dict[str, dict[str, float]]] = {
    # config file name -> eval set -> {"pass@1": final >=, "gain": pass@1 gain >=}
    "gpu-real-smollm2.yaml": SMOLLM2_TARGETS,
    "gpu-real-smollm2-2x.yaml": SMOLLM2_TARGETS,  # the same preset on 2 GPUs: the same targets
}


def read_dataset_curves(run_dir: Path) -> dict[str, list[list[float]]]:
    """{eval set: [[step, reward, pass@1], ...]} from the `eval/dataset/<name>/...` keys of eval.jsonl (a built-in
    task's name without its `builtin:` prefix)."""
    curves: dict[str, dict[int, tuple[float, float]]] = {}
    with open(run_dir / "eval.jsonl") as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            for key, value in rec.items():
                if key.startswith("eval/dataset/") and key.endswith("/pass@1"):
                    name = key[len("eval/dataset/") : -len("/pass@1")]
                    reward = rec.get(f"eval/dataset/{name}/reward/total_mean", value)
                    short = name.removeprefix("builtin:")
                    curves.setdefault(short, {})[int(rec["step"])] = (float(reward), float(value))
    return {n: [[st, round(c[st][0], 4), round(c[st][1], 4)] for st in sorted(c)] for n, c in curves.items()}


def _summary(curve: list[list[float]]) -> dict[str, Any]:
    return {
        "curve": curve,
        "pass@1_start": curve[0][2] if curve else None,
        "pass@1": curve[-1][2] if curve else None,
        "gain": round(curve[-1][2] - curve[0][2], 4) if len(curve) >= 2 else None,
    }


def _targets_met(config: str | None, by_dataset: dict[str, dict[str, Any]]) -> bool | None:
    targets = TARGETS.get(Path(config or "").name)
    if targets is None:
        return None
    for name, want in targets.items():
        got = by_dataset.get(name)
        if got is None or any(got.get(k) is None or got[k] < v for k, v in want.items()):
            return False
    return True


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
    argv += [
        "--seed",
        str(seed),
        "--checkpoint.output-dir",
        str(out_dir),
        "--logging.run-name",
        name,
        "--checkpoint.save-final",
        "False",
        "--checkpoint.resume",
        "never",
        "--logging.console-progress",
        "False",
        *extra,
    ]
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
    try:
        by_dataset = {n: _summary(c) for n, c in read_dataset_curves(out_dir / name).items()}
    except (OSError, json.JSONDecodeError, KeyError):
        by_dataset = {}
    if by_dataset:
        headline = next(iter(TARGETS.get(Path(config or "").name) or by_dataset))  # first target set, else first set
        h = by_dataset.get(headline, {})
        res = {
            "headline": headline,
            "curve": h.get("curve", []),
            "pass@1": h.get("pass@1"),
            "gain": h.get("gain"),
            "by_dataset": by_dataset,
            "wall_s": round(wall, 1),
            "rc": proc.returncode,
        }
        met = _targets_met(config, by_dataset)
        res["solved"] = (
            bool(met)
            if met is not None
            else bool(res["pass@1"] is not None and res["gain"] is not None and res["pass@1"] >= SOLVED_PASS_AT_1)
        )
        return res
    final_pass = curve[-1][2] if curve else None
    gain = round(curve[-1][1] - curve[0][1], 4) if len(curve) >= 2 else None
    return {
        "curve": curve,
        "pass@1": final_pass,
        "gain": gain,
        "wall_s": round(wall, 1),
        "rc": proc.returncode,
        "solved": bool(
            final_pass is not None and gain is not None and final_pass >= SOLVED_PASS_AT_1 and gain >= SOLVED_GAIN
        ),
    }


def main() -> None:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument(
        "--config", default=None, help="preset (default: configs/gpu-demo.yaml on cuda; the built-in demo on cpu)"
    )
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--output-dir", default=None, help="parent of the run directories (default: a temp dir)")
    ap.add_argument("--out", default=None, help="also append each JSON line to this file")
    ap.add_argument(
        "--parallel",
        action="store_true",
        help="run the seeds side by side (one process each, started --stagger-s apart) on the same GPU",
    )
    ap.add_argument("--stagger-s", type=float, default=40.0)
    args = ap.parse_args(argv)
    config = args.config or ("configs/gpu-demo.yaml" if args.device == "cuda" else None)
    out_dir = Path(args.output_dir or tempfile.mkdtemp(prefix="rlvr-learning-")).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    the_card = card(args.device)

    def report(seed: int, res: dict[str, Any]) -> None:
        line = json.dumps(
            {
                "card": the_card,
                "config": config or "default (configs/tiny-cpu.yaml)",
                "extra_flags": extra,
                "seed": seed,
                "parallel": args.parallel,
                **res,
            }
        )
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")

    if not args.parallel:
        for seed in args.seeds:
            report(seed, run_one(config, seed, out_dir, extra))
        return
    from concurrent.futures import ThreadPoolExecutor

    def staggered(i: int, seed: int) -> dict[str, Any]:
        time.sleep(i * args.stagger_s)  # engine start-ups (memory profiling) must not overlap
        return run_one(config, seed, out_dir, extra)

    with ThreadPoolExecutor(len(args.seeds)) as pool:
        futures = [pool.submit(staggered, i, s) for i, s in enumerate(args.seeds)]
        for seed, fut in zip(args.seeds, futures):
            report(seed, fut.result())


if __name__ == "__main__":
    main()
