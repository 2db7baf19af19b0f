"""SIGTERM / SIGINT to the whole process group of `rlvr train` (as Ctrl-C and Slurm send them) at chosen moments:
during start-up, an eval, training and a checkpoint write. Each ends in exit 75; the same command (no run name)
continues the same run each time, and a last launch finishes it with every step trained once and no prompt
lost. The driver starts its own Ray head, as `rlvr train` alone does; bench/faults.py sends 20 at random."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import faults as fault_bench


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_signals_at_chosen_moments_each_exit_75_and_resume(tmp_path):
    moments = ["startup", "eval", "training", "checkpoint", "startup"]
    result = fault_bench.signal_stress(tmp_path, moments=moments, steps=30)
    assert result["exit_codes"] == [75] * len(moments), result
    assert result["survived"], result
    assert result["run_dirs"] == 1 and result["data_lost"] == 0, result
