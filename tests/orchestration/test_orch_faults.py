"""Fault injection on CPU (real drivers, real Ray, real verifier processes): every run survives, no data lost.

The scenarios live in bench/faults.py (which prints the suite's report); each test runs one of them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import faults as fault_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _check(result: dict) -> None:
    assert result["survived"], result
    assert result["data_lost"] == 0, result


@pytest.mark.parametrize("at", ["collect", "sync"])
def test_engine_killed_mid_run(tmp_path, ray_cluster, at):
    _check(fault_bench.kill_engine(tmp_path, at))


def test_learner_killed_resumes_from_checkpoint(tmp_path, ray_cluster):
    _check(fault_bench.kill_learner(tmp_path, async_steps=1))


def test_learner_killed_on_policy_matches_uninterrupted(tmp_path, ray_cluster):
    result = fault_bench.kill_learner_exact(tmp_path)
    assert result["max_weight_diff"] <= 1e-6, result
    _check(result)


def test_sigterm_during_generation(tmp_path, ray_cluster):
    result = fault_bench.sigterm(tmp_path, "generation")
    assert result["exit_on_signal"] == 75
    _check(result)


def test_sigterm_during_checkpoint_write(tmp_path, ray_cluster):
    result = fault_bench.sigterm(tmp_path, "checkpoint")
    _check(result)


def test_hanging_and_segfaulting_verifiers(tmp_path):
    result = fault_bench.hostile_verifiers(tmp_path)
    assert result["timeouts"] > 0 and result["crashes"] > 0
    _check(result)


def test_corrupt_newest_checkpoint_falls_back(tmp_path, ray_cluster):
    _check(fault_bench.corrupt_checkpoint(tmp_path))


def test_engine_killed_during_evals(tmp_path, ray_cluster):
    result = fault_bench.kill_engine_eval(tmp_path)
    assert result["evals"] == [4, 5], result
    _check(result)


def test_malicious_checkpoint_files_are_refused_and_run_nothing(tmp_path, ray_cluster):
    """A real run's checkpoint with a code-running pickle planted in its driver state, optimizer or RNG file (and
    the manifest regenerated): every resume exits 2 naming the file, runs nothing, changes nothing."""
    result = fault_bench.malicious_checkpoint(tmp_path)
    assert result["contained"] == result["attacks"] == 4, result
    assert result["survived"], result


def test_all_checkpoints_corrupt_stops_and_changes_nothing(tmp_path, ray_cluster):
    result = fault_bench.all_checkpoints_corrupt(tmp_path)
    assert result["survived"], result
