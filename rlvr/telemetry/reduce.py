"""Typed metrics: a key plus how its values combine (sum, mean, max, min), reduced once over everything.

A learner step yields values per micro-batch, per mini-batch and per rank; the driver yields packing metrics per
mini-batch. Each value is recorded with its reduction, the partial results of several producers (ranks) are
merged, and the final floats are computed once at the end. Averaging what should be summed (a micro-batch's share
of the step loss) or keeping one producer's numbers (rank 0, the last mini-batch) is what this prevents.

- `sum`: the values add up (shares of one loss, counts of things);
- `mean`: a weighted mean (weight 1 unless given, e.g. the number of tokens a per-token mean was taken over);
- `max` / `min`: extremes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

Reduction = Literal["sum", "mean", "max", "min"]
REDUCTIONS: tuple[Reduction, ...] = ("sum", "mean", "max", "min")


@dataclass(frozen=True)
class Metric:
    """One typed value: `key`, its `value`, how it combines with others of the same key, and its mean weight."""

    key: str
    value: float
    reduce: Reduction = "mean"
    weight: float = 1.0


def reduction_by_suffix(key: str, default: Reduction = "mean") -> Reduction:
    """`..._max` -> max, `..._min` -> min, else `default` (for dicts of metrics produced without types)."""
    if key.endswith("_max"):
        return "max"
    if key.endswith("_min"):
        return "min"
    return default


class MetricReducer:
    """Accumulates typed values; `merge` combines reducers (one per rank); `result` gives the final floats.

    The state is plain data (picklable, small): key -> [reduction, accumulated value, accumulated weight]."""

    def __init__(self) -> None:
        self.acc: dict[str, list] = {}

    def add(self, key: str, value: float, reduce: Reduction = "mean", weight: float = 1.0) -> None:
        if reduce not in REDUCTIONS:
            raise ValueError(f"metric {key}: unknown reduction {reduce!r}; choose one of {REDUCTIONS}")
        value = float(value)
        entry = self.acc.get(key)
        if entry is None:
            self.acc[key] = [reduce, value * weight if reduce == "mean" else value, float(weight)]
            return
        if entry[0] != reduce:
            raise ValueError(f"metric {key} recorded with reductions {entry[0]!r} and {reduce!r}")
        if reduce == "sum":
            entry[1] += value
        elif reduce == "mean":
            entry[1] += value * weight
            entry[2] += weight
        elif reduce == "max":
            entry[1] = max(entry[1], value)
        else:
            entry[1] = min(entry[1], value)

    def record(self, metric: Metric) -> None:
        self.add(metric.key, metric.value, metric.reduce, metric.weight)

    def add_all(
        self,
        values: Mapping[str, float],
        reductions: Mapping[str, Reduction] | None = None,
        default: Reduction = "mean",
        weight: float = 1.0,
    ) -> None:
        """Every key of `values`, reduced as `reductions` says, else by suffix (`_max`, `_min`), else `default`."""
        for key, value in values.items():
            reduce = (reductions or {}).get(key) or reduction_by_suffix(key, default)
            self.add(key, value, reduce, weight if reduce == "mean" else 1.0)

    def merge(self, other: MetricReducer) -> MetricReducer:
        """Fold `other`'s partial results into this one (the reduction across ranks); returns self."""
        for key, (reduce, value, weight) in other.acc.items():
            entry = self.acc.get(key)
            if entry is None:
                self.acc[key] = [reduce, value, weight]
            elif reduce == "mean":
                self.add(key, value / weight if weight else 0.0, "mean", weight)
            else:
                self.add(key, value, reduce)
        return self

    def result(self) -> dict[str, float]:
        out = {}
        for key, (reduce, value, weight) in self.acc.items():
            out[key] = (value / weight if weight else 0.0) if reduce == "mean" else value
        return out


class ReducedMetrics(dict):
    """Final floats (a plain `dict[str, float]` to readers) that carry the reducer they came from, so that the
    results of several producers combine exactly (`reduce_all`), not by averaging averages."""

    def __init__(self, reducer: MetricReducer) -> None:
        super().__init__(reducer.result())
        self.reducer = reducer


def reduce_all(
    parts: Iterable[Mapping[str, float]], reductions: Mapping[str, Reduction] | None = None, default: Reduction = "mean"
) -> dict[str, float]:
    """One dict of several producers' metrics: `ReducedMetrics` merge their reducers; plain dicts are reduced by
    `reductions`, else by suffix, else `default` (each producer's value has weight 1)."""
    total = MetricReducer()
    for part in parts:
        if isinstance(part, ReducedMetrics):
            total.merge(part.reducer)
        else:
            total.add_all(part, reductions, default)
    return total.result()
