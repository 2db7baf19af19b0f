"""Engine/learner mismatch correction and staleness accounting (docs/design.md, Algorithms: staleness and correction).

The generation engine's log-probs l_gen differ from the learner's l_old (other kernels, bf16, and with
asynchronous training older weights). With ratio w_t = exp(l_old_t - l_gen_t):
- "token" (truncated importance sampling; Yao et al., "Your efficient RL framework secretly brings you
  off-policy RL training", 2025): weight min(w_t, C). open-instruct uses C = 2, TRL C = 3.
- "token_mask" (IcePop, Ling team 2025): weight w_t if C_min <= w_t <= C, else 0 (token dropped).
- "sequence_mask" (sequence-level rejection, as in verl's rollout rejection sampling): keep a whole
  sample iff C_min <= exp(sum_t (l_old - l_gen)) <= C; kept samples get weight 1, others 0.
- "off": weight 1.
Weights carry no gradient (they multiply the per-token policy loss as stop-gradient factors); masked tokens
still count in the loss normaliser, so splitting a batch into micro-batches/ranks never changes the loss.

Invariants: weights are finite and >= 0; log ratios are clamped to +-40 before exp; only tokens with
mask 1 enter the metrics. Staleness = learner step - version_start (docs/design.md, Records: the conservative end).

Multi-turn samples: each policy token's engine log-prob is that of the turn (and weights version) that generated
it, so the per-token ratios above need no per-turn bookkeeping; observation tokens have mask 0 and enter no
weight, sequence sum or metric. Staleness uses `version_start`, the OLDEST turn's version (`episode_to_sample`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from rlvr.algorithms.segments import segment_broadcast, segment_index, segment_sum

TISMode = Literal["off", "token", "token_mask", "sequence_mask"]
_LOG_CLAMP = 40.0


@dataclass(frozen=True)
class CorrectionConfig:
    """The TIS fields of `AlgorithmConfig` (defaults: open-instruct, token level, cap 2.0)."""

    tis_mode: TISMode = "token"
    tis_cap: float = 2.0
    tis_min: float = 0.5


def drift_metrics(old_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Mean and max |l_old - l_gen| over loss tokens (`loss/logprob_drift_*`)."""
    m = mask.bool()
    diff = (old_logprobs.detach() - engine_logprobs.detach())[m].abs()
    if diff.numel() == 0:
        return {"loss/logprob_drift_mean": 0.0, "loss/logprob_drift_max": 0.0}
    return {"loss/logprob_drift_mean": float(diff.mean()), "loss/logprob_drift_max": float(diff.max())}


def _validate(config: CorrectionConfig) -> None:
    if config.tis_mode not in ("off", "token", "token_mask", "sequence_mask"):
        raise ValueError(f"unknown tis_mode {config.tis_mode!r}; choose off, token, token_mask, sequence_mask")
    if config.tis_cap <= 0 or config.tis_min < 0 or config.tis_min > config.tis_cap:
        raise ValueError(f"need 0 <= tis_min <= tis_cap and tis_cap > 0, got {config.tis_min}, {config.tis_cap}")


def importance_weights(
    old_logprobs: torch.Tensor,
    engine_logprobs: torch.Tensor,
    mask: torch.Tensor,
    config: CorrectionConfig = CorrectionConfig(),
    sample_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Stop-gradient per-token weights (same shape as inputs, 0 off-mask) and `loss/tis_*` + drift metrics."""
    _validate(config)
    m = mask.to(old_logprobs.dtype)
    log_ratio = (old_logprobs.detach() - engine_logprobs.detach()).clamp(-_LOG_CLAMP, _LOG_CLAMP) * m
    ratio = torch.exp(log_ratio)
    metrics = drift_metrics(old_logprobs, engine_logprobs, mask)
    num_tokens = max(float(m.sum()), 1.0)
    if config.tis_mode == "off":
        weights = torch.ones_like(ratio)
        affected = torch.zeros_like(ratio)
    elif config.tis_mode == "token":
        weights = ratio.clamp(max=config.tis_cap)
        affected = (ratio > config.tis_cap).to(ratio.dtype)
    elif config.tis_mode == "token_mask":
        keep = (ratio >= config.tis_min) & (ratio <= config.tis_cap)
        weights = torch.where(keep, ratio, torch.zeros_like(ratio))
        affected = (~keep).to(ratio.dtype)
    else:
        if sample_ids is None:
            raise ValueError("tis_mode 'sequence_mask' needs sample_ids to find sequence boundaries")
        index, num_segments = segment_index(sample_ids)
        seq_log_ratio = segment_sum(log_ratio, index, num_segments).clamp(-_LOG_CLAMP, _LOG_CLAMP)
        keep_seq = (seq_log_ratio >= math.log(max(config.tis_min, 1e-300))) & (
            seq_log_ratio <= math.log(config.tis_cap)
        )
        keep = segment_broadcast(keep_seq.to(ratio.dtype), index) > 0
        weights = keep.to(ratio.dtype)
        affected = (~keep).to(ratio.dtype)
        seq_has_tokens = segment_sum(m, index, num_segments) > 0
        num_seqs = max(int(seq_has_tokens.sum()), 1)
        metrics["loss/tis_seq_masked_frac"] = float((~keep_seq & seq_has_tokens).sum()) / num_seqs
    weights = weights * m
    metrics["loss/tis_clipped_frac"] = float((affected * m).sum()) / num_tokens
    metrics["loss/tis_weight_mean"] = float(weights.sum()) / num_tokens
    metrics["loss/tis_ratio_max"] = (
        float(torch.where(m > 0, ratio, torch.zeros_like(ratio)).max()) if m.numel() else 0.0
    )
    return weights.detach(), metrics


def staleness_filter(
    version_starts: Sequence[int], learner_step: int, max_staleness: int
) -> tuple[list[bool], dict[str, float]]:
    """Which samples may be trained on at `learner_step` (staleness <= max_staleness), plus `rollout/` counts.

    Follows AReaL's staleness bound: a sample generated from policy version v is usable while
    learner_step - v <= max_staleness (rollout.async_steps). Dropped samples must be regenerated or counted.
    """
    if max_staleness < 0:
        raise ValueError(f"max_staleness (rollout.async_steps) must be >= 0, got {max_staleness}")
    staleness = [learner_step - v for v in version_starts]
    if any(s < 0 for s in staleness):
        raise ValueError(f"sample version ahead of learner step {learner_step}: {max(version_starts)}")
    keep = [s <= max_staleness for s in staleness]
    metrics = {
        "rollout/staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0,
        "rollout/staleness_max": float(max(staleness, default=0)),
        "rollout/dropped_stale": float(keep.count(False)),
    }
    return keep, metrics
