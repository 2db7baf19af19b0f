"""Token entropy of the policy distribution, computed from logits in chunks.

H_t = logsumexp(z_t) - sum_v softmax(z_t)_v * z_t,v  (z = logits / temperature, computed in fp32).

Invariants: the full [..., T, V] fp32 softmax is never materialised at once; rows are processed in chunks
of `chunk_size` positions. Without `requires_grad` the computation runs under `torch.no_grad()` (entropy
is then a logged metric only, as in DAPO/verl when no entropy bonus is configured).
"""

from __future__ import annotations

import torch


def _entropy_chunk(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    z = logits.float() / temperature if logits.dtype in (torch.float16, torch.bfloat16) else logits / temperature
    log_z = torch.logsumexp(z, dim=-1)
    probs = torch.softmax(z, dim=-1)
    return log_z - (probs * z).sum(dim=-1)


def entropy_from_logits(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    requires_grad: bool = False,
) -> torch.Tensor:
    """Entropy per position of `logits` [..., T, V] -> [..., T] (fp32, or the input dtype if wider).

    Chunked over the second-to-last dimension; no gradient unless `requires_grad`.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    with torch.set_grad_enabled(requires_grad and torch.is_grad_enabled()):
        num_positions = logits.shape[-2]
        parts = [
            _entropy_chunk(logits[..., start : start + chunk_size, :], temperature)
            for start in range(0, num_positions, chunk_size)
        ]
        if not parts:
            return logits.new_zeros(logits.shape[:-1], dtype=torch.promote_types(logits.dtype, torch.float32))
        return torch.cat(parts, dim=-1)
