"""Per-token log-probs of the realised tokens on packed rows (the learner's l_t / l_old_t / l_ref_t).

Alignment (same as `rlvr.algorithms.packing`): out[r, t] = log p(input_ids[r, t] | tokens of the same sample
before t) under logits / temperature; 0 at each sample's first token (position_ids == 0) and on the first
token of padding segments.

Memory: the lm_head and log_softmax run over chunks of `chunk_size` positions, so full-row fp32 logits [T, V]
never exist at once, in forward or backward. Logits are upcast to fp32 per chunk before the softmax. The
default head path is `rlvr.learner.fused_head` (closed-form gradient, recompute in backward); the autograd
fallback checkpoints each chunk.

Attention across samples is blocked in one of two ways:
- "varlen": pass position_ids only (attention_mask None). transformers 5 detects packing from position
  ids that do not increase by 1 (masking_utils.find_packed_sequence_indices) and builds block-causal masks
  for eager/sdpa; flash-attention uses its varlen kernel from position ids
  (modeling_flash_attention_utils._is_packed_sequence), which only fires for batch size 1, so for
  flash-attention implementations the rows are flattened into one [1, rows * T] sequence.
- "mask": pass an explicit additive 4D block-diagonal causal mask (`block_causal_mask`), for backends
  without varlen support. Cost O(T^2) memory per row.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from torch.utils.checkpoint import checkpoint

from rlvr.algorithms.packing import block_causal_mask
from rlvr.learner import attention as attention_impl
from rlvr.learner.fused_head import fusable, linear_logprobs

logger = logging.getLogger(__name__)

AttentionPath = Literal["varlen", "mask"]


def decoder(model: torch.nn.Module) -> torch.nn.Module:
    """The causal LM's decoder stack (no lm_head): what runs the layers and returns hidden states."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model.base_model


def _hidden_states(
    model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor, attention: AttentionPath
) -> torch.Tensor:
    """Final hidden states [rows, T, H] from the model's decoder (no lm_head)."""
    backbone = decoder(model)
    if attention == "mask":
        dtype = next(model.parameters()).dtype
        mask = block_causal_mask(position_ids, dtype=dtype)
        out = backbone(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, use_cache=False)
        return out.last_hidden_state
    if attention != "varlen":
        raise ValueError(f"unknown attention path {attention!r}; choose 'varlen' or 'mask'")
    impl = str(getattr(model.config, "_attn_implementation", "") or "")
    rows, length = input_ids.shape
    if impl == attention_impl.NAME:  # torch's varlen kernel: segments given as cu_seqlens over the flattened rows
        meta = attention_impl.varlen_metadata(position_ids)
        out = backbone(
            input_ids=input_ids.reshape(1, -1), position_ids=position_ids.reshape(1, -1), use_cache=False, **meta
        )
        return out.last_hidden_state.reshape(rows, length, -1)
    if "flash" in impl and rows > 1:
        out = backbone(input_ids=input_ids.reshape(1, -1), position_ids=position_ids.reshape(1, -1), use_cache=False)
        return out.last_hidden_state.reshape(rows, length, -1)
    out = backbone(input_ids=input_ids, position_ids=position_ids, use_cache=False)
    return out.last_hidden_state


def _chunk_logprobs(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> torch.Tensor:
    logits = head(hidden)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return picked
    entropy = -(logp.exp() * logp).sum(-1)
    return torch.stack([picked, entropy], dim=-1)


def head_chunks(num_targets: int, chunk_size: int) -> int:
    """How many head calls `packed_logprobs`' chunked path makes for rows of `num_targets` predicted tokens."""
    return -(-num_targets // chunk_size)


def packed_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    temperature: float = 1.0,
    attention: AttentionPath = "varlen",
    chunk_size: int = 1024,
    return_entropy: bool = False,
    entropy_requires_grad: bool = False,
    fused: bool = True,
    head_calls: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logprobs [rows, T], entropy [rows, T] or None; fp32, or fp64 for an fp64 model) of `model` on packed rows.

    `entropy[r, t]` is the entropy of the distribution that predicted token t (same alignment as logprobs);
    it carries grad only with `entropy_requires_grad` (an entropy bonus is configured).
    `fused` uses `rlvr.learner.fused_head` (closed-form gradient, no logits kept) where the head allows it
    (a bias-free Linear, not ZeRO-3-partitioned) and the entropy needs no gradient; else checkpointed chunks.
    `head_calls` (chunked path): call the head exactly this many times (>= the chunks needed): the extra calls run
    on one token and join the graph with weight 0. Under ZeRO-3 every head call is a parameter gather (a collective),
    so ranks must agree on it (`head_chunks`; `LearnerWorker` takes the maximum over ranks).
    """
    if input_ids.shape != position_ids.shape or input_ids.ndim != 2:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and position_ids must both be [rows, T]")
    if temperature <= 0 or chunk_size <= 0:
        raise ValueError("temperature and chunk_size must be positive")
    hidden = _hidden_states(model, input_ids, position_ids, attention)[:, :-1]
    targets = input_ids[:, 1:]
    head = model.get_output_embeddings()
    rows, out_dtype = input_ids.shape[0], torch.promote_types(hidden.dtype, torch.float32)
    starts = position_ids == 0
    zeros = hidden.new_zeros(rows, 1, dtype=out_dtype)
    if fused and fusable(head) and not (return_entropy and entropy_requires_grad):
        lp, ent = linear_logprobs(hidden, head.weight, targets, temperature, chunk_size)
        logprobs = torch.cat([zeros, lp], dim=1).masked_fill(starts, 0.0)
        entropy = torch.cat([zeros, ent], dim=1).masked_fill(starts, 0.0) if return_entropy else None
        return logprobs, entropy
    use_checkpoint = torch.is_grad_enabled()
    spans = [(start, start + chunk_size) for start in range(0, targets.shape[1], chunk_size)]
    if head_calls is not None:
        if head_calls < len(spans):
            raise ValueError(f"head_calls={head_calls} < the {len(spans)} chunks of {targets.shape[1]} tokens")
        spans += [(0, 1)] * (head_calls - len(spans))  # extra calls, weight 0 below
    outs = []
    for start, end in spans:
        h, y = hidden[:, start:end], targets[:, start:end]
        if use_checkpoint:
            outs.append(checkpoint(_chunk_logprobs, head, h, y, temperature, return_entropy, use_reentrant=False))
        else:
            outs.append(_chunk_logprobs(head, h, y, temperature, return_entropy))
    real = head_chunks(targets.shape[1], chunk_size)
    if len(outs) > real:  # in the graph (their backward recomputes the head too), contributing nothing
        zeros = zeros + 0.0 * sum(o.sum() for o in outs[real:])
        outs = outs[:real]
    parts, entropy_parts = [], []
    for chunk in outs:
        if return_entropy:
            parts.append(chunk[..., 0])
            entropy_parts.append(chunk[..., 1] if entropy_requires_grad else chunk[..., 1].detach())
        else:
            parts.append(chunk)
    logprobs = torch.cat([zeros, *parts], dim=1).masked_fill(starts, 0.0)
    if not return_entropy:
        return logprobs, None
    entropy = torch.cat([zeros, *entropy_parts], dim=1).masked_fill(starts, 0.0)
    return logprobs, entropy
