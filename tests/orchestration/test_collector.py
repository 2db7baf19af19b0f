"""RolloutCollector's rules, in-process (no Ray): in-flight window and budget, stale drops, filtering, active
sampling, the no-informative-group fallback, end of data, engine failures. A FakeEngine answers the feeder's
`submit/poll/stats.remote` calls itself; a fake scorer sets rewards by prompt."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlvr.algorithms.advantages import AdvantageConfig, assign_group_advantages
from rlvr.algorithms.shaping import ShapingConfig
from rlvr.orchestration.accounting import PromptLedger
from rlvr.orchestration.collector import NO_SIGNAL_ROUNDS, RolloutCollector
from rlvr.orchestration.health import EngineFailure
from rlvr.orchestration.rollouts import RolloutFeeder
from rlvr.types import Group, PromptRequest, RewardResult, Sample

G = 4


class _Call:
    def __init__(self, fn) -> None:
        self.remote = fn


class FakeEngine:
    """Completes every submitted prompt by the next poll, at its current `version`."""

    def __init__(self) -> None:
        self.version = 0
        self.queue: list[PromptRequest] = []
        self.submitted: list[str] = []
        self.fail_next_poll = False
        self.submit, self.poll, self.stats = _Call(self._submit), _Call(self._poll), _Call(lambda: {})

    def _submit(self, requests: list[PromptRequest]) -> None:
        self.queue += requests
        self.submitted += [r.prompt_id for r in requests]

    def _poll(self) -> list[Sample]:
        if self.fail_next_poll:
            self.fail_next_poll = False
            raise EngineFailure(0, "died: test")
        out = [
            Sample(r.prompt_id, j, [1, 2], [3, 4], "x", [-1.0, -1.0], "stop", self.version, self.version)
            for r in self.queue
            for j in range(r.num_samples)
        ]
        self.queue = []
        return out


class FakeStream:
    def __init__(self, limit: int | None = None) -> None:
        self.n, self.limit, self.counters = 0, limit, {}

    def next_request(self) -> PromptRequest | None:
        if self.limit is not None and self.n >= self.limit:
            return None
        self.n += 1
        return PromptRequest(f"p{self.n - 1}", [1, 2], G)

    def state_dict(self) -> dict:
        return {"n": self.n}


def _scorer(informative):
    """Rewards: [1, 0, 0, 0] for prompts where `informative(index)`, else all 0 (zero variance)."""

    def score(groups: list[Group]) -> float:
        for g in groups:
            good = informative(int(g.prompt_id[1:]))
            g.rewards = [RewardResult({"r": v}, v, v > 0) for v in ([1.0] + [0.0] * (G - 1) if good else [0.0] * G)]
        return 0.0

    return score


def _collector(
    B=2,
    async_steps=1,
    active=False,
    filter_zv=True,
    informative=lambda i: True,
    limit=None,
    rounds=NO_SIGNAL_ROUNDS,
    on_engine_failure=None,
):
    engine, ledger = FakeEngine(), PromptLedger()
    feeder = RolloutFeeder([engine], FakeStream(limit), ledger, timeout_s=5.0)
    rollout = SimpleNamespace(
        prompts_per_step=B,
        async_steps=async_steps,
        active_sampling=active,
        filter_zero_variance=filter_zv,
        max_pull_factor=4.0,
        timeout_s=5.0,
    )
    c = RolloutCollector(
        feeder,
        ledger,
        rollout,
        ShapingConfig(16),
        _scorer(informative),
        on_engine_failure=on_engine_failure,
        no_signal_rounds=rounds,
    )
    return c, engine, ledger


def _train(c: RolloutCollector, ledger: PromptLedger, groups: list[Group]) -> None:
    """What the driver does after training a step's groups (the weight sync: the engine's version follows)."""
    for g in groups:
        c.finish(g.prompt_id, "trained")
    c.advance()
    c.feeder.engines[0].version += 1
    ledger.check()


def test_window_bounds_the_prompts_in_flight_and_early_arrivals_wait_for_the_next_step() -> None:
    c, engine, ledger = _collector(B=2, async_steps=1)
    for step in range(4):
        groups, m = c.collect(step)
        assert [g.prompt_id for g in groups] == [f"p{2 * step}", f"p{2 * step + 1}"]  # submission order
        assert m["rollout/num_groups"] == 2
        assert len(ledger.in_flight) <= c.window == 4  # submitted, not yet trained: (async_steps + 1) * B
        _train(c, ledger, groups)
    assert len(engine.submitted) == c.window + 3 * 2  # the window, then B more per trained step
    assert sorted(c.feeder.outstanding) == ["p8", "p9"]  # the next step's, generated ahead


def test_stale_groups_are_dropped_counted_and_regenerated() -> None:
    c, engine, ledger = _collector(B=2, async_steps=1)
    groups, _ = c.collect(0)  # 4 submitted at version 0: p0, p1 trained, p2, p3 held
    for g in groups:
        c.finish(g.prompt_id, "trained")
    c.advance()
    c.advance()
    engine.version = 2
    groups, m = c.collect(2)  # learner version 2: p2, p3 (version 0) are 2 > async_steps versions old
    assert m["rollout/dropped_stale"] == 2
    assert all(s.version_start == 2 for g in groups for s in g.samples) and len(groups) == 2
    assert ledger.counts()["dropped_stale"] == 2
    _train(c, ledger, groups)


def test_zero_variance_groups_are_filtered_once_and_the_step_trains_what_is_left() -> None:
    c, _, ledger = _collector(B=4, async_steps=0, informative=lambda i: i % 2 == 0)
    groups, m = c.collect(0)
    assert [g.prompt_id for g in groups] == ["p0", "p2"]  # B resolved prompts, the informative ones trained
    assert m["data/groups_all_wrong"] == 2 and m["data/real_batch_size_ratio"] == 0.5
    assert ledger.counts()["filtered"] == 2
    _train(c, ledger, groups)


def test_active_sampling_pulls_until_b_informative_groups() -> None:
    c, engine, ledger = _collector(B=2, async_steps=0, active=True, informative=lambda i: i % 3 == 0)
    groups, _ = c.collect(0)
    assert [g.prompt_id for g in groups] == ["p0", "p3"]
    assert ledger.counts()["filtered"] == 2 and len(engine.submitted) == 4
    _train(c, ledger, groups)


def test_no_informative_group_trains_zero_advantage_groups_and_the_step_advances() -> None:
    c, engine, ledger = _collector(B=2, async_steps=0, informative=lambda i: False, rounds=3)
    groups, m = c.collect(0)
    assert [g.prompt_id for g in groups] == ["p4", "p5"]  # the last round's groups
    assert m["data/groups_all_wrong"] == 2
    assign_group_advantages(groups, AdvantageConfig())
    assert all(a == 0.0 for g in groups for a in g.advantages)
    _train(c, ledger, groups)
    counts = ledger.counts()
    assert counts["filtered"] == 4 and counts["trained"] == 2 and counts["in_flight"] == 0  # each prompt once
    groups, _ = c.collect(1)  # the next step collects its own rounds again: p6..p9 filtered, p10, p11 trained
    assert [g.prompt_id for g in groups] == ["p10", "p11"]
    _train(c, ledger, groups)
    assert ledger.counts()["filtered"] == 8


def test_end_of_data_returns_none_with_every_prompt_accounted_for() -> None:
    c, _, ledger = _collector(B=2, async_steps=1, limit=5, informative=lambda i: i != 4)
    step = 0
    while (out := c.collect(step)) is not None:
        _train(c, ledger, out[0])
        step += 1
    counts = ledger.counts()
    assert step == 2 and counts["trained"] == 4 and counts["filtered"] == 1 and counts["in_flight"] == 0


def test_an_engine_failure_goes_to_the_handler_and_collection_resumes() -> None:
    failures = []

    def replace(e: EngineFailure) -> None:
        failures.append(e)
        c.feeder.requeue_from(e.index)
        engine.queue = []  # the replacement starts empty

    c, engine, ledger = _collector(B=2, async_steps=0, on_engine_failure=replace)
    engine.fail_next_poll = True
    groups, _ = c.collect(0)
    assert len(failures) == 1 and sorted(g.prompt_id for g in groups) == ["p0", "p1"]  # re-queued, resubmitted
    _train(c, ledger, groups)


def test_without_a_handler_an_engine_failure_propagates() -> None:
    c, engine, _ = _collector()
    engine.fail_next_poll = True
    with pytest.raises(EngineFailure):
        c.collect(0)
