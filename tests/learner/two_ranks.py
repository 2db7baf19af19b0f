"""Two learner ranks on CPU/gloo, each a subprocess running a test's script: the harness of the DeepSpeed tests.

`run_two_ranks(script, argv, timeout_s)` starts `python -c script *argv(port, rank)` for ranks 0 and 1 against one
free port, waits for both within one budget (a hang in mismatched collectives shows as a failed test, and both
processes are killed), checks that both exited 0 and returns their (stdout, stderr). A script reports what it
measured on a line `RESULT {json}`; `rank_result(out)` reads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping

import pytest

from rlvr.launch.local_cluster import free_port

ENV = {"DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


def run_two_ranks(
    script: str,
    argv: Callable[[str, int], list[str]],
    timeout_s: float,
    rank_env: Mapping[int, Mapping[str, str]] | None = None,
) -> list[tuple[str, str]]:
    """(stdout, stderr) of ranks 0 and 1, both exited 0 within `timeout_s`; `rank_env` adds variables to one rank's
    environment (e.g. fault injection on rank 0). `RLVR_INJECT_FAULTS` is never inherited from the test process."""
    env = {**os.environ, **ENV}
    env.pop("RLVR_INJECT_FAULTS", None)
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *argv(port, rank)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, **(rank_env or {}).get(rank, {})},
        )
        for rank in (0, 1)
    ]
    deadline = time.monotonic() + timeout_s  # one budget for both ranks, not one per rank
    try:
        outs = [p.communicate(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail(f"the two ranks did not finish within {timeout_s:g}s: mismatched collectives (a hang)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    return outs


def rank_result(out: tuple[str, str]) -> dict:
    """The `RESULT {json}` line one rank printed (its stderr's end when there is none)."""
    stdout, stderr = out
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, stderr[-3000:]
    return json.loads(lines[0][len("RESULT ") :])
