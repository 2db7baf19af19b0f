"""The running batch of the transformers engine: sequences decoding together over one KV cache.

Continuous admission without model.generate: each admitted prompt is prefilled alone (batch 1, no padding,
so no query row is ever all-masked), its cache repeated for its k samples, then merged into the running
cache by left-padding the shorter of the two along the sequence axis. Finished rows are dropped with
`batch_select_indices`, and columns that became padding for every row are cut from the left.

Invariants (row r everywhere belongs to `seqs[r]`):
- every cache layer holds keys/values [B, H, L, D]; `mask_BL` [B, L] is 1 on row r's cached tokens and 0 on
  its left padding; no column of `mask_BL` is 0 for every row.
- `next_token_B` holds each row's pending token: sampled and appended to the row's completion, but not yet
  fed to the model. `next_pos_B` is that token's position id (prompt length + tokens generated - 1).
- Only plain `DynamicLayer`s are used (the cache is built without a config), so left-padding is valid for
  every layer; sliding-window models still get their window from the attention mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from rlvr.types import FinishReason, PromptRequest, Sample


@dataclass
class Sequence:
    """One sample of one prompt while it is being generated (`job` is the engine's per-prompt record)."""

    job: Any
    request: PromptRequest
    sample_index: int
    generator: torch.Generator
    version_start: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_token_ids)

    def to_sample(self, version_end: int, engine_id: int, completion_text: str) -> Sample:
        """The finished sequence as a `Sample` (request fields copied)."""
        assert self.finish_reason is not None, "to_sample() on an unfinished sequence"
        req = self.request
        return Sample(
            prompt_id=req.prompt_id,
            sample_index=self.sample_index,
            prompt_token_ids=list(req.prompt_token_ids),
            completion_token_ids=list(self.token_ids),
            completion_text=completion_text,
            logprobs=list(self.logprobs),
            finish_reason=self.finish_reason,
            version_start=self.version_start,
            version_end=version_end,
            engine_id=engine_id,
            metadata=dict(req.metadata),
            is_eval=req.is_eval,
            prompt_text=req.prompt_text,
        )


def _pad_left(x: torch.Tensor, num: int) -> torch.Tensor:
    """Left-pad a [B, H, L, D] cache tensor with `num` zero columns along L."""
    if num == 0:
        return x
    shape = (x.shape[0], x.shape[1], num, x.shape[3])
    return torch.cat([x.new_zeros(shape), x], dim=2)


class RunningBatch:
    """Rows decoding together; mutated only by the engine's worker (or by abort, under the model lock)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.clear()

    def clear(self) -> None:
        """Drop every row and the cache."""
        self.seqs: list[Sequence] = []
        self.cache: DynamicCache | None = None
        self.mask_BL = torch.zeros(0, 0, dtype=torch.long, device=self.device)
        self.next_token_B = torch.zeros(0, dtype=torch.long, device=self.device)
        self.next_pos_B = torch.zeros(0, dtype=torch.long, device=self.device)

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def num_cached_tokens(self) -> int:
        """Cache slots held (rows x columns, padding included)."""
        return int(self.mask_BL.numel())

    def prefill(
        self, model: torch.nn.Module, prompt_token_ids: list[int], num_rows: int
    ) -> tuple[DynamicCache, torch.Tensor]:
        """Run one prompt through the model; return its cache repeated `num_rows` times and logits [rows, V]."""
        ids_1P = torch.tensor([prompt_token_ids], dtype=torch.long, device=self.device)
        pos_1P = torch.arange(len(prompt_token_ids), device=self.device).unsqueeze(0)
        cache = DynamicCache()
        out = model(input_ids=ids_1P, position_ids=pos_1P, past_key_values=cache, use_cache=True, logits_to_keep=1)
        if num_rows > 1:
            cache.batch_repeat_interleave(num_rows)
        return cache, out.logits[:, -1, :].expand(num_rows, -1)

    def add(self, seqs: list[Sequence], cache: DynamicCache, first_tokens: list[int]) -> None:
        """Merge freshly prefilled rows (same prompt, cache [k, H, P, D]) whose first tokens are sampled."""
        prompt_len = seqs[0].prompt_len
        k = len(seqs)
        new_mask = torch.ones(k, prompt_len, dtype=torch.long, device=self.device)
        new_tokens = torch.tensor(first_tokens, dtype=torch.long, device=self.device)
        new_pos = torch.full((k,), prompt_len, dtype=torch.long, device=self.device)
        if self.cache is None or not self.seqs:
            self.cache, self.mask_BL = cache, new_mask
        else:
            old_len = self.mask_BL.shape[1]
            length = max(old_len, prompt_len)
            for old, new in zip(self.cache.layers, cache.layers, strict=True):
                old.keys = torch.cat([_pad_left(old.keys, length - old_len), _pad_left(new.keys, length - prompt_len)])
                old.values = torch.cat(
                    [_pad_left(old.values, length - old_len), _pad_left(new.values, length - prompt_len)]
                )
            pad_old = self.mask_BL.new_zeros(len(self.seqs), length - old_len)
            pad_new = new_mask.new_zeros(k, length - prompt_len)
            self.mask_BL = torch.cat([torch.cat([pad_old, self.mask_BL], 1), torch.cat([pad_new, new_mask], 1)])
        self.seqs.extend(seqs)
        self.next_token_B = torch.cat([self.next_token_B, new_tokens])
        self.next_pos_B = torch.cat([self.next_pos_B, new_pos])

    def step(self, model: torch.nn.Module) -> torch.Tensor:
        """Feed every row's pending token; return next-token logits [B, V]."""
        assert self.cache is not None and self.seqs, "step() on an empty batch"
        ones_B1 = self.mask_BL.new_ones(len(self.seqs), 1)
        mask_BL = torch.cat([self.mask_BL, ones_B1], dim=1)
        out = model(
            input_ids=self.next_token_B.unsqueeze(1),
            attention_mask=mask_BL,
            position_ids=self.next_pos_B.unsqueeze(1),
            past_key_values=self.cache,
            use_cache=True,
        )
        self.mask_BL = mask_BL
        self.next_pos_B = self.next_pos_B + 1
        return out.logits[:, -1, :]

    def set_next_tokens(self, tokens: list[int]) -> None:
        self.next_token_B = torch.tensor(tokens, dtype=torch.long, device=self.device)

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (in order); then cut columns that are padding for every remaining row."""
        if len(rows) == len(self.seqs):
            return
        if not rows:
            self.clear()
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        assert self.cache is not None
        self.cache.batch_select_indices(index)
        self.seqs = [self.seqs[r] for r in rows]
        self.mask_BL = self.mask_BL[index]
        self.next_token_B = self.next_token_B[index]
        self.next_pos_B = self.next_pos_B[index]
        first_used = int(self.mask_BL.any(dim=0).nonzero()[0])
        if first_used > 0:
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, first_used:, :]
                layer.values = layer.values[:, :, first_used:, :]
            self.mask_BL = self.mask_BL[:, first_used:]
