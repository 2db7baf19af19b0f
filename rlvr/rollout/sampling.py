"""Token selection and stop rules for the transformers engine (pure torch, no threads, no model).

Invariants:
- The recorded log-prob of a sampled token is log_softmax(logits / temperature) at that token, computed in
  fp32 *before* top-k/top-p filtering (docs/design.md, Generation engines: training uses top_p 1, top_k 0, so the learner's
  temperature-only distribution is the same). Greedy rows (temperature < GREEDY_TEMPERATURE_EPS) take the
  argmax and record temperature-1 log-probs.
- Each row draws from its own `torch.Generator`, so a seeded row's tokens do not depend on the other rows.
- Stop rules are checked after every appended token, in this order: stop token (EOS or `stop_token_ids`,
  kept in the completion), stop string (on the decoded completion; since the check runs after every token,
  the token just appended is the one that completed the string, and nothing after it exists), then
  `max_new_tokens` (or the model's position limit) -> "length".
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import torch

from rlvr.rollout.base import GREEDY_TEMPERATURE_EPS
from rlvr.types import FinishReason, PromptRequest, SamplingParams


def effective_temperature(temperature: float) -> float:
    """The temperature log-probs are taken at: 1.0 for greedy requests, else the request's own."""
    return 1.0 if temperature < GREEDY_TEMPERATURE_EPS else float(temperature)


def filter_top_k_top_p(logits_V: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k and outside the top-p nucleus to -inf (the argmax always survives)."""
    vocab = logits_V.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits_V, top_k).values[-1]
        logits_V = logits_V.masked_fill(logits_V < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits_V, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the mass strictly before it already exceeds top_p (keeps at least one token).
        drop_sorted = (torch.cumsum(probs, dim=-1) - probs) > top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits_V = logits_V.masked_fill(drop, float("-inf"))
    return logits_V


def sample_rows(
    logits_BV: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator]
) -> tuple[list[int], list[float]]:
    """Pick one token per row; return (token ids, their log-probs) as Python lists.

    logits_BV: next-token logits [B, V] (any float dtype; upcast to fp32 here). Row r uses params[r] and
    generators[r]. A Python loop over rows is fine at engine batch sizes and keeps rows independent.
    """
    logits_BV = logits_BV.float()
    temps_B1 = torch.tensor(
        [effective_temperature(p.temperature) for p in params], dtype=torch.float32, device=logits_BV.device
    ).unsqueeze(1)
    scaled_BV = logits_BV / temps_B1
    logprobs_BV = torch.log_softmax(scaled_BV, dim=-1)
    tokens: list[int] = []
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if p.temperature < GREEDY_TEMPERATURE_EPS:
            tokens.append(int(torch.argmax(logits_BV[row])))
            continue
        filtered = filter_top_k_top_p(scaled_BV[row], p.top_k, p.top_p)
        probs = torch.softmax(filtered, dim=-1)
        tokens.append(int(torch.multinomial(probs, 1, generator=gen)))
    index_B1 = torch.tensor(tokens, device=logits_BV.device).unsqueeze(1)
    picked = logprobs_BV.gather(1, index_B1).squeeze(1)
    return tokens, picked.tolist()


def check_finish(
    token_ids: list[int],
    params: SamplingParams,
    stop_ids: Collection[int],
    decode: Callable[[list[int]], str],
    at_position_limit: bool = False,
) -> FinishReason | None:
    """The finish reason of a completion whose last token was just appended, or None to keep going.

    stop_ids: EOS ids plus the request's `stop_token_ids`. decode: completion ids -> text (special tokens
    skipped); called only when the request has stop strings. at_position_limit: the next token would not
    fit the model's positions.
    """
    if token_ids and token_ids[-1] in stop_ids:
        return "stop"
    if params.stop_strings:
        text = decode(token_ids)
        if any(s and s in text for s in params.stop_strings):
            return "stop"
    if len(token_ids) >= params.max_new_tokens or at_position_limit:
        return "length"
    return None


def default_eos_token_ids(model: torch.nn.Module, tokenizer: object) -> list[int]:
    """EOS ids from the model's generation_config plus the tokenizer's eos token (sorted, unique)."""
    ids: list[int] = []
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for eos in (generation_eos, getattr(tokenizer, "eos_token_id", None)):
        if isinstance(eos, int):
            ids.append(eos)
        elif isinstance(eos, (list, tuple)):
            ids.extend(int(e) for e in eos)
    return sorted(set(ids))


def validate_params(params: SamplingParams) -> None:
    """Raise ValueError for sampling settings no engine can honour."""
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {params.top_k}")


def validate_request(request: PromptRequest, max_positions: int | None) -> None:
    """Raise ValueError for a request no engine can serve (empty prompt, no samples, too long, bad params)."""
    if not request.prompt_token_ids:
        raise ValueError(f"prompt {request.prompt_id!r} has no tokens")
    if request.num_samples < 1:
        raise ValueError(f"prompt {request.prompt_id!r}: num_samples must be >= 1, got {request.num_samples}")
    if max_positions is not None and len(request.prompt_token_ids) >= max_positions:
        raise ValueError(
            f"prompt {request.prompt_id!r} has {len(request.prompt_token_ids)} tokens but the model fits "
            f"{max_positions} positions; drop long prompts earlier (data: max prompt tokens)"
        )
    validate_params(request.sampling)
