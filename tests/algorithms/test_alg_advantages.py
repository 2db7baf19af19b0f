"""Group-relative advantages: hand-computed cases, None/NaN handling, and a float64 loop reference."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rlvr.algorithms.advantages import AdvantageConfig, assign_group_advantages, group_advantages, rewards_to_tensor
from rlvr.types import Group, RewardResult, Sample

EPS = 1e-4


def test_group_unbiased_hand() -> None:
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64))
    std = math.sqrt(1.0 / 3.0)  # 4 * 0.25 / 3
    expected = torch.tensor([[0.5, -0.5, -0.5, 0.5]], dtype=torch.float64) / (std + EPS)
    torch.testing.assert_close(adv, expected)


def test_group_population_hand() -> None:
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=torch.float64), std="population")
    torch.testing.assert_close(adv, torch.tensor([[0.5, -0.5, -0.5, 0.5]], dtype=torch.float64) / (0.5 + EPS))


def test_none_scale_is_centred_only() -> None:
    adv = group_advantages(torch.tensor([[3.0, 1.0], [2.0, 2.0]], dtype=torch.float64), scale="none")
    torch.testing.assert_close(adv, torch.tensor([[1.0, -1.0], [0.0, 0.0]], dtype=torch.float64))


def test_batch_scale_hand() -> None:
    # group means 0.5 and 1; batch std (unbiased) of [1, 0, 1, 1] = 0.5
    adv = group_advantages(torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64), scale="batch")
    expected = torch.tensor([[0.5, -0.5], [0.0, 0.0]], dtype=torch.float64) / (0.5 + EPS)
    torch.testing.assert_close(adv, expected)


def test_none_reward_excluded_from_stats() -> None:
    rewards, valid = rewards_to_tensor([[1.0, None, 0.0, float("nan"), 1.0]])
    adv = group_advantages(rewards, valid)
    mean, std = 2.0 / 3.0, math.sqrt(1.0 / 3.0)  # over [1, 0, 1]
    expected = [(1 - mean) / (std + EPS), 0.0, (0 - mean) / (std + EPS), 0.0, (1 - mean) / (std + EPS)]
    torch.testing.assert_close(adv[0], torch.tensor(expected, dtype=torch.float64))


def test_nan_in_tensor_is_invalid_and_single_valid_gives_zero() -> None:
    adv = group_advantages(torch.tensor([[float("nan"), 1.0, float("nan")]], dtype=torch.float64))
    assert torch.equal(adv, torch.zeros(1, 3, dtype=torch.float64))


def test_group_size_one_rejected() -> None:
    with pytest.raises(ValueError, match="at least 2 samples"):
        group_advantages(torch.ones(4, 1))


def test_unknown_modes_rejected() -> None:
    with pytest.raises(ValueError, match="advantage_scale"):
        group_advantages(torch.ones(1, 2), scale="bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="advantage_std"):
        group_advantages(torch.tensor([[1.0, 0.0]]), std="bogus")  # type: ignore[arg-type]


def _reference(groups: list[list[float | None]], scale: str, flavour: str, eps: float) -> list[list[float]]:
    def std(values: list[float]) -> float:
        if len(values) < 2:
            return 0.0
        mean = sum(values) / len(values)
        denom = len(values) - 1 if flavour == "unbiased" else len(values)
        return math.sqrt(sum((v - mean) ** 2 for v in values) / denom)

    all_valid = [r for g in groups for r in g if r is not None]
    out = []
    for group in groups:
        valid = [r for r in group if r is not None]
        mean = sum(valid) / len(valid) if valid else 0.0
        divisor = {"group": std(valid) + eps, "batch": std(all_valid) + eps, "none": 1.0}[scale]
        out.append([0.0 if (r is None or len(valid) < 2) else (r - mean) / divisor for r in group])
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("flavour", ["unbiased", "population"])
def test_matches_loop_reference(seed: int, scale: str, flavour: str) -> None:
    rng = random.Random(seed)
    groups: list[list[float | None]] = []
    for _ in range(rng.randint(1, 7)):
        size = rng.randint(2, 6)
        groups.append([None if rng.random() < 0.2 else rng.choice([0.0, 1.0, rng.gauss(0, 2)]) for _ in range(size)])
    rewards, valid = rewards_to_tensor(groups)
    adv = group_advantages(rewards, valid, scale=scale, std=flavour, eps=EPS)  # type: ignore[arg-type]
    ref = _reference(groups, scale, flavour, EPS)
    for n, group in enumerate(ref):
        torch.testing.assert_close(
            adv[n, : len(group)], torch.tensor(group, dtype=torch.float64), rtol=1e-12, atol=1e-12
        )
        assert torch.all(adv[n, len(group) :] == 0)


def _sample(i: int) -> Sample:
    return Sample("p:0:0", i, [1], [2, 3], "x", [-0.1, -0.2], "stop", 0, 0)


def test_assign_group_advantages_fills_groups() -> None:
    group = Group("p:0:0", [_sample(i) for i in range(3)], [RewardResult({}, t) for t in (1.0, None, 0.0)])
    metrics = assign_group_advantages([group], AdvantageConfig(advantage_scale="none"))
    assert group.advantages == [0.5, 0.0, -0.5]
    assert metrics["data/num_unscored_samples"] == 1.0
