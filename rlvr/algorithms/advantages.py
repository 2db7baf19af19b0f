"""Group-relative advantages from scalar rewards (GRPO family).

For a group of G samples of one prompt with rewards r_i (docs/design.md, Algorithms: advantages):
- scale "group" (GRPO, DeepSeekMath §4.1.2): A_i = (r_i - mean_g(r)) / (std_g(r) + eps).
- scale "batch" (TRL `scale_rewards="batch"`): mean per group, std of the rewards over the whole batch.
- scale "none" (Dr. GRPO, "Understanding R1-Zero-like Training" §3.1): A_i = r_i - mean_g(r).
The std flavour is explicit: "unbiased" (N-1, TRL's default, eps 1e-4) or "population" (N, DeepSeekMath).

Invariants:
- A reward that is None/NaN (a verifier that could not score) gives advantage exactly 0 and takes no part
  in the mean or std of its group (nor in the batch std).
- A group with fewer than 2 valid rewards has advantage 0 everywhere (no baseline to compare against).
- Group size 1 is rejected (ValueError): a group-relative baseline needs G >= 2.
- Everything is vectorised over a [num_groups, G] tensor plus a validity mask; padding slots of ragged
  groups are simply marked invalid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from rlvr.types import Group

AdvantageScale = Literal["group", "batch", "none"]
StdFlavour = Literal["unbiased", "population"]


@dataclass(frozen=True)
class AdvantageConfig:
    """The advantage fields of `AlgorithmConfig` (same names, same defaults: TRL)."""

    advantage_scale: AdvantageScale = "group"
    advantage_std: StdFlavour = "unbiased"
    advantage_eps: float = 1e-4


def rewards_to_tensor(
    rewards: Sequence[Sequence[float | None]], dtype: torch.dtype = torch.float64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged per-group rewards -> (rewards_NG with 0 in invalid slots, valid_NG bool)."""
    if not rewards:
        return torch.zeros(0, 0, dtype=dtype), torch.zeros(0, 0, dtype=torch.bool)
    width = max(len(g) for g in rewards)
    rewards_NG = torch.zeros(len(rewards), width, dtype=dtype)
    valid_NG = torch.zeros(len(rewards), width, dtype=torch.bool)
    for n, group in enumerate(rewards):
        for g, reward in enumerate(group):
            if reward is not None and not math.isnan(reward):
                rewards_NG[n, g] = reward
                valid_NG[n, g] = True
    return rewards_NG, valid_NG


def _masked_std(
    values: torch.Tensor, mean: torch.Tensor, valid: torch.Tensor, count: torch.Tensor, flavour: StdFlavour
) -> torch.Tensor:
    """Std over `dim=-1` of the valid entries; 0 where there are fewer than 2 valid entries."""
    if flavour not in ("unbiased", "population"):
        raise ValueError(f"unknown advantage_std {flavour!r}; choose 'unbiased' or 'population'")
    squares = torch.where(valid, (values - mean).square(), torch.zeros_like(values)).sum(-1, keepdim=True)
    denom = count - 1 if flavour == "unbiased" else count
    std = torch.sqrt(squares / denom.clamp(min=1))
    return torch.where(count >= 2, std, torch.zeros_like(std))


def group_advantages(
    rewards_NG: torch.Tensor,
    valid_NG: torch.Tensor | None = None,
    *,
    scale: AdvantageScale = "group",
    std: StdFlavour = "unbiased",
    eps: float = 1e-4,
) -> torch.Tensor:
    """Advantages [num_groups, G] for rewards [num_groups, G]; invalid (masked or NaN) slots get 0."""
    if rewards_NG.ndim != 2:
        raise ValueError(f"rewards_NG must be [num_groups, G], got shape {tuple(rewards_NG.shape)}")
    if rewards_NG.shape[1] < 2:
        raise ValueError(
            f"group size is {rewards_NG.shape[1]}: group-relative advantages need at least 2 samples per "
            "prompt (set generation.num_samples >= 2)"
        )
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"unknown advantage_scale {scale!r}; choose 'group', 'batch' or 'none'")
    valid = ~torch.isnan(rewards_NG)
    if valid_NG is not None:
        valid = valid & valid_NG.bool()
    rewards = torch.where(valid, rewards_NG, torch.zeros_like(rewards_NG))
    count = valid.sum(-1, keepdim=True).to(rewards.dtype)
    mean = rewards.sum(-1, keepdim=True) / count.clamp(min=1)
    centred = rewards - mean
    if scale == "group":
        centred = centred / (_masked_std(rewards, mean, valid, count, std) + eps)
    elif scale == "batch":
        flat, flat_valid = rewards.reshape(1, -1), valid.reshape(1, -1)
        flat_count = flat_valid.sum(-1, keepdim=True).to(rewards.dtype)
        flat_mean = flat.sum(-1, keepdim=True) / flat_count.clamp(min=1)
        centred = centred / (_masked_std(flat, flat_mean, flat_valid, flat_count, std) + eps)
    informative = valid & (count >= 2)
    return torch.where(informative, centred, torch.zeros_like(centred))


def assign_group_advantages(groups: Sequence[Group], config: AdvantageConfig = AdvantageConfig()) -> dict[str, float]:
    """Fill `group.advantages` from `group.rewards[i].total` for every group; returns `data/` metrics.

    Every group must already carry one `RewardResult` per sample (a shaping step may have changed totals).
    """
    for group in groups:
        if len(group.rewards) != group.num_samples:
            raise ValueError(
                f"group {group.prompt_id} has {group.num_samples} samples but {len(group.rewards)} rewards"
            )
    rewards_NG, valid_NG = rewards_to_tensor([[r.total for r in g.rewards] for g in groups])
    if rewards_NG.numel() == 0:
        return {}
    advantages_NG = group_advantages(
        rewards_NG, valid_NG, scale=config.advantage_scale, std=config.advantage_std, eps=config.advantage_eps
    )
    for n, group in enumerate(groups):
        group.advantages = advantages_NG[n, : group.num_samples].tolist()
    valid_adv = advantages_NG[valid_NG]
    return {
        "data/num_unscored_samples": float(
            (~valid_NG).sum() - (rewards_NG.numel() - sum(g.num_samples for g in groups))
        ),
        "data/advantage_mean": float(valid_adv.mean()) if valid_adv.numel() else 0.0,
        "data/advantage_abs_mean": float(valid_adv.abs().mean()) if valid_adv.numel() else 0.0,
    }
