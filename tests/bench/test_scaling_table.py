"""bench/scaling_table.py renders issue 14's scaling table from bench/gpu_grpo.py output (the committed GPU runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "scaling_table.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_scaling_table_rows_from_committed_runs() -> None:
    files = sorted((ROOT / "docs" / "gpu-results").glob("w2_split2_staged_vs_plain_*.jsonl"))
    assert len(files) == 2
    proc = _run(*map(str, files))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    rows = json.loads(lines[-1])["scaling_table"]
    assert len(rows) == 4 and lines[0].startswith("| run |") and len(lines) == 2 + 4 + 1
    staged = next(r for r in rows if r["model"] == "1.5B" and r["run"] == "split2_async1:staged")
    assert staged["tokens_per_s_per_gpu"] == 7128.8 and staged["learner"] == "0.50 / 0.47 / 0.03"
    assert "--rollout.vllm-staged-sync True" in staged["extra"] and staged["card"] == "2 x NVIDIA H100 80GB HBM3"
    assert "| 1.5B | 2 x NVIDIA H100 80GB HBM3 | 7.1k | 9.3 | 0.50 / 0.47 / 0.03 |" in proc.stdout


def test_scaling_table_bad_input_names_the_file(tmp_path: Path) -> None:
    assert _run(str(tmp_path / "absent.jsonl")).returncode == 2
    bad = tmp_path / "bench.jsonl"
    bad.write_text('{"kind": "setup"}\nnot json\n')
    proc = _run(str(bad))
    assert proc.returncode == 2 and "bench.jsonl:2" in proc.stderr
