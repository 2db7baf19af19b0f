"""Soft overlong penalty (DAPO), non-stop penalty and truncated-completion masking."""

from __future__ import annotations

import random

import pytest
import torch

from rlvr.algorithms.advantages import assign_group_advantages
from rlvr.algorithms.shaping import ShapingConfig, overlong_penalty, shape_group, shape_rewards
from rlvr.types import Group, RewardResult, Sample


def test_overlong_hand() -> None:
    # Lmax = 10, C = 4: 0 up to 6, then (6 - L) / 4, -1 beyond 10
    lengths = torch.tensor([0, 6, 7, 8, 10, 11])
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0], dtype=torch.float64)
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4), expected)
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4, scale=0.5), 0.5 * expected)
    assert torch.all(overlong_penalty(lengths, 10, 0) == 0)


def test_overlong_matches_loop() -> None:
    rng = random.Random(0)
    for _ in range(20):
        lmax, buffer = rng.randint(5, 50), 0
        buffer = rng.randint(1, lmax)
        lengths = [rng.randint(0, lmax + 5) for _ in range(30)]
        ref = []
        for length in lengths:
            ref.append(
                0.0 if length <= lmax - buffer else (-1.0 if length > lmax else (lmax - buffer - length) / buffer)
            )
        torch.testing.assert_close(
            overlong_penalty(torch.tensor(lengths), lmax, buffer), torch.tensor(ref, dtype=torch.float64)
        )


def test_overlong_bad_buffer() -> None:
    with pytest.raises(ValueError, match="overlong_buffer"):
        overlong_penalty(torch.tensor([1]), 10, 11)


def test_shape_rewards_non_stop_and_mask() -> None:
    config = ShapingConfig(max_completion_length=10, overlong_buffer=4, non_stop_penalty=-1.0, mask_truncated=True)
    shaped, mask = shape_rewards([1.0, 1.0, None, 0.0], [5, 8, 3, 10], ["stop", "stop", "stop", "length"], config)
    assert shaped == [1.0, 0.5, None, -1.0]
    assert mask == [True, True, True, False]
    shaped, mask = shape_rewards([1.0], [10], ["length"], ShapingConfig(max_completion_length=10))
    assert shaped == [1.0] and mask == [True]


def test_truncated_masked_but_counted_in_group_stats() -> None:
    samples = [
        Sample("p", i, [1], [2] * n, "x", [-0.1] * n, r, 0, 0)
        for i, (n, r) in enumerate([(3, "stop"), (10, "length"), (4, "stop")])
    ]
    group = Group("p", samples, [RewardResult({}, t) for t in (1.0, 0.0, 0.0)])
    metrics = shape_group(group, ShapingConfig(max_completion_length=10, mask_truncated=True))
    assert group.loss_masks == [True, False, True]
    assert metrics["rollout/num_truncated"] == 1.0
    assign_group_advantages([group])
    # the truncated sample's reward still entered the mean (1/3), so the kept ones see it
    assert group.advantages[0] > 0 > group.advantages[2]
    assert group.advantages[1] == pytest.approx(group.advantages[2])
