"""`torch_varlen`: packed (varlen) attention on torch's own flash kernel, for learners without flash-attn.

transformers' `sdpa` path handles packed rows by building a dense block-causal mask, which rules out SDPA's
flash kernel and costs O(T^2) memory and time per row. torch >= 2.10 ships the flash-attention varlen kernel
as `torch.nn.attention.varlen.varlen_attn` (cumulative sequence lengths, like flash-attn's
`flash_attn_varlen_func`): `_hidden_states` in `rlvr.learner.logprobs` flattens the packed rows to one
sequence and passes `cu_seq_lens_q/k` and `max_length_q/k` (the kwarg names of transformers'
FlashAttentionKwargs, which every decoder layer forwards to its attention function), and this module
registers an attention implementation that reads them. No mask is built: transformers skips mask creation
for attention implementations without a mask function.

On CPU (tests) and on torch builds without the kernel, the same contract runs as one SDPA call per segment,
so the plumbing (flattening, cu_seqlens, GQA, layouts) is exercised everywhere and the kernel on GPUs.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F

NAME = "torch_varlen"


def _resolve_kernel() -> tuple[Any, dict[str, Any], set[str]] | None:
    """(varlen_attn, causal kwargs for this torch version, its parameter names) or None where torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}  # torch 2.10 vs >= 2.11
    return varlen_attn, causal, set(params)


_KERNEL = _resolve_kernel()  # at import: torch.compile traces the attention function, not this lookup


def kernel_available() -> bool:
    """torch's varlen flash kernel can run here (torch >= 2.10 and a CUDA device)."""
    return _KERNEL is not None and torch.cuda.is_available()


def varlen_metadata(position_ids: torch.Tensor) -> dict[str, Any]:
    """cu_seq_lens / max_length kwargs for the rows of `position_ids` [rows, T] flattened to one sequence.

    A segment starts where position_ids == 0 (a sample, or a padding run) and at every row start."""
    starts = position_ids == 0
    starts[:, 0] = True
    idx = torch.nonzero(starts.reshape(-1), as_tuple=True)[0]
    total = torch.tensor([position_ids.numel()], device=idx.device, dtype=idx.dtype)
    cu = torch.cat([idx, total]).to(torch.int32)
    max_len = int((cu[1:] - cu[:-1]).max().item())
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max_len, "max_length_k": max_len}


def _repeat_kv(x: torch.Tensor, times: int) -> torch.Tensor:
    return x if times == 1 else x.repeat_interleave(times, dim=1)


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: query [1, Hq, N, D], key/value [1, Hkv, N, D] -> ([1, N, Hq, D], None)."""
    if dropout:
        raise ValueError(f"{NAME} attention does not implement dropout")
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        return _unpacked(query, key, value, attention_mask, scaling), None
    if query.shape[0] != 1:
        raise ValueError(f"{NAME} attention takes packed rows flattened to batch 1 (got batch {query.shape[0]})")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [N, H, D]
    groups = q.shape[1] // k.shape[1]
    max_len = int(kwargs.get("max_length_q") or int((cu[1:] - cu[:-1]).max()))
    kern = _KERNEL
    if kern is not None and q.is_cuda:
        fn, causal, params = kern
        extra: dict[str, Any] = {}
        if groups > 1 and "enable_gqa" in params:
            extra["enable_gqa"] = True
        else:
            k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
        if scaling is not None and "scale" in params:
            extra["scale"] = scaling
        elif scaling is not None and abs(scaling - q.shape[-1] ** -0.5) > 1e-9:
            raise ValueError(f"this torch's varlen_attn has no `scale`; the model needs {scaling}")
        out = fn(q, k, v, cu, cu, max_len, max_len, **causal, **extra)
    else:
        k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
        bounds = cu.tolist()
        parts = [
            F.scaled_dot_product_attention(
                q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1), is_causal=True, scale=scaling
            ).transpose(0, 1)
            for s, e in zip(bounds[:-1], bounds[1:])
            if e > s
        ]
        out = torch.cat(parts, dim=0)
    return out.unsqueeze(0), None


def _unpacked(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
) -> torch.Tensor:
    """Plain causal batches (no cu_seqlens: e.g. a model called directly): SDPA, one sequence per row."""
    if attention_mask is not None:
        raise ValueError(f"{NAME} attention does not take padding masks; pack the rows (rlvr.learner.logprobs)")
    q_len, k_len = query.shape[2], key.shape[2]
    if q_len != k_len and q_len != 1:
        raise ValueError(f"{NAME} attention: {q_len} queries over {k_len} cached keys is not supported")
    groups = query.shape[1] // key.shape[1]
    out = F.scaled_dot_product_attention(
        query, _repeat_kv(key, groups), _repeat_kv(value, groups), is_causal=q_len == k_len and q_len > 1, scale=scaling
    )
    return out.transpose(1, 2).contiguous()


def register() -> None:
    """Make `attn_implementation="torch_varlen"` known to transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, varlen_attention_forward)
