"""A run whose training data runs out before --num-steps ends as one that reaches it: nothing trained is lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_data_running_out_still_writes_the_last_eval_and_the_final_checkpoint(tmp_path: Path) -> None:
    # 12 prompts, 4 a step, one epoch: the data ends after 3 steps, long before --num-steps 50. The eval of step 2
    # runs overlapped with step 3; step 3 itself is no eval step.
    cmd = [
        sys.executable,
        "-m",
        "rlvr.cli",
        "train",
        "--checkpoint.output-dir",
        str(tmp_path),
        "--logging.console-progress",
        "False",
        "--num-steps",
        "50",
        "--data.num-builtin-rows",
        "12",
        "--data.num-epochs",
        "1",
        "--rollout.prompts-per-step",
        "4",
        "--rollout.filter-zero-variance",
        "False",
        "--generation.num-samples",
        "2",
        "--eval.every-n-steps",
        "2",
        "--eval.max-prompts",
        "8",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in records]
    # each engine's share of the step spent generating: from the second trained step on (a delta of its counters);
    # 0 is possible once the data has run out, but the engine was busy in some step
    busy = {r["step"]: r.get("perf/engine_busy_frac") for r in records if "time/train" in r}
    later = [busy[s] for s in busy if s > 1]
    assert busy[1] is None and all(0.0 <= b <= 1.0 for b in later) and max(later) > 0, busy
    last = max(steps)
    assert 0 < last < 50 and "training data exhausted" in (run / "events.log").read_text()
    evals = [json.loads(line)["step"] for line in (run / "eval.jsonl").read_text().splitlines() if line.strip()]
    assert 2 in evals, evals  # the overlapped eval in flight when the data ran out
    assert evals[-1] == last, evals  # the final weights are evaluated
    assert (run / "checkpoints" / f"step_{last}").is_dir(), sorted(p.name for p in (run / "checkpoints").iterdir())
    assert f"step_{last}" in proc.stdout  # the summary names the checkpoint that exists
