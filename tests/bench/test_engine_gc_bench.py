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
    assert variants == [("dicts", False), ("dicts", True), ("flat", True)]
    flat = line["results"][-1]
    assert flat["full_passes"] == 0 and flat["replay_s"] >= 0
    assert all(r["max_pause_ms"] >= 0 and r["total_pause_ms"] >= 0 for r in line["results"])
    # 64 x 64 dicts and Logprob objects do trigger young collections; the flat lists (3 per request) cannot
    assert line["results"][0]["total_pause_ms"] >= flat["total_pause_ms"]
