"""Metric records: metrics.jsonl / eval.jsonl / samples.jsonl writers and the console progress line.

Each JSONL line is one complete JSON object written with a single write + flush, so readers (the
dashboard) may tail the files while the run goes on. Keys follow the namespaces of docs/design.md, Metrics.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class JsonlWriter:
    """Append-only JSONL file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: TextIO = open(path, "a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def truncate_after_step(path: Path, step: int) -> None:
    """On resume, drop records of steps after the checkpoint (they will be produced again)."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", -1) <= step:
                keep.append(line)
        except json.JSONDecodeError:
            continue
    path.write_text("".join(k + "\n" for k in keep))


class Progress:
    """One live console line: step, reward, eval score, tokens/s, ETA."""

    def __init__(self, total_steps: int, enabled: bool, stream: TextIO = sys.stderr) -> None:
        self.total, self.enabled, self.stream = total_steps, enabled, stream
        self.t0 = time.time()
        self.start_step: int | None = None
        self.last_eval: float | None = None
        self.line_open = False  # a terminal line was written without its newline (it is rewritten in place)

    def update(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        if self.start_step is None:
            self.start_step = step - 1
        done = step - self.start_step
        elapsed = time.time() - self.t0
        eta = elapsed / max(done, 1) * (self.total - step)
        if "eval/reward_mean" in metrics:
            self.last_eval = metrics["eval/reward_mean"]
        ev = f" eval {self.last_eval:.3f}" if self.last_eval is not None else ""
        line = (
            f"step {step}/{self.total} reward {metrics.get('reward/total_mean', float('nan')):.3f}{ev} "
            f"tok/s {metrics.get('perf/tokens_per_s', 0):.0f} ETA {eta:.0f}s"
        )
        end = "\n" if (not self.stream.isatty() or step == self.total) else ""
        self.stream.write(("\r" if self.stream.isatty() else "") + line + end)
        self.stream.flush()
        self.line_open = not end

    def close(self) -> None:
        """End a line left open (a run that stops before its last step), so that what follows starts on its own."""
        if self.line_open:
            self.stream.write("\n")
            self.stream.flush()
            self.line_open = False
