"""The tiny CPU demo learns and learns to STOP: one seed of the default config, in a fresh process, raises the
held-out greedy eval reward by at least 0.3 over its step-0 value and reaches exact-match pass@1 (the exact
string, then EOS) of at least 0.5. bench/demo_learning.py gives the 3-seed figures."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("ray")

BENCH = Path(__file__).resolve().parents[1] / "bench" / "demo_learning.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("demo_learning", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_learns_seed0(tmp_path: Path) -> None:
    result = _bench_module().run_seed(0, tmp_path)
    curve = result["curve"]
    assert curve[0][0] == 0 and curve[-1][0] > 0, curve
    assert result["gain"] >= 0.3, f"eval reward gain {result['gain']} < 0.3; curve {curve}"
    assert result["pass@1"] >= 0.5, f"exact-match pass@1 {result['pass@1']} < 0.5; curve {curve}"
