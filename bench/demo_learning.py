"""The tiny CPU demo's learning result: is the task SOLVED? Prints ONE JSON line.

Runs the built-in default config (`rlvr train` with no arguments: the `copy4` task, see
rlvr/config/presets.py) for seeds 0, 1, 2 one after another, each in a fresh subprocess (its own local Ray
cluster), and reads each run's eval.jsonl: greedy `eval/reward_mean` and exact-match `eval/pass@1` (the exact
string, then EOS) on the held-out test split at step 0 (before training) and every `eval.every_n_steps` after.

    {"seeds": [0, 1, 2], "curves": {"0": [[step, eval_reward, pass@1], ...], ...}, "gains": {"0": g, ...},
     "mean_gain": x, "pass@1": {"0": p, ...}, "min_pass@1": m, "wall_s": {"0": s, ...}, "max_wall_s": y}

gain = eval reward at the last step - eval reward at step 0; pass@1 = at the last step; wall_s is the whole
`rlvr train` run (Ray start, model build, training, evals, shutdown). Target: every seed solves the task
(pass@1 >= 0.5) and max_wall_s < 600 on 2 cores. `bench/gpu_learning.py --device cpu` runs the same demo and
prints one line per seed in the GPU bench's format.

Run: python bench/demo_learning.py [--seeds 0 1 2] [--output-dir DIR] [-- RLVR TRAIN FLAGS]   (1.5-2 minutes a
seed on 2 CPU cores). Flags after `--` change the demo's config the way `rlvr train` takes them, e.g. the LoRA demo:
python bench/demo_learning.py -- --learner.lora-rank 8 --learner.lr 1e-2; they are echoed as "flags".
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def run_seed_inprocess(seed: int, output_dir: str, flags: list[str] | None = None) -> int:
    """Train the default config (with `rlvr train` flags applied) with `seed` into `output_dir`/seed<seed>."""
    from rlvr import train
    from rlvr.cli import parse_train_args
    from rlvr.config import from_dict, validate

    cfg = validate(
        from_dict(
            base=parse_train_args(list(flags or [])).experiment,
            data={
                "seed": seed,
                "checkpoint": {"output_dir": output_dir, "save_final": False, "resume": "never"},
                "logging": {"run_name": f"seed{seed}", "console_progress": False, "wandb_mode": "off"},
            },
        )
    )
    return train(cfg)


def read_curve(run_dir: Path) -> list[list[float]]:
    """[[step, eval/reward_mean, eval/pass@1], ...] from a run's eval.jsonl, in step order."""
    curve: dict[int, tuple[float, float]] = {}
    with open(run_dir / "eval.jsonl") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                curve[int(rec["step"])] = (float(rec["eval/reward_mean"]), float(rec.get("eval/pass@1", 0.0)))
    return [[s, round(curve[s][0], 4), round(curve[s][1], 4)] for s in sorted(curve)]


def run_seed(seed: int, output_dir: str | Path, flags: list[str] | None = None) -> dict[str, Any]:
    """One seed in a fresh subprocess: {"curve", "gain", "wall_s", "rc"}."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, __file__, "--one-seed", str(seed), "--output-dir", str(output_dir), "--", *(flags or [])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"seed {seed}: rlvr train exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    curve = read_curve(Path(output_dir) / f"seed{seed}")
    if len(curve) < 2 or curve[0][0] != 0:
        raise RuntimeError(f"seed {seed}: eval.jsonl has no step-0 baseline and final eval: {curve}")
    return {
        "curve": curve,
        "gain": round(curve[-1][1] - curve[0][1], 4),
        "pass@1": curve[-1][2],
        "wall_s": round(wall, 1),
        "rc": proc.returncode,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--output-dir", default=None, help="parent of the run directories (default: a temp dir)")
    ap.add_argument("--one-seed", type=int, default=None, help=argparse.SUPPRESS)  # the per-seed subprocess
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    if args.one_seed is not None:
        sys.exit(run_seed_inprocess(args.one_seed, args.output_dir, flags))
    out = args.output_dir or tempfile.mkdtemp(prefix="rlvr-demo-learning-")
    results = {s: run_seed(s, out, flags) for s in args.seeds}
    gains = {str(s): r["gain"] for s, r in results.items()}
    walls = {str(s): r["wall_s"] for s, r in results.items()}
    print(
        json.dumps(
            {
                "seeds": args.seeds,
                "flags": flags,
                "curves": {str(s): r["curve"] for s, r in results.items()},
                "gains": gains,
                "mean_gain": round(sum(gains.values()) / len(gains), 4),
                "pass@1": {str(s): r["pass@1"] for s, r in results.items()},
                "min_pass@1": min(r["pass@1"] for r in results.values()),
                "wall_s": walls,
                "max_wall_s": max(walls.values()),
                "output_dir": out,
            }
        )
    )


if __name__ == "__main__":
    main()
