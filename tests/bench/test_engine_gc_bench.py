"""bench/engine_gc.py runs and prints its one JSON line: every variant timed, the flat layout creating no per-token
objects for the collector (so no collection pauses at all in a small replay)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_engine_gc_bench_prints_one_line_per_run() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "engine_gc.py"), "--requests", "64", "--tokens", "64"]
        + ["--rounds", "2", "--heap-objects", "1000"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (line,) = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith("{")]
    assert line["bench"] == "engine_gc" and line["requests"] == 64 and line["tokens"] == 64
    variants = [(r["variant"], r["freeze"]) for r in line["results"]]
    assert variants == [("dicts", False), ("dicts", True), ("flat", False), ("flat", True)]
    dicts, flat = line["results"][0], line["results"][-1]
    # 2 x 64 x 64 dicts and Logprob objects trigger young collections; the flat lists (3 per request) cannot
    assert dicts["passes"] > 0 and flat["passes"] == 0 and flat["full_passes"] == 0
