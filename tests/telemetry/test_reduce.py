"""Typed metrics (rlvr.telemetry.reduce): each reduction, merging producers exactly, and its refusals."""

from __future__ import annotations

import pickle

import pytest

from rlvr.telemetry.reduce import Metric, MetricReducer, ReducedMetrics, reduce_all


def _rank(loss_shares: list[float], ratio_max: float, kl: list[tuple[float, float]]) -> ReducedMetrics:
    r = MetricReducer()
    for share in loss_shares:
        r.add("loss/total", share, "sum")
    r.record(Metric("loss/ratio_max", ratio_max, "max"))
    r.record(Metric("loss/ratio_min", -ratio_max, "min"))
    for value, tokens in kl:
        r.add("loss/kl", value, "mean", weight=tokens)
    return ReducedMetrics(r)


def test_ranks_merge_by_type_not_by_averaging_averages() -> None:
    a = _rank([0.1, 0.2], 1.5, [(1.0, 10)])
    b = _rank([0.3], 2.5, [(4.0, 30)])
    assert a["loss/total"] == pytest.approx(0.3)  # a plain dict of floats to readers
    out = reduce_all([a, b])
    assert out["loss/total"] == pytest.approx(0.6)  # the sum of every micro-batch of every rank
    assert out["loss/ratio_max"] == 2.5 and out["loss/ratio_min"] == -2.5
    assert out["loss/kl"] == pytest.approx((1.0 * 10 + 4.0 * 30) / 40)  # token-weighted, not (1 + 4) / 2
    assert reduce_all([pickle.loads(pickle.dumps(a)), b]) == out  # survives the trip from a Ray actor


def test_plain_dicts_reduce_by_the_given_types_then_suffix() -> None:
    parts = [{"perf/rows": 3.0, "perf/eff": 0.5, "x_max": 1.0}, {"perf/rows": 4.0, "perf/eff": 1.0, "x_max": 7.0}]
    out = reduce_all(parts, reductions={"perf/rows": "sum"})
    assert out == {"perf/rows": 7.0, "perf/eff": 0.75, "x_max": 7.0}


def test_conflicting_or_unknown_reductions_are_refused() -> None:
    r = MetricReducer()
    r.add("k", 1.0, "sum")
    with pytest.raises(ValueError, match="reductions"):
        r.add("k", 1.0, "max")
    with pytest.raises(ValueError, match="unknown reduction"):
        r.add("j", 1.0, "median")  # type: ignore[arg-type]
