"""Policy losses of the GRPO family and their aggregation over an optimizer step.

Per-token surrogates (docs/design.md, "Losses"), with rho_t = exp(l_t - l_old_t) and A the sample's advantage:
- "dapo", "grpo", "dr_grpo": clipped surrogate (PPO; GRPO = DeepSeekMath eq. 3; DAPO "clip-higher" with
  separate eps_low / eps_high): L_t = -min(c1 * A, clip(rho, 1 - eps_low, 1 + eps_high) * A), c1 = rho, or
  with dual clip (Ye et al. 2020, "Mastering complex control in MOBA games") L_t = -max(that, delta * A) where
  A < 0: it bounds the loss of negative-advantage tokens by delta * |A| and never touches positive ones.
  delta must exceed 1 + eps_high (LossConfig and config validation refuse anything else): a smaller delta
  would clip tokens inside the ordinary trust region.
- "gspo" (Zheng et al. 2025, GSPO): the same clip applied to the sequence ratio
  s_i = exp(sum_t m (l - l_old) / sum_t m), differentiable and broadcast to every token of the sample.
  (GSPO's paper uses much smaller clip ranges, ~3e-4/4e-4: that is a preset choice, not enforced here.)
- "cispo" (MiniMax-M1 §3.1): L_t = -stopgrad(min(rho, eps_max)) * A * l_t.
- "sapo" (Soft Adaptive Policy Optimization, Qwen 2025): tau = tau_pos if A > 0 else tau_neg,
  L_t = -sigmoid(tau * (rho - 1)) * (4 / tau) * A (gradient equals -A * grad(rho) at rho = 1).
Per token the loss is  L_t * w_t + beta * KL_t - entropy_coef * H_t  (w_t: stop-gradient TIS weight).

Aggregations, m = loss mask (policy tokens only: the packer zeroes the tool observations of multi-turn samples,
so they enter no sum, count, sequence ratio or mean below), N_tok / N_seq = GLOBAL counts for the whole
optimizer step (all micro-batches, all data-parallel ranks), passed in by the caller:
- "token-mean" (DAPO): sum m L / N_tok.
- "seq-mean-token-mean" (GRPO): sum_i (sum_t m L / n_i) / N_seq, n_i = loss tokens of sample i.
- "seq-mean-token-sum-norm" (Dr. GRPO): sum m L / (N_seq * max_completion_length). The constant is
  `run_max_completion_length(cfg)`: `generation.max_new_tokens`, or, where the config runs episodes, the larger
  of it and the episode cap (`rlvr.algorithms.shaping.episode_length_cap`: policy tokens over all turns).
- "bnpo": sum m L / sum m over the local micro-batch (not composable by construction).
Invariant: for every aggregation but bnpo, summing the losses (or gradients) of any split of the step into
micro-batches and ranks gives exactly the loss of the whole step. The caller must therefore SUM gradients
across micro-batches and ranks (cancel DDP/DeepSpeed averaging). Samples with no loss token do not count
in N_seq (the packer fills N_seq that way).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

import torch

from rlvr.algorithms.kl import KLEstimator, kl_penalty
from rlvr.algorithms.segments import segment_broadcast, segment_index, segment_sum
from rlvr.config.sections import AlgorithmConfig, ExperimentConfig

LossName = Literal["dapo", "grpo", "dr_grpo", "gspo", "cispo", "sapo"]
AggregationName = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "bnpo"]

AUTO_AGGREGATION: dict[str, str] = {
    "dapo": "token-mean",
    "grpo": "seq-mean-token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "gspo": "seq-mean-token-mean",
    "cispo": "token-mean",
    "sapo": "token-mean",
}
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "bnpo")
_LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: keeps ratios finite for tokens whose policy moved a lot (verl clamps too)


def resolve_aggregation(loss: str, aggregation: str = "auto") -> str:
    """The aggregation to use: `aggregation` itself, or the loss's paper default when it is "auto"."""
    if loss not in AUTO_AGGREGATION:
        raise ValueError(f"unknown algorithm.loss {loss!r}; choose one of {sorted(AUTO_AGGREGATION)}")
    if aggregation == "auto":
        return AUTO_AGGREGATION[loss]
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown algorithm.aggregation {aggregation!r}; choose 'auto' or one of {AGGREGATIONS}")
    return aggregation


_ALGORITHM = AlgorithmConfig()  # the defaults below are the config section's: one source, no copies


@dataclass(frozen=True)
class LossConfig:
    """The loss fields of `AlgorithmConfig` (same names; defaults read from it), plus the Dr. GRPO length."""

    loss: LossName = _ALGORITHM.loss
    aggregation: str = _ALGORITHM.aggregation
    clip_eps_low: float = _ALGORITHM.clip_eps_low
    clip_eps_high: float = _ALGORITHM.clip_eps_high
    clip_delta: float | None = _ALGORITHM.clip_delta
    cispo_eps_max: float = _ALGORITHM.cispo_eps_max
    sapo_tau_pos: float = _ALGORITHM.sapo_tau_pos
    sapo_tau_neg: float = _ALGORITHM.sapo_tau_neg
    kl_beta: float = _ALGORITHM.kl_beta
    kl_estimator: KLEstimator = _ALGORITHM.kl_estimator
    entropy_coef: float = _ALGORITHM.entropy_coef
    max_completion_length: int | None = None

    def __post_init__(self) -> None:
        resolve_aggregation(self.loss, self.aggregation)
        if self.clip_delta is not None and self.clip_delta <= 1.0 + self.clip_eps_high:
            # Dual clip bounds a negative-advantage token's loss at delta * |A|; a delta inside the trust region
            # (<= 1 + eps_high) would cut the gradient of tokens whose ratio the ordinary clip still allows.
            raise ValueError(
                f"clip_delta (dual clip) must be > 1 + clip_eps_high = {1.0 + self.clip_eps_high}, "
                f"got {self.clip_delta} (flag --algorithm.clip-delta)"
            )
        if self.clip_eps_low < 0 or self.clip_eps_high < 0:
            raise ValueError("clip_eps_low and clip_eps_high must be >= 0")

    @classmethod
    def from_config(cls, algorithm: AlgorithmConfig, max_completion_length: int | None = None) -> LossConfig:
        """The loss settings of `cfg.algorithm`; pass `run_max_completion_length(cfg)` as the Dr. GRPO length."""
        return cls(
            max_completion_length=max_completion_length,
            **{f.name: getattr(algorithm, f.name) for f in fields(cls) if f.name != "max_completion_length"},
        )


def _clipped(ratio: torch.Tensor, advantages: torch.Tensor, config: LossConfig) -> torch.Tensor:
    clipped = torch.clamp(ratio, 1.0 - config.clip_eps_low, 1.0 + config.clip_eps_high)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    if config.clip_delta is not None:  # dual clip bounds negative-advantage tokens only, whatever delta is
        surrogate = torch.where(advantages < 0, torch.maximum(surrogate, config.clip_delta * advantages), surrogate)
    return -surrogate


def surrogate_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    sample_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token surrogate loss and the ratio it used (token ratio, or GSPO's broadcast sequence ratio)."""
    m = mask.to(logprobs.dtype)
    log_ratio = ((logprobs - old_logprobs.detach()) * m).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    if config.loss == "gspo":
        if sample_ids is None:
            raise ValueError("the gspo loss needs sample_ids to find sequence boundaries")
        index, num_segments = segment_index(sample_ids)
        counts = segment_sum(m, index, num_segments).clamp(min=1.0)
        seq_log_ratio = segment_sum(log_ratio, index, num_segments) / counts
        ratio = torch.exp(segment_broadcast(seq_log_ratio, index))
        return _clipped(ratio, advantages, config), ratio
    ratio = torch.exp(log_ratio)
    if config.loss in ("dapo", "grpo", "dr_grpo"):
        return _clipped(ratio, advantages, config), ratio
    if config.loss == "cispo":
        weight = torch.clamp(ratio, max=config.cispo_eps_max).detach()
        return -weight * advantages * logprobs, ratio
    if config.loss == "sapo":
        tau_pos = torch.full_like(ratio, config.sapo_tau_pos)  # full_like keeps fp64 (a bare float would be fp32)
        tau = torch.where(advantages > 0, tau_pos, torch.full_like(ratio, config.sapo_tau_neg))
        return -torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau) * advantages, ratio
    raise ValueError(f"unknown algorithm.loss {config.loss!r}; choose one of {sorted(AUTO_AGGREGATION)}")


def run_max_completion_length(cfg: ExperimentConfig) -> int:
    """Dr. GRPO's Lmax for a run (module docstring): one constant for every sample, long enough for an episode's
    policy tokens over all its turns where the config runs episodes (`env.name`, a built-in episode task)."""
    from rlvr.algorithms.shaping import episode_length_cap
    from rlvr.config.validation import runs_episodes

    if runs_episodes(cfg):
        return max(cfg.generation.max_new_tokens, episode_length_cap(cfg.env))
    return cfg.generation.max_new_tokens


def aggregate_loss(
    loss_per_token: torch.Tensor,
    mask: torch.Tensor,
    aggregation: str,
    *,
    global_num_loss_tokens: int,
    global_num_samples: int,
    max_completion_length: int | None = None,
    sample_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token losses to this micro-batch's share of the optimizer step's loss (see module doc)."""
    m = mask.to(loss_per_token.dtype)
    masked = loss_per_token * m
    if aggregation == "token-mean":
        return masked.sum() / max(global_num_loss_tokens, 1)
    if aggregation == "bnpo":
        return masked.sum() / m.sum().clamp(min=1.0)
    if aggregation == "seq-mean-token-sum-norm":
        if not max_completion_length or max_completion_length <= 0:
            raise ValueError("seq-mean-token-sum-norm (Dr. GRPO) needs max_completion_length > 0")
        return masked.sum() / (max(global_num_samples, 1) * max_completion_length)
    if aggregation == "seq-mean-token-mean":
        if sample_ids is None:
            raise ValueError("seq-mean-token-mean needs sample_ids (or unpacked [B, T] rows)")
        index, num_segments = segment_index(sample_ids)
        per_sample = segment_sum(masked, index, num_segments) / segment_sum(m, index, num_segments).clamp(min=1.0)
        return per_sample.sum() / max(global_num_samples, 1)
    raise ValueError(f"unknown aggregation {aggregation!r}; choose one of {AGGREGATIONS}")


def _default_sample_ids(logprobs: torch.Tensor) -> torch.Tensor:
    """Unpacked [B, T] input: one sample per row."""
    rows = torch.arange(logprobs.shape[0], device=logprobs.device)
    return rows.view(-1, *([1] * (logprobs.ndim - 1))).expand_as(logprobs)


def _ratio_metrics(
    ratio: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, config: LossConfig
) -> dict[str, float]:
    m = mask.bool()
    r, a = ratio.detach()[m], advantages.detach()[m]
    if r.numel() == 0:
        return {
            "loss/ratio_mean": 1.0,
            "loss/ratio_min": 1.0,
            "loss/ratio_max": 1.0,
            "loss/clip_frac_low": 0.0,
            "loss/clip_frac_high": 0.0,
        }
    n = float(r.numel())
    if config.loss == "cispo":
        low, high = torch.zeros_like(r, dtype=torch.bool), r > config.cispo_eps_max
    else:
        low = (r < 1.0 - config.clip_eps_low) & (a < 0)
        high = (r > 1.0 + config.clip_eps_high) & (a > 0)
    metrics = {
        "loss/ratio_mean": float(r.mean()),
        "loss/ratio_min": float(r.min()),
        "loss/ratio_max": float(r.max()),
        "loss/clip_frac_low": float(low.sum()) / n,
        "loss/clip_frac_high": float(high.sum()) / n,
    }
    if config.clip_delta is not None:
        metrics["loss/dual_clip_frac"] = float(((r > config.clip_delta) & (a < 0)).sum()) / n
    return metrics


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    *,
    global_num_loss_tokens: int,
    global_num_samples: int,
    sample_ids: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the step loss, and local metrics (`loss/...`, floats).

    Tensors share one shape ([rows, T] packed, or [B, T] unpacked with `sample_ids=None`); `old_logprobs`,
    `ref_logprobs`, `is_weights` are treated as constants. `entropy` enters the loss only when
    `entropy_coef != 0` (then it must carry grad); otherwise it is only logged.
    """
    aggregation = resolve_aggregation(config.loss, config.aggregation)
    if sample_ids is None:
        sample_ids = _default_sample_ids(logprobs)
    pg_loss, ratio = surrogate_loss(logprobs, old_logprobs, advantages, mask, config, sample_ids)
    if is_weights is not None:
        pg_loss = pg_loss * is_weights.detach()
    total = pg_loss
    m = mask.to(logprobs.dtype)
    num_local = max(float(m.sum()), 1.0)
    metrics = _ratio_metrics(ratio, advantages, mask, config)
    if config.kl_beta > 0:
        if ref_logprobs is None:
            raise ValueError("kl_beta > 0 needs ref_logprobs from the reference model")
        kl = kl_penalty(logprobs, ref_logprobs.detach(), config.kl_estimator)
        total = total + config.kl_beta * kl
        metrics["loss/kl"] = float((kl.detach() * m).sum()) / num_local
    if entropy is not None:
        if config.entropy_coef != 0:
            total = total - config.entropy_coef * entropy
        metrics["loss/entropy"] = float((entropy.detach() * m).sum()) / num_local
    norm: dict[str, Any] = dict(
        global_num_loss_tokens=global_num_loss_tokens,
        global_num_samples=global_num_samples,
        max_completion_length=config.max_completion_length,
        sample_ids=sample_ids,
    )
    loss = aggregate_loss(total, mask, aggregation, **norm)
    metrics["loss/policy"] = float(aggregate_loss(pg_loss.detach(), mask, aggregation, **norm))
    metrics["loss/total"] = float(loss.detach())
    metrics["loss/num_tokens"] = float(m.sum())
    return loss, metrics
