"""The composite scorer: configured reward functions plus the row's routed verifiers -> one `RewardResult`.

Configuration (`RewardsSettings`, the same field names as the root config's `rewards` section, which
`RewardsSettings.from_config` reads duck-typed):
- `functions`: reward functions scored on every row, each (name, weight, params).
- `verifier_column`: the metadata key naming the row's verifier(s) (str or list of str), as in
  open-instruct's RLVR datasets. `metadata["ground_truth"]` is the gold; with several verifiers and a list of
  the same length, verifier i gets ground truth i.
- `primary`: the function whose score decides `correct`; default the row's first routed verifier.
- `custom`: import paths of user modules ("pkg.module") or functions ("pkg.module:fn") to register.

Semantics (docs/design.md, "Reward functions"):
- Each routed verifier is scored once per row with weight 1, unless the same name is in `functions`: then
  it is scored once with that entry's weight and params (and its routed ground truth). A name routed twice
  scores twice, under keys "name" and "name#1".
- total = sum(weight * score) over non-None scores; None when every score is None.
- correct = primary score >= that function's `max_score` (1.0 for verifiers); None when it did not score.
- A function that raises (bad data, a bug) scores None and the row gets status "error" with the message;
  an unknown routed verifier likewise. Unknown configured names raise ValueError when the scorer is built.
- Exceptions that are not `Exception`s (the pool's soft-timeout signal) propagate to the caller.
"""

from __future__ import annotations

import inspect
import math
import numbers
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlvr.config.sections import RewardsConfig
from rlvr.rewards.registry import RewardSpec, get_reward, import_custom
from rlvr.types import RewardResult

ParamValue = float | int | str | bool


@dataclass
class RewardFunctionSpec:
    """One configured reward function: registered name (or "pkg.module:fn"), weight, keyword params."""

    name: str
    weight: float = 1.0
    params: dict[str, ParamValue] = field(default_factory=dict)


_REWARDS = RewardsConfig()  # the defaults below are the config section's: one source, no copies


@dataclass
class RewardsSettings:
    """What the scorer and pool need from the `rewards` config section (same field names and defaults, read
    from `RewardsConfig`; `functions` holds picklable `RewardFunctionSpec`s)."""

    functions: list[RewardFunctionSpec] = field(default_factory=list)
    verifier_column: str = _REWARDS.verifier_column
    num_workers: int = _REWARDS.num_workers
    timeout_s: float = _REWARDS.timeout_s
    max_queue: int = _REWARDS.max_queue
    primary: str | None = _REWARDS.primary
    custom: list[str] = field(default_factory=list)

    @classmethod
    def from_config(cls, cfg: Any) -> RewardsSettings:
        """Copy the fields of a `rewards` config object (or dict) into a picklable RewardsSettings."""
        if isinstance(cfg, RewardsSettings):
            return cfg
        get = cfg.get if isinstance(cfg, Mapping) else (lambda k, d: getattr(cfg, k, d))
        functions = []
        for f in get("functions", []) or []:
            fget = f.get if isinstance(f, Mapping) else (lambda k, d, f=f: getattr(f, k, d))
            functions.append(
                RewardFunctionSpec(
                    name=fget("name", None), weight=float(fget("weight", 1.0)), params=dict(fget("params", {}) or {})
                )
            )
        defaults = cls()
        return cls(
            functions=functions,
            verifier_column=get("verifier_column", defaults.verifier_column),
            num_workers=int(get("num_workers", defaults.num_workers)),
            timeout_s=float(get("timeout_s", defaults.timeout_s)),
            max_queue=int(get("max_queue", defaults.max_queue)),
            primary=get("primary", None),
            custom=list(get("custom", []) or []),
        )


@dataclass
class _Entry:
    key: str
    name: str
    spec: RewardSpec | None  # None: unknown routed verifier
    weight: float
    params: dict[str, ParamValue]
    ground_truth: Any = None
    override_gt: bool = False  # use `ground_truth` instead of the row's (paired verifier/ground-truth lists)
    route_index: int = -1  # position in the row's verifier list; -1: configured only


@dataclass
class CallStats:
    """Per-function outcome of one row, for the pool's metrics."""

    name: str
    elapsed_s: float
    error: bool
    timeout: bool = False


def _check_params(spec: RewardSpec, params: dict[str, ParamValue]) -> None:
    try:
        inspect.signature(spec.fn).bind("", {}, **params)
    except TypeError as e:
        raise ValueError(f"reward {spec.name!r}: bad params {params}: {e}") from e


class RewardScorer:
    """Scores one completion with the configured and routed reward functions (module docstring)."""

    def __init__(self, settings: RewardsSettings | Any) -> None:
        self.settings = RewardsSettings.from_config(settings)
        for path in self.settings.custom:
            import_custom(path)
        self._configured: list[tuple[RewardFunctionSpec, RewardSpec]] = []
        for f in self.settings.functions:
            spec = get_reward(f.name)
            _check_params(spec, f.params)
            self._configured.append((f, spec))
        if len({f.name for f in self.settings.functions}) != len(self.settings.functions):
            raise ValueError(f"rewards.functions names must be unique: {[f.name for f in self.settings.functions]}")
        if self.settings.primary is not None:
            get_reward(self.settings.primary)
        self.current_fn: str | None = None
        self.on_call_start: Callable[[str], None] | None = None

    def plan(self, metadata: Mapping[str, Any]) -> tuple[list[_Entry], list[str]]:
        """The (key, function, weight, params, ground truth) entries for one row, and routing errors."""
        entries = [_Entry(f.name, f.name, spec, f.weight, f.params) for f, spec in self._configured]
        unclaimed = {e.name: e for e in entries}
        used = {e.key for e in entries}
        errors: list[str] = []
        routed = metadata.get(self.settings.verifier_column)
        names = [routed] if isinstance(routed, str) else [str(n) for n in routed or []]
        gold = metadata.get("ground_truth")
        paired = isinstance(gold, (list, tuple)) and len(names) > 1 and len(gold) == len(names)
        for i, name in enumerate(names):
            entry = unclaimed.pop(name, None)
            if entry is None:
                key, n = name, 1
                while key in used:
                    key, n = f"{name}#{n}", n + 1
                used.add(key)
                try:
                    spec = get_reward(name)
                except ValueError as e:
                    errors.append(str(e))
                    spec = None
                entry = _Entry(key, name, spec, 1.0, {})
                entries.append(entry)
            entry.route_index = i if entry.route_index < 0 else entry.route_index
            if paired and isinstance(gold, (list, tuple)):
                entry.ground_truth, entry.override_gt = gold[i], True
        return entries, errors

    def keys(self, metadata: Mapping[str, Any]) -> list[str]:
        """The score keys a row will have (used by the pool to fill in results of killed workers)."""
        return [e.key for e in self.plan(metadata)[0]]

    def score(
        self, completion_text: str, metadata: Mapping[str, Any], completion_token_ids: list[int] | None = None
    ) -> RewardResult:
        """Score one completion; never raises an `Exception` from a reward function."""
        return self.score_detailed(completion_text, metadata, completion_token_ids)[0]

    def score_detailed(
        self, completion_text: str, metadata: Mapping[str, Any], completion_token_ids: list[int] | None = None
    ) -> tuple[RewardResult, list[CallStats]]:
        """`score` plus per-function timing and error flags."""
        start = time.perf_counter()
        entries, errors = self.plan(metadata)
        base = dict(metadata)
        base["completion_token_ids"] = completion_token_ids
        scores: dict[str, float | None] = {}
        stats: list[CallStats] = []
        total: float | None = None
        for entry in entries:
            if entry.spec is None:
                scores[entry.key] = None
                stats.append(CallStats(entry.name, 0.0, True))
                continue
            md = base
            if entry.override_gt:
                md = {**base, "ground_truth": entry.ground_truth}
            self.current_fn = entry.name
            if self.on_call_start is not None:
                self.on_call_start(entry.name)
            t0 = time.perf_counter()
            failed = False
            try:
                value = entry.spec.fn(completion_text, md, **entry.params)
                if value is not None:
                    if isinstance(value, (bool, str)) or not isinstance(value, numbers.Real):
                        raise TypeError(f"returned {type(value).__name__} {str(value)[:50]!r}, not a number or None")
                    value = float(value)
                    if not math.isfinite(value):
                        raise ValueError(f"returned {value}")
            except Exception as e:  # trust boundary: reward code fed model output; reported, never raised
                value, failed = None, True
                errors.append(f"{entry.key}: {type(e).__name__}: {str(e)[:500]}")
            stats.append(CallStats(entry.name, time.perf_counter() - t0, failed))
            scores[entry.key] = value
            if value is not None:
                total = (total or 0.0) + entry.weight * value
        self.current_fn = None
        correct = self._correct(entries, scores)
        result = RewardResult(
            scores=scores,
            total=total,
            correct=correct,
            status="error" if errors else "ok",
            error="; ".join(errors) or None,
            elapsed_s=time.perf_counter() - start,
        )
        return result, stats

    def _correct(self, entries: list[_Entry], scores: dict[str, float | None]) -> bool | None:
        primary = self.settings.primary
        if primary is None:
            routed = sorted((e for e in entries if e.route_index >= 0), key=lambda e: e.route_index)
            primary = routed[0].key if routed else None
        entry = next((e for e in entries if e.key == primary), None)
        score = scores.get(entry.key) if entry is not None else None
        if entry is None or entry.spec is None or score is None:
            return None
        return score >= entry.spec.max_score - 1e-9
