"""Per-token KL estimators between the current policy and the reference policy.

Schulman, "Approximating KL divergence" (2020): with d_t = l_t - l_ref_t (log-prob of the sampled token under
the current and the reference policy) and r = exp(-d_t) = p_ref / p,
    k1 = d_t,    k2 = d_t^2 / 2,    k3 = (r - 1) - log r = exp(-d_t) - 1 + d_t.
k3 is unbiased for KL(p || p_ref) and always >= 0 (the usual GRPO default, DeepSeekMath eq. 4).

Invariants: d_t is clamped to [-40, 40] before exponentiating (exp(40) ~ 2e17 is finite in fp32 and bf16),
so the result is finite for any finite input. With beta = 0 the caller skips the reference model entirely
(`kl_needed`).
"""

from __future__ import annotations

from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3"]
KL_CLAMP = 40.0


def kl_needed(kl_beta: float) -> bool:
    """Whether a reference model is needed at all: only when the KL weight is non-zero."""
    if kl_beta < 0:
        raise ValueError(f"kl_beta must be >= 0, got {kl_beta}")
    return kl_beta > 0


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3") -> torch.Tensor:
    """Per-token KL estimate (same shape as the inputs); differentiable w.r.t. `logprobs`."""
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} differ")
    delta = (logprobs - ref_logprobs).clamp(-KL_CLAMP, KL_CLAMP)
    if estimator == "k1":
        return delta
    if estimator == "k2":
        return 0.5 * delta.square()
    if estimator == "k3":
        return torch.exp(-delta) - 1.0 + delta
    raise ValueError(f"unknown kl_estimator {estimator!r}; choose one of 'k1', 'k2', 'k3'")
