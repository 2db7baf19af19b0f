"""The tiny CPU demo learns and learns to STOP: the default config, in a fresh process, raises the held-out greedy
eval reward by at least 0.3 over its step-0 value and reaches exact-match pass@1 (the exact string, then EOS) of at
least 0.5. bench/demo_learning.py gives the 3-seed figures.

The run is asynchronous (`async_steps` 1), so its trajectory depends on timing, and a seed that solves the task on
one machine can stall on another: one CI run of seed 0 on a loaded machine locked a few wrong letters in around
step 170 (gain 0.86, pass@1 0.44, greedy outputs unchanged from then on), where every sample of a group agrees and
no advantage is left to undo them. So every run must learn (gain >= 0.3), and a run that learns without solving
is followed by one more seed, of which one must solve: a trainer that no longer solves the task fails both."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("ray")

BENCH = Path(__file__).resolve().parents[1] / "bench" / "demo_learning.py"
SEEDS = (0, 1)


def _bench_module():
    spec = importlib.util.spec_from_file_location("demo_learning", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_demo_learns_and_solves(tmp_path: Path) -> None:
    bench, unsolved = _bench_module(), []
    for seed in SEEDS:
        result = bench.run_seed(seed, tmp_path)
        curve = result["curve"]
        assert curve[0][0] == 0 and curve[-1][0] > 0, curve
        assert result["gain"] >= 0.3, f"seed {seed}: eval reward gain {result['gain']} < 0.3; curve {curve}"
        if result["pass@1"] >= 0.5:
            return
        unsolved.append(f"seed {seed}: exact-match pass@1 {result['pass@1']} < 0.5; curve {curve}")
    pytest.fail("no seed solved the task:\n" + "\n".join(unsolved))
