"""Reward shaping for length: soft overlong penalty, non-stop penalty, truncated-completion masking.

- Soft overlong punishment (DAPO §3.4, eq. 13), with Lmax = max_completion_length and buffer C:
    p(L) = 0                      if L <= Lmax - C
           (Lmax - C - L) / C     if Lmax - C < L <= Lmax
           -1                     if L > Lmax
  scaled by `overlong_penalty` and ADDED to the task reward. p is computed by
  `rlvr.rewards.shaping.soft_overlong_penalty`, the one implementation (the `soft_overlong` reward uses it too).
- Non-stop penalty (open-instruct `non_stop_penalty`): a completion that ends without a stop token
  (finish_reason "length"; for a multi-turn episode end_reason "turn_length" or "max_total_tokens") has its
  reward REPLACED by the fixed value `non_stop_penalty`.
- Overlong filtering (DAPO §3.4 "overlong filtering"): with `mask_truncated`, truncated completions get
  loss_mask False, but keep their reward, so they still count in their group's mean/std.

Multi-turn samples (`rlvr.algorithms.policy_tokens`): the length L of the overlong penalty counts the tokens the
policy generated, not the tool observations between its turns; truncation is read from `end_reason`. Their Lmax is
the episode's cap on policy tokens, `episode_length_cap(cfg.env)` = min(max_turns * max_tokens_per_turn,
max_total_tokens) (`episode_max_completion_length`), not the single-turn `generation.max_new_tokens`: each sample
gets its own kind's Lmax, so a run that mixes single-turn rows and episodes shapes both right.

Invariants: shaping never turns a None reward into a number except through the non-stop penalty (which is
a fixed reward, by definition independent of the verifier); only the `TRUNCATION_REASONS` ("length",
"turn_length", "max_total_tokens") count as truncated ("abort" samples are the orchestrator's business and are
never shaped here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from rlvr.algorithms.policy_tokens import (
    EPISODE_MARKER,
    TRUNCATION_REASONS,
    end_reason,
    is_truncated,
    num_policy_tokens,
)
from rlvr.config.sections import AlgorithmConfig, EnvConfig
from rlvr.rewards.shaping import soft_overlong_penalty
from rlvr.types import Group, RewardResult

_ALGORITHM = AlgorithmConfig()  # the defaults below are the config section's: one source, no copies


def episode_length_cap(env: EnvConfig) -> int:
    """The most tokens an episode's policy turns can hold together: min(max_turns * max_tokens_per_turn,
    max_total_tokens) (the Lmax of multi-turn samples)."""
    return min(env.max_turns * env.max_tokens_per_turn, env.max_total_tokens)


_LENGTHS = ("max_completion_length", "episode_max_completion_length")


@dataclass(frozen=True)
class ShapingConfig:
    """The shaping fields of `AlgorithmConfig`; max_completion_length comes from generation.max_new_tokens and
    `episode_max_completion_length` (the Lmax of episodes; 0: the same) from `episode_length_cap(cfg.env)`."""

    max_completion_length: int
    overlong_buffer: int = _ALGORITHM.overlong_buffer
    overlong_penalty: float = _ALGORITHM.overlong_penalty
    non_stop_penalty: float | None = _ALGORITHM.non_stop_penalty
    mask_truncated: bool = _ALGORITHM.mask_truncated
    episode_max_completion_length: int = 0

    @classmethod
    def from_config(
        cls, algorithm: AlgorithmConfig, max_completion_length: int, episode_max_completion_length: int = 0
    ) -> ShapingConfig:
        """The shaping settings of `cfg.algorithm`, with `cfg.generation.max_new_tokens` as the length cap of a
        single-turn sample and `episode_length_cap(cfg.env)` as an episode's."""
        return cls(
            max_completion_length,
            episode_max_completion_length=episode_max_completion_length,
            **{f.name: getattr(algorithm, f.name) for f in fields(cls) if f.name not in _LENGTHS},
        )


def overlong_penalty(
    lengths: torch.Tensor, max_completion_length: int | Sequence[int], buffer: int, scale: float = 1.0
) -> torch.Tensor:
    """DAPO soft overlong penalty per completion length (float tensor, <= 0); buffer 0 means off (all zeros).
    `max_completion_length`: one Lmax for all, or one per completion (flattened order)."""
    caps = (
        [int(max_completion_length)] * lengths.numel()
        if isinstance(max_completion_length, int)
        else [int(c) for c in max_completion_length]
    )
    if len(caps) != lengths.numel():
        raise ValueError(f"{len(caps)} max_completion_length values for {lengths.numel()} completions")
    for cap in set(caps):
        if buffer < 0 or buffer > cap:
            raise ValueError(f"overlong_buffer must be in [0, max_completion_length={cap}], got {buffer}")
    lengths = lengths.to(torch.float64)
    if buffer == 0:
        return torch.zeros_like(lengths)
    penalty = [soft_overlong_penalty(n, cap, buffer) for n, cap in zip(lengths.flatten().tolist(), caps)]
    return scale * torch.tensor(penalty, dtype=torch.float64).reshape(lengths.shape)


def shape_rewards(
    totals: Sequence[float | None],
    completion_lengths: Sequence[int],
    finish_reasons: Sequence[str],
    config: ShapingConfig,
    episodes: Sequence[bool] | None = None,
) -> tuple[list[float | None], list[bool]]:
    """Apply non-stop and overlong shaping; returns (shaped rewards, loss-mask flags) per sample.

    `completion_lengths` are policy-generated token counts; `finish_reasons` are finish or end reasons (a reason in
    `TRUNCATION_REASONS` marks the sample truncated); `episodes` says which samples are episodes (their Lmax is
    `episode_max_completion_length`)."""
    if not (len(totals) == len(completion_lengths) == len(finish_reasons)):
        raise ValueError("totals, completion_lengths and finish_reasons must have the same length")
    episode_cap = config.episode_max_completion_length or config.max_completion_length
    flags = list(episodes) if episodes is not None else [False] * len(totals)
    penalties = overlong_penalty(
        torch.tensor(list(completion_lengths), dtype=torch.float64),
        [episode_cap if e else config.max_completion_length for e in flags],
        config.overlong_buffer,
        config.overlong_penalty,
    ).tolist()
    shaped: list[float | None] = []
    loss_mask: list[bool] = []
    for total, penalty, reason in zip(totals, penalties, finish_reasons):
        truncated = reason in TRUNCATION_REASONS
        if truncated and config.non_stop_penalty is not None:
            total = config.non_stop_penalty
        elif total is not None:
            total = total + penalty
        shaped.append(total)
        loss_mask.append(not (truncated and config.mask_truncated))
    return shaped, loss_mask


def shape_group(group: Group, config: ShapingConfig) -> dict[str, float]:
    """Shape one group in place: rewritten `rewards[i].total` and `loss_masks`; returns counts."""
    if len(group.rewards) != group.num_samples:
        raise ValueError(f"group {group.prompt_id} has {group.num_samples} samples but {len(group.rewards)} rewards")
    shaped, loss_mask = shape_rewards(
        [r.total for r in group.rewards],
        [num_policy_tokens(s) for s in group.samples],
        [end_reason(s) for s in group.samples],
        config,
        [s.metadata.get(EPISODE_MARKER) is True for s in group.samples],
    )
    group.rewards = [
        RewardResult(r.scores, total, r.correct, r.status, r.error, r.elapsed_s)
        for r, total in zip(group.rewards, shaped)
    ]
    group.loss_masks = loss_mask
    num_truncated = sum(is_truncated(s) for s in group.samples)
    return {"rollout/num_truncated": float(num_truncated), "rollout/num_loss_masked": float(loss_mask.count(False))}
