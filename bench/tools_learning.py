"""The CPU tool-use task's learning result: does the random-init tiny model learn to use the lookup tool?

Runs `rlvr train --config configs/tools-cpu.yaml` (the built-in `tool-lookup` task: the prompt is a key, the
answer its value in a hidden per-row table that only the `lookup` tool reads; rlvr/data/tasks.py,
rlvr/envs/builtin.py `tool_lookup_tiny`) for seeds 0, 1, 2 one after another, each in a fresh subprocess (its own
local Ray cluster), and reads each run's eval.jsonl: greedy `eval/reward_mean` (the `copy` answer term plus the
0.1 `tool_call` and 0.1 `clean_call` terms), the answer term alone (`eval/reward/copy_mean`, over the episodes that
answered) and exact-answer `eval/pass@1` on the held-out test split at step 0 (before training) and every
`eval.every_n_steps` after. Prints ONE JSON line per seed:

    {"card": "cpu", "config": "configs/tools-cpu.yaml", "seed": 0, "flags": [...],
     "curve": [[step, eval_reward, pass@1], ...], "gain": g, "pass@1": p,
     "answer_curve": [[step, copy_mean], ...], "answer_gain": a, "wall_s": s, "final_step": n}

gain = eval reward at the last eval - eval reward at step 0; the call terms alone can add 0.2 of it, so the
answer term and pass@1 say whether the value was used: a chance answer of 3 letters after a call scores about
0.2 (each letter right 1 time in 5); pass@1 = at the last eval (an exact answer needs the
tool: a guess scores 0 and the value is never in the prompt); wall_s is the whole `rlvr train` run (Ray start,
model build, training, evals, shutdown). Target (issue 19): gain >= 0.3 within 10 minutes a seed on 2 CPU cores.

Run: python bench/tools_learning.py [--seeds 0 1 2] [--output-dir DIR] [-- RLVR TRAIN FLAGS]
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_learning import read_curve

CONFIG = "configs/tools-cpu.yaml"
ROOT = Path(__file__).resolve().parents[1]


def read_answer_curve(run_dir: Path) -> list[list[float]]:
    """[[step, eval/reward/copy_mean], ...]: the answer's `copy` score alone, without the call terms, averaged over
    the eval episodes that gave an answer (0 where none did)."""
    curve: dict[int, float] = {}
    with open(run_dir / "eval.jsonl") as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                curve[int(rec["step"])] = float(rec.get("eval/reward/copy_mean", 0.0))
    return [[s, round(curve[s], 4)] for s in sorted(curve)]


def run_seed(seed: int, output_dir: str | Path, flags: list[str] | None = None) -> dict[str, Any]:
    """`rlvr train --config configs/tools-cpu.yaml` with `seed` in a subprocess; its result line."""
    cmd = [sys.executable, "-m", "rlvr.cli", "train", "--config", str(ROOT / CONFIG), "--seed", str(seed)]
    cmd += ["--checkpoint.output-dir", str(output_dir), "--logging.run-name", f"seed{seed}"]
    cmd += ["--checkpoint.save-final", "False", "--checkpoint.resume", "never", "--logging.console-progress", "False"]
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, *(flags or [])], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"seed {seed}: rlvr train exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    curve = read_curve(Path(output_dir) / f"seed{seed}")
    if len(curve) < 2 or curve[0][0] != 0:
        raise RuntimeError(f"seed {seed}: eval.jsonl has no step-0 baseline and final eval: {curve}")
    answer = read_answer_curve(Path(output_dir) / f"seed{seed}")
    return {
        "card": "cpu",
        "config": CONFIG,
        "seed": seed,
        "flags": list(flags or []),
        "curve": curve,
        "gain": round(curve[-1][1] - curve[0][1], 4),
        "pass@1": curve[-1][2],
        "answer_curve": answer,
        "answer_gain": round(answer[-1][1] - answer[0][1], 4),
        "wall_s": round(wall, 1),
        "final_step": int(curve[-1][0]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--output-dir", default=None, help="parent of the run directories (default: a temp dir)")
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    out = args.output_dir or tempfile.mkdtemp(prefix="rlvr-tools-learning-")
    for seed in args.seeds:
        print(json.dumps(run_seed(seed, out, flags)), flush=True)


if __name__ == "__main__":
    main()
