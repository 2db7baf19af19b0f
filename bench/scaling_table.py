"""Issue 14's scaling table from `bench/gpu_grpo.py` output: one markdown row per rlvr run of the given bench.jsonl
files (colocate1, split2, split4 at any model size), with tokens/s/GPU and each GPU kind's time shares.

    python3 bench/scaling_table.py docs/gpu-results/w1_rlvr_vs_trl_0.5b_4xH200.jsonl docs/gpu-results/w2_*.jsonl

Columns: run (config:tag), model shape, card x GPUs, tokens/s/GPU, s/step, the learner GPUs' train / sync / idle
shares and the engine GPUs' generating / sync / idle shares (`gpu_time_share`; colocated runs share one GPU, so
their two sets overlap), the weight-sync cycle, and the command's extra flags. Runs without a figure (skipped,
crashed before step 2) are listed with the reason. A trailing JSON line gives the same rows for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SIZES = {"qwen2.5-0.5b": "0.5B", "qwen2.5-1.5b": "1.5B", "qwen2.5-7b": "7B"}


def shares(d: dict[str, Any] | None, keys: tuple[str, str, str]) -> str:
    if not d:
        return "-"
    return " / ".join("-" if d.get(k) is None else f"{d[k]:.2f}" for k in keys)


def rows_of(path: Path) -> list[dict[str, Any]]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            print(f"scaling_table: {path}:{n}: not a JSON line ({e.msg})", file=sys.stderr)
            raise SystemExit(2) from None
        if r.get("kind") == "rlvr":
            out.append({**r, "_file": path.name})
    return out


def row(r: dict[str, Any]) -> dict[str, Any]:
    share = r.get("gpu_time_share") or {}
    ws = r.get("weight_sync") or {}
    return {
        "run": f"{r.get('config')}:{r.get('tag')}",
        "model": SIZES.get(str(r.get("shape")), r.get("shape")),
        "card": f"{r.get('gpus', '?')} x {r.get('card', '?')}",
        "tokens_per_s_per_gpu": r.get("tokens_per_s_per_gpu"),
        "step_s": r.get("step_wall_s"),
        "learner": shares(share.get("learner_gpu"), ("train", "sync", "idle")),
        "engine": shares(share.get("engine_gpu"), ("generating", "sync", "idle")),
        "shared_gpu": bool(share.get("shared_gpu")),
        "sync_cycle_s": ws.get("cycle_s"),
        "extra": r.get("extra") or "",
        "skipped": r.get("skipped") or (None if r.get("tokens_per_s_per_gpu") else f"rc {r.get('rc')}, no figure"),
        "file": r["_file"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path, help="bench.jsonl files of bench/gpu_grpo.py")
    a = p.parse_args()
    missing = [str(f) for f in a.files if not f.is_file()]
    if missing:
        print(f"scaling_table: no such file: {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = [row(r) for f in a.files for r in rows_of(f)]
    print(
        "| run | model | card | tokens/s/GPU | s/step | learner GPU train / sync / idle | "
        "engine GPU generating / sync / idle | sync cycle s | flags |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for x in rows:
        if x["skipped"]:
            print(f"| {x['run']} | {x['model']} | {x['card']} | - | - | - | - | - | {x['skipped']} |")
            continue
        shared = " (one GPU)" if x["shared_gpu"] else ""
        print(
            f"| {x['run']} | {x['model']} | {x['card']}{shared} | {x['tokens_per_s_per_gpu'] / 1000:.1f}k | "
            f"{x['step_s']:.1f} | {x['learner']} | {x['engine']} | {x['sync_cycle_s']} | `{x['extra']}` |"
        )
    print(json.dumps({"scaling_table": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
