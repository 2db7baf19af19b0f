"""The tiny CPU demo learns and learns to STOP: the default config, in a fresh process, raises the held-out greedy
eval reward by at least 0.3 over its step-0 value and reaches exact-match pass@1 (the exact string, then EOS) of at
least 0.5. bench/demo_learning.py gives the 3-seed figures.

The run is asynchronous (`async_steps` 1), so its trajectory depends on timing, and a seed that solves the task on
one machine can fail on another. Two failures were seen in CI-like runs of seed 0 on a loaded machine: it locked a
few wrong letters in around step 170 (pass@1 0.44, greedy outputs unchanged from then on, every sample of a group
agreeing so no advantage is left to undo them), and once it then lost EOS at step 223 (every completion truncated,
reward 0 for all, no gradient to recover). 22 later runs on this repo's 2-core machine all solved (pass@1 1.0,
first solved at step 120-210; docs/cpu-results/demo_seed_sweep.jsonl): seeds 0-7 idle, 0-7 with a cosine learning
rate, 0-5 with two busy loops beside them. So a run that does not solve is followed by one more seed, and the test
fails when neither solves: a trainer that no longer learns fails both."""

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
        if result["gain"] >= 0.3 and result["pass@1"] >= 0.5:
            return
        unsolved.append(
            f"seed {seed}: eval reward gain {result['gain']} (>= 0.3 needed), exact-match pass@1 "
            f"{result['pass@1']} (>= 0.5 needed); curve {curve}"
        )
    pytest.fail("no seed solved the task:\n" + "\n".join(unsolved))
