"""Zero-variance filtering, group classification and the ActiveSampler component."""

from __future__ import annotations

import random

import pytest
import torch

from rlvr.algorithms.advantages import rewards_to_tensor
from rlvr.algorithms.filtering import ActiveSampler, classify_groups, filter_groups, informative_groups
from rlvr.types import Group, RewardResult, Sample


def _group(pid: str, totals: list[float | None], correct: list[bool | None] | None = None) -> Group:
    samples = [Sample(pid, i, [1], [2], "x", [-0.1], "stop", 0, 0) for i in range(len(totals))]
    flags = correct or [None] * len(totals)
    return Group(pid, samples, [RewardResult({}, t, c) for t, c in zip(totals, flags)])


def test_hand_classification() -> None:
    groups = [
        _group("a", [1.0, 1.0]),
        _group("b", [0.0, 0.0]),
        _group("c", [1.0, 0.0]),
        _group("d", [None, None]),
        _group("e", [0.5, 0.5], [True, False]),
    ]
    kept, metrics = filter_groups(groups)
    assert [g.prompt_id for g in kept] == ["c"]
    assert metrics == {
        "data/groups_kept": 1.0,
        "data/groups_all_correct": 1.0,
        "data/groups_all_wrong": 1.0,
        "data/groups_other_zero_variance": 2.0,
    }


def test_none_reward_does_not_make_group_informative() -> None:
    assert filter_groups([_group("a", [1.0, None, 1.0])])[0] == []
    assert len(filter_groups([_group("a", [1.0, None, 0.0])])[0]) == 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classify_matches_loop(seed: int) -> None:
    rng = random.Random(seed)
    groups = [
        [None if rng.random() < 0.2 else float(rng.randint(0, 1)) for _ in range(rng.randint(2, 5))] for _ in range(30)
    ]
    rewards, valid = rewards_to_tensor(groups)
    classes = classify_groups(rewards, valid)
    for n, group in enumerate(groups):
        values = [r for r in group if r is not None]
        keep = len(values) >= 2 and max(values) != min(values)
        assert bool(informative_groups(rewards, valid)[n]) == keep
        assert bool(classes["kept"][n]) == keep
        assert bool(classes["all_correct"][n]) == (not keep and bool(values) and all(v > 0 for v in values))
        assert bool(classes["all_wrong"][n]) == (not keep and bool(values) and all(v <= 0 for v in values))
    assert int(sum(c.sum() for c in classes.values())) == len(groups)  # a partition


def test_active_sampler_collects_until_target_and_keeps_surplus() -> None:
    sampler = ActiveSampler(target_groups=2)
    sampler.add([_group("a", [1.0, 1.0]), _group("b", [1.0, 0.0])])
    assert sampler.need == 1 and not sampler.ready
    with pytest.raises(ValueError, match="add more"):
        sampler.take()
    sampler.add([_group("c", [0.0, 0.0]), _group("d", [0.0, 1.0]), _group("e", [1.0, 0.0])])
    assert sampler.ready
    assert [g.prompt_id for g in sampler.take()] == ["b", "d"]
    metrics = sampler.metrics()
    assert metrics["data/groups_pulled"] == 5.0 and metrics["data/groups_kept"] == 3.0
    assert metrics["data/groups_all_correct"] == 1.0 and metrics["data/groups_all_wrong"] == 1.0
    assert metrics["data/real_batch_size_ratio"] == pytest.approx(3 / 5)
    assert metrics["data/groups_buffered"] == 1.0
    assert sampler.need == 1
    assert [g.prompt_id for g in sampler.drain()] == ["e"]
    assert sampler.metrics()["data/groups_pulled"] == 0.0  # reset


def test_active_sampler_accounting_identity() -> None:
    rng = random.Random(0)
    sampler, returned, filtered = ActiveSampler(target_groups=3), 0, 0
    pulled = 0
    for step in range(20):
        batch = [_group(f"{step}:{i}", [float(rng.randint(0, 1)) for _ in range(4)]) for i in range(2)]
        pulled += len(batch)
        sampler.add(batch)
        if sampler.ready:
            returned += len(sampler.take())
        m = sampler.metrics(reset=False)
        filtered = int(m["data/groups_pulled"] - m["data/groups_kept"])
        assert returned + sampler.num_buffered + filtered == pulled


def test_active_sampler_without_filter_keeps_all() -> None:
    sampler = ActiveSampler(target_groups=2, filter_zero_variance=False)
    sampler.add([_group("a", [1.0, 1.0]), _group("b", [0.0, 0.0])])
    assert len(sampler.take()) == 2
    with pytest.raises(ValueError):
        ActiveSampler(0)


def test_empty_filter() -> None:
    assert filter_groups([])[0] == []
    assert informative_groups(torch.zeros(0, 2)).shape == (0,)
