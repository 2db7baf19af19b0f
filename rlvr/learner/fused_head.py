"""Fused lm_head + log-softmax + gather (+ entropy): per-token log-probs without [T, V] logits in the graph.

The learner needs log p(y_t) = z_t[y_t] - logsumexp(z_t) with z_t = W h_t / temperature for every trained
token, and the entropy of p_t as a metric. Built from autograd ops this costs, per chunk of positions, the
lm_head GEMM, an fp32 copy of the logits, log_softmax, gather, exp, mul and sum in forward, all of it again in
a checkpointed recompute, and the backward of each op. The gradient is known in closed form,

    d log p(y_t) / d z_t = onehot(y_t) - softmax(z_t),

so this autograd Function keeps only the hidden states and one logsumexp per position, and in backward
recomputes the logits chunk by chunk, forms g_t (onehot - softmax) / temperature in place, and runs the two
GEMMs (grad of hidden, grad of W). It is the same idea as Liger-Kernel's fused linear cross-entropy
(Hsu et al. 2024, arXiv:2410.10989) and Cut Cross-Entropy (Wijmans et al. 2024, arXiv:2411.09009), written in
plain torch ops. The entropy H_t = logsumexp(z_t) - sum_v p_tv z_tv comes out of the forward for free and
carries no gradient (the entropy-bonus loss uses the autograd path in `rlvr.learner.logprobs`).
"""

from __future__ import annotations

import torch


def _forward_stats(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logsumexp, log p(target), entropy) of one chunk of lm_head outputs, in fp32 (fp64 for fp64 models)."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32)).div_(temperature)
    lse = torch.logsumexp(z, dim=-1)
    picked = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    p = (z - lse[:, None]).exp_()
    return lse, picked, lse - p.mul_(z).sum(-1)


def _backward_dlogits(
    logits: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor, grad: torch.Tensor, temperature: float
) -> torch.Tensor:
    """d loss / d logits = g (onehot(target) - softmax(z)) / temperature, in the logits' dtype."""
    g = grad.to(lse.dtype)
    d = logits.to(lse.dtype).div_(temperature)
    d.sub_(lse[:, None]).exp_().mul_(-g[:, None])
    d.scatter_add_(-1, targets[:, None], g[:, None])
    return d.div_(temperature).to(logits.dtype)


_kernels = {"forward": _forward_stats, "backward": _backward_dlogits}


def compile_kernels(backend: str = "inductor") -> None:
    """Use torch.compile'd versions of the per-chunk elementwise math (one fused kernel per pass over [c, V])."""
    _kernels["forward"] = torch.compile(_forward_stats, dynamic=True, backend=backend)
    _kernels["backward"] = torch.compile(_backward_dlogits, dynamic=True, backend=backend)


class LinearLogprob(torch.autograd.Function):
    """(logprobs [n], entropy [n]) of `targets` under softmax(hidden @ weight.T / temperature), chunked."""

    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,  # type: ignore[override]
        temperature: float,
        chunk_size: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = hidden.shape[0]
        out_dtype = torch.promote_types(hidden.dtype, torch.float32)
        logp = hidden.new_empty(n, dtype=out_dtype)
        entropy = hidden.new_empty(n, dtype=out_dtype)
        lse = hidden.new_empty(n, dtype=out_dtype)
        for s in range(0, n, chunk_size):
            e = min(n, s + chunk_size)
            lse[s:e], logp[s:e], entropy[s:e] = _kernels["forward"](hidden[s:e] @ weight.T, targets[s:e], temperature)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor, _grad_entropy: torch.Tensor | None):  # type: ignore[override]
        hidden, weight, targets, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        n, t = hidden.shape[0], ctx.temperature
        for s in range(0, n, ctx.chunk_size):
            e = min(n, s + ctx.chunk_size)
            d = _kernels["backward"](hidden[s:e] @ weight.T, lse[s:e], targets[s:e], grad_logp[s:e], t)
            if grad_h is not None:
                torch.mm(d, weight, out=grad_h[s:e])
            if grad_w is not None:
                grad_w.addmm_(d.T, hidden[s:e])
        return grad_h, grad_w, None, None, None


def fusable(head: torch.nn.Module) -> bool:
    """The head is a bias-free Linear whose weight is a whole tensor (not a ZeRO-3 partition)."""
    return (
        isinstance(head, torch.nn.Linear)
        and head.bias is None
        and not hasattr(head.weight, "ds_id")
        and head.weight.dim() == 2
    )


def linear_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float, chunk_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`LinearLogprob` on hidden [..., H] and targets [...]: (logprobs, entropy), each shaped like targets."""
    shape = targets.shape
    lp, ent = LinearLogprob.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1), temperature, chunk_size
    )
    return lp.reshape(shape), ent.reshape(shape)
