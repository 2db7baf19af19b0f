"""The few lines `rlvr train` ends with: where the run is, its last checkpoint, the final eval, what to run next.

Read back from the run directory after the last checkpoint is committed (eval.jsonl, checkpoints/), so what
it names exists on disk; `print_summary` writes it to stdout (the progress line and warnings are on stderr).
"""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any, TextIO


def last_record(path: Path) -> dict[str, Any] | None:
    """The last complete JSON line of a JSONL file (None when there is none)."""
    if not path.is_file():
        return None
    for line in reversed(path.read_text(errors="replace").splitlines()):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            return rec
    return None


def last_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint `checkpoints/latest` names, if that directory exists."""
    latest = run_dir / "checkpoints" / "latest"
    if not latest.is_file():
        return None
    ckpt = run_dir / "checkpoints" / latest.read_text().strip()
    return ckpt if ckpt.is_dir() else None


def _num(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"


def _pass_at_k(rec: dict[str, Any]) -> str:
    keys = sorted((k for k in rec if k.startswith("eval/pass@")), key=lambda k: int(k.rsplit("@", 1)[1]))
    return "  ".join(f"{k.split('/', 1)[1]} {_num(rec[k])}" for k in keys)


def summary_lines(run_dir: Path, step: int, elapsed_s: float, final: dict[str, float]) -> list[str]:
    """The summary of a finished run (module docstring); `final` is the last step's metrics."""
    ckpt = last_checkpoint(run_dir)
    ev = last_record(run_dir / "eval.jsonl")
    lines = [
        f"rlvr train: finished at step {step} in {elapsed_s:.0f} s",
        f"  run dir      {run_dir}",
        f"  checkpoint   {ckpt if ckpt is not None else 'none written'}",
        f"  train        reward {_num(final.get('reward/total_mean'))}",
    ]
    if ev is not None:
        n = ev.get("eval/num_prompts")
        prompts = f" over {int(n)} prompts" if isinstance(n, (int, float)) else ""
        lines.append(
            f"  final eval   step {ev.get('step')}: reward {_num(ev.get('eval/reward_mean'))}  "
            f"{_pass_at_k(ev)}{prompts}".rstrip()
        )
    else:
        lines.append("  final eval   none (--eval.every-n-steps 0 and --eval.at-step-0 False)")
    lines += ["next:", f"  rlvr dashboard {shlex.quote(str(run_dir))}"]
    if ckpt is not None:
        model = ckpt
        if (ckpt / "adapter_config.json").is_file():  # a LoRA checkpoint: rlvr eval takes the merged model
            model = run_dir / "merged"
            lines.append(f"  rlvr export --merge {shlex.quote(str(ckpt))} {shlex.quote(str(model))}")
        lines.append(f"  rlvr eval --model {shlex.quote(str(model))} --output {shlex.quote(str(run_dir / 'eval_out'))}")
    return lines


def print_summary(
    run_dir: Path, step: int, elapsed_s: float, final: dict[str, float], stream: TextIO | None = None
) -> None:
    """Write `summary_lines` to `stream` (stdout by default)."""
    out = stream or sys.stdout
    out.write("\n".join(summary_lines(run_dir, step, elapsed_s, final)) + "\n")
    out.flush()
