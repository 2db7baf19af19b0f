"""The README's demo table is the bench output it cites (docs/bench-results/demo_learning.json, what
`python bench/demo_learning.py` printed in a fresh clone): every cell, reward / pass@1 and wall time."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _table() -> tuple[list[int], dict[str, list[str]]]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### The demo") : text.index("## Commands")]
    header = next(line for line in section.splitlines() if line.startswith("| step |"))
    steps = [int(c) for c in header.strip("|").split("|")[1:-1]]
    rows = {
        m.group(1): [c.strip() for c in m.group(2).strip("|").split("|")]
        for m in re.finditer(r"^\| seed (\d+) \|(.*)$", section, re.M)
    }
    return steps, rows


def test_readme_demo_table_is_the_bench_output() -> None:
    bench = json.loads((ROOT / "docs" / "bench-results" / "demo_learning.json").read_text())
    steps, rows = _table()
    assert sorted(rows) == sorted(str(s) for s in bench["seeds"]) and steps[0] == 0
    for seed, cells in rows.items():
        curve = {step: (reward, pass1) for step, reward, pass1 in bench["curves"][seed]}
        for step, cell in zip(steps, cells):
            reward, pass1 = curve[step]
            assert cell == f"{reward:.2f} / {pass1:.2f}", (seed, step, cell)
        assert cells[-1] == f"{bench['wall_s'][seed]:.0f} s", (seed, cells[-1])
        assert bench["pass@1"][seed] == 1.0  # the README says every seed solves the task
