"""VerifierPool: results in order, back-pressure, hung and crashed workers replaced while serving."""

import sys
import threading
import time
from pathlib import Path

import pytest

from rlvr.rewards.pool import VerifierPool
from rlvr.rewards.scorer import RewardFunctionSpec, RewardsSettings

sys.path.insert(0, str(Path(__file__).parent))


def settings(*names, **kw):
    return RewardsSettings(functions=[RewardFunctionSpec(n) for n in names], custom=["rw_helpers"], **kw)


@pytest.fixture(scope="module")
def math_pool():
    with VerifierPool(RewardsSettings(num_workers=2, timeout_s=5.0)) as pool:
        yield pool


def test_scores_in_order(math_pool):
    items = [(rf"\boxed{{{i}}}", {"verifier": "math", "ground_truth": str(i % 2)}, None) for i in range(20)]
    results = math_pool.score_many(items)
    assert [r.scores["math"] for r in results] == [1.0, 1.0] + [0.0] * 18
    assert results[1].correct is True and results[5].correct is False
    metrics = math_pool.metrics()
    assert metrics["reward/math/calls"] >= 20 and metrics["reward/math/mean_time_s"] > 0


def test_submit_poll(math_pool):
    math_pool.submit("a", [("1", {"verifier": "gsm8k", "ground_truth": "1"}, None)])
    math_pool.submit("b", [])
    done = {}
    deadline = time.time() + 30
    while len(done) < 2 and time.time() < deadline:
        done.update(math_pool.poll())
        time.sleep(0.01)
    assert done["a"][0].total == 1.0 and done["b"] == []


def test_unknown_function_raises_at_build():
    with pytest.raises(ValueError, match="unknown reward function"):
        VerifierPool(RewardsSettings(functions=[RewardFunctionSpec("nope")]))


def test_keeps_serving_while_one_hangs_and_one_crashes():
    with VerifierPool(
        settings("rw_helpers:hang", "rw_helpers:crash"), num_workers=2, timeout_s=1.0, hard_grace_s=1.0
    ) as pool:
        start = time.perf_counter()
        items = [("hang", {}, None), ("segfault", {}, None)] + [("ok", {}, None)] * 10 + [("exit", {}, None)]
        results = pool.score_many(items, timeout=60)
        elapsed = time.perf_counter() - start
        assert results[0].status == "timeout" and results[0].total is None and "killed" in results[0].error
        assert results[0].scores == {"rw_helpers:hang": None, "rw_helpers:crash": None}
        assert results[1].status == "error" and results[1].total is None and "died" in results[1].error
        assert all(r.status == "ok" and r.total == 1.5 for r in results[2:12])
        assert results[12].status == "error"
        assert elapsed < 30
        m = pool.metrics()
        assert m["reward/pool/timeouts"] == 1 and m["reward/pool/crashes"] == 2 and m["reward/pool/restarts"] == 3
        assert m["reward/rw_helpers:hang/timeouts"] == 1 and m["reward/rw_helpers:crash/errors"] == 2
        assert pool.score_many([("ok", {}, None)])[0].total == 1.5  # replaced workers serve


def test_soft_timeout_without_kill():
    with VerifierPool(settings("rw_helpers:busy"), num_workers=1, timeout_s=0.5, hard_grace_s=10.0) as pool:
        results = pool.score_many([("busy", {}, None), ("fine", {}, None)], timeout=30)
        assert results[0].status == "timeout" and "rw_helpers:busy" in results[0].error
        assert results[1].total == 1.0
        assert pool.metrics()["reward/pool/restarts"] == 0  # interrupted in place, not killed


def test_back_pressure():
    with VerifierPool(settings("rw_helpers:hang"), num_workers=1, timeout_s=1.0, hard_grace_s=0.5, max_queue=2) as pool:
        pool.submit("slow", [("hang", {}, None), ("ok", {}, None)])
        with pytest.raises(ValueError, match="already pending"):
            pool.submit("slow", [("ok", {}, None)])
        blocked = threading.Event()
        t = threading.Thread(target=lambda: (pool.submit("next", [("ok", {}, None)]), blocked.set()))
        t.start()
        assert not blocked.wait(0.5)  # queue full: submit blocks until the hung row times out
        assert blocked.wait(20)
        t.join()
        done = {}
        deadline = time.time() + 20
        while len(done) < 2 and time.time() < deadline:
            done.update(pool.poll())
            time.sleep(0.01)
        assert done["slow"][0].status == "timeout" and done["next"][0].total == 1.0
