"""Sequence packing for the learner: rows of at most `pack_length` tokens, balanced over data-parallel ranks.

Pipeline (docs/design.md, Algorithms: packing): first-fit-decreasing of samples (prompt + completion) into rows ->
rows spread over ranks balancing token counts with equal row counts (+-1) -> each rank's rows grouped into
micro-batches of `micro_batch_rows` rows -> every rank padded with dummy micro-batches to the same count
(a rank that ran out would deadlock the collectives of the others).

Alignment convention (all per-token tensors are [num_rows, T], T <= pack_length, T = longest row of the
micro-batch rounded up to `pad_multiple`): the value at position t refers to the token input_ids[t] as
predicted from the tokens before it in the same sample, i.e. log p(input_ids[t] | input_ids[start..t-1]).
Consequently:
- loss_mask is 1 exactly on the policy's completion tokens of samples that count in the loss:
  loss_mask = per-token completion mask & sample mask (`PackInput.completion_mask`, all ones for single-turn
  samples; 0 on the tool observations of a multi-turn episode), never on prompt tokens, on a sample's first
  token (nothing predicts it) or on padding;
- advantages hold the sample's advantage where loss_mask is 1, else 0 (one advantage per sample or episode,
  broadcast over its policy tokens);
- engine_logprobs hold `Sample.logprobs[j]` on the j-th completion token if the policy generated it, else 0
  (observation tokens have no engine log-prob);
- sample_ids hold the sample's global id, -1 on padding;
- position_ids restart at 0 for every sample; padding at the end of a row forms its own segment with
  positions 0, 1, ... so that position-id based packing detection (transformers' find_packed_sequence_indices,
  flash-attn varlen) never joins it to the last sample;
- cu_seqlens (one list per row) are the segment boundaries [0, l1, l1+l2, ..., T], the padding segment
  included when there is one.
Dummy micro-batches are one row of 2 pad tokens (so every rank runs the whole model, lm_head included:
ZeRO-3 gathers and ZeRO-2/3 gradient reductions must line up) with loss_mask 0 and sample_ids -1.

Global normalisers: every PackedBatch carries the counts of the WHOLE step (all ranks): the number of
loss tokens (sum of loss_mask: policy tokens only) and the number of samples with at least one loss token.
Every loss reduction (token-mean and seq-mean-token-mean denominators, GSPO's sequence ratio, the TIS sequence
mask) sums over loss_mask, so observation tokens count nowhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlvr.algorithms.policy_tokens import check_completion_mask, completion_mask
from rlvr.telemetry.reduce import MetricReducer, Reduction
from rlvr.types import Group, MicroBatch, PackedBatch

PACKING_REDUCTIONS: dict[str, Reduction] = {
    "perf/packing_efficiency": "mean",
    "perf/padded_token_efficiency": "mean",
    "perf/num_packed_rows": "sum",
    "perf/micro_batches_per_rank": "sum",
    "perf/dummy_micro_batches": "sum",
    "perf/rank_token_imbalance": "max",
}
"""How `build_packed_batches`' metrics combine over the mini-batches of a step (`pack_step`): rows and micro-batches
add up (each rank runs all its mini-batches' micro-batches), the efficiencies average (weighted by rows), the
worst imbalance counts."""


@dataclass(frozen=True)
class PackInput:
    """What the packer needs from one sample (see `pack_inputs_from_groups`).

    `completion_mask`: one 0/1 per completion token, 1 where the policy generated the token (None: all ones,
    the single-turn case); `in_loss` masks the whole sample.
    """

    sample_id: int
    prompt_token_ids: Sequence[int]
    completion_token_ids: Sequence[int]
    completion_logprobs: Sequence[float]
    advantage: float
    in_loss: bool = True
    completion_mask: Sequence[int] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.completion_token_ids)


def pack_inputs_from_groups(groups: Sequence[Group], first_id: int = 0) -> list[PackInput]:
    """One PackInput per sample, ids numbered `first_id`.. in group order; uses `advantages`, `loss_masks` and
    each sample's `metadata["completion_loss_mask"]` (multi-turn samples, `rlvr.algorithms.policy_tokens`)."""
    inputs: list[PackInput] = []
    for group in groups:
        if len(group.advantages) != group.num_samples:
            raise ValueError(f"group {group.prompt_id}: compute advantages before packing")
        masks = group.loss_masks or [True] * group.num_samples
        for sample, advantage, in_loss in zip(group.samples, group.advantages, masks):
            inputs.append(
                PackInput(
                    first_id + len(inputs),
                    sample.prompt_token_ids,
                    sample.completion_token_ids,
                    sample.logprobs,
                    float(advantage),
                    bool(in_loss),
                    completion_mask(sample),
                )
            )
    return inputs


def first_fit_decreasing(lengths: Sequence[int], pack_length: int) -> list[list[int]]:
    """Bins of item indices, each bin's total length <= pack_length (FFD, O(n log n) with a max-tree)."""
    for i, length in enumerate(lengths):
        if length > pack_length:
            raise ValueError(
                f"sample {i} has {length} tokens > pack_length {pack_length}; raise learner.pack_length "
                "or lower data.max_prompt_tokens / generation.max_new_tokens"
            )
        if length <= 0:
            raise ValueError(f"sample {i} has {length} tokens; samples must not be empty")
    size = 1
    while size < max(len(lengths), 1):
        size *= 2
    tree = [pack_length] * (2 * size)  # max remaining capacity per subtree; leaves = bins in opening order
    bins: list[list[int]] = []
    for item in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length, node = lengths[item], 1
        while node < size:  # descend to the leftmost bin with enough room (first fit)
            node = 2 * node if tree[2 * node] >= length else 2 * node + 1
        leaf = node - size
        if leaf == len(bins):
            bins.append([])
        bins[leaf].append(item)
        tree[node] -= length
        node //= 2
        while node:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2
    return bins


def assign_rows_to_ranks(row_lengths: Sequence[int], num_ranks: int) -> list[list[int]]:
    """Row indices per rank: row counts differ by at most 1; tokens balanced greedily (largest row first)."""
    if num_ranks <= 0:
        raise ValueError(f"num_ranks must be positive, got {num_ranks}")
    quota = -(-len(row_lengths) // num_ranks)
    ranks: list[list[int]] = [[] for _ in range(num_ranks)]
    tokens = [0] * num_ranks
    for row in sorted(range(len(row_lengths)), key=lambda r: (-row_lengths[r], r)):
        open_ranks = [r for r in range(num_ranks) if len(ranks[r]) < quota]
        best = min(open_ranks, key=lambda r: (tokens[r], len(ranks[r]), r))
        ranks[best].append(row)
        tokens[best] += row_lengths[row]
    return ranks


def segment_ids_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """Segment index per token [B, T]: a new segment starts wherever positions do not increase by 1."""
    first = position_ids[:, :1] - 1
    return (torch.diff(position_ids, prepend=first, dim=-1) != 1).cumsum(-1)


def block_causal_mask(position_ids: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """4D mask [B, 1, T, T] letting token i attend to j iff j <= i in the same segment.

    bool (True = attend) when `dtype` is None, else additive (0 or the dtype's min), the form eager
    attention in transformers adds to its scores (sdpa accepts both).
    """
    seg = segment_ids_from_position_ids(position_ids)
    length = position_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=position_ids.device).tril()
    allowed = (seg[:, :, None] == seg[:, None, :]) & causal
    allowed = allowed[:, None]
    if dtype is None:
        return allowed
    zero = torch.zeros((), dtype=dtype, device=position_ids.device)
    return torch.where(allowed, zero, torch.finfo(dtype).min)


def packing_efficiency(num_real_tokens: int, num_rows: int, pack_length: int) -> float:
    """real tokens / (rows * pack_length): the share of row capacity holding real tokens."""
    return num_real_tokens / (num_rows * pack_length) if num_rows else 0.0


def _row_tensors(
    row: Sequence[PackInput], length: int, pad_token_id: int, dtype: torch.dtype
) -> tuple[list[torch.Tensor], list[int]]:
    """input_ids, position_ids, advantages, engine_logprobs, loss_mask, sample_ids of one row, and cu_seqlens."""
    ids = torch.full((length,), pad_token_id, dtype=torch.long)
    pos = torch.zeros(length, dtype=torch.long)
    adv = torch.zeros(length, dtype=dtype)
    gen = torch.zeros(length, dtype=dtype)
    mask = torch.zeros(length, dtype=torch.bool)
    sid = torch.full((length,), -1, dtype=torch.long)
    cu, offset = [0], 0
    for item in row:
        num_prompt, num_completion = len(item.prompt_token_ids), len(item.completion_token_ids)
        if len(item.completion_logprobs) != num_completion:
            raise ValueError(
                f"sample {item.sample_id}: {len(item.completion_logprobs)} logprobs for "
                f"{num_completion} completion tokens"
            )
        policy = None
        if item.completion_mask is not None:
            where = f"sample {item.sample_id}"
            policy = torch.tensor(check_completion_mask(item.completion_mask, num_completion, where), dtype=torch.bool)
        end = offset + item.num_tokens
        ids[offset:end] = torch.tensor(list(item.prompt_token_ids) + list(item.completion_token_ids), dtype=torch.long)
        pos[offset:end] = torch.arange(item.num_tokens)
        sid[offset:end] = item.sample_id
        start = offset + num_prompt
        gen[start:end] = torch.tensor(list(item.completion_logprobs), dtype=dtype)
        if policy is not None:
            gen[start:end] = torch.where(policy, gen[start:end], torch.zeros((), dtype=dtype))
        if item.in_loss:
            mask[start:end] = True if policy is None else policy
            mask[offset] = False  # a sample's first token is predicted by nothing (empty prompt case)
            adv[start:end] = item.advantage
            adv[offset] = 0.0 if num_prompt == 0 else adv[offset]
            if policy is not None:
                adv[offset:end] = torch.where(mask[offset:end], adv[offset:end], torch.zeros((), dtype=dtype))
        offset = end
        cu.append(offset)
    if offset < length:
        pos[offset:] = torch.arange(length - offset)
        cu.append(length)
    return [ids, pos, adv, gen, mask, sid], cu


def _micro_batch(rows: Sequence[Sequence[PackInput]], length: int, pad_token_id: int, dtype: torch.dtype) -> MicroBatch:
    built = [_row_tensors(row, length, pad_token_id, dtype) for row in rows]
    ids, pos, adv, gen, mask, sid = (torch.stack([b[0][k] for b in built]) for k in range(6))
    return MicroBatch(
        input_ids=ids,
        position_ids=pos,
        advantages=adv,
        engine_logprobs=gen,
        loss_mask=mask,
        sample_ids=sid,
        cu_seqlens=[b[1] for b in built],
        num_samples=sum(len(r) for r in rows),
        num_tokens=sum(item.num_tokens for r in rows for item in r),
    )


def build_packed_batches(
    inputs: Sequence[PackInput],
    *,
    pack_length: int,
    num_ranks: int = 1,
    micro_batch_rows: int = 1,
    pad_token_id: int = 0,
    pad_multiple: int = 1,
    dtype: torch.dtype = torch.float32,
) -> list[PackedBatch]:
    """Pack one optimizer step's samples into one `PackedBatch` per data-parallel rank (see module doc)."""
    if micro_batch_rows <= 0 or pad_multiple <= 0 or pack_length <= 0:
        raise ValueError("pack_length, micro_batch_rows and pad_multiple must be positive")
    if len({item.sample_id for item in inputs}) != len(inputs):
        raise ValueError("sample ids passed to the packer must be unique")
    bins = first_fit_decreasing([item.num_tokens for item in inputs], pack_length)
    row_lengths = [sum(inputs[i].num_tokens for i in b) for b in bins]
    per_rank_rows = assign_rows_to_ranks(row_lengths, num_ranks)
    per_rank_chunks = []
    for rank_rows in per_rank_rows:
        ordered = sorted(rank_rows, key=lambda r: (-row_lengths[r], r))  # similar lengths share a micro-batch
        per_rank_chunks.append([ordered[i : i + micro_batch_rows] for i in range(0, len(ordered), micro_batch_rows)])
    num_micro_batches = max(1, max(len(chunks) for chunks in per_rank_chunks))
    dummy = _micro_batch(
        [[]], min(max(2, pad_multiple), pack_length), pad_token_id, dtype
    )  # 2 tokens: runs the lm_head
    ranks_mbs: list[list[MicroBatch]] = []
    for chunks in per_rank_chunks:
        mbs = []
        for chunk in chunks:
            longest = max(row_lengths[r] for r in chunk)
            length = min(max(pack_length, longest), -(-longest // pad_multiple) * pad_multiple)
            mbs.append(_micro_batch([[inputs[i] for i in bins[r]] for r in chunk], length, pad_token_id, dtype))
        mbs += [dummy] * (num_micro_batches - len(mbs))
        ranks_mbs.append(mbs)
    num_loss_tokens = sum(int(mb.loss_mask.sum()) for mbs in ranks_mbs for mb in mbs)
    num_samples = sum(int(torch.unique(mb.sample_ids[mb.loss_mask]).numel()) for mbs in ranks_mbs for mb in mbs)
    num_real = sum(row_lengths)
    num_padded = sum(mb.input_ids.numel() for mbs in ranks_mbs for mb in mbs)
    metrics = {
        "perf/packing_efficiency": packing_efficiency(num_real, len(bins), pack_length),
        "perf/padded_token_efficiency": num_real / num_padded if num_padded else 0.0,
        "perf/num_packed_rows": float(len(bins)),
        "perf/micro_batches_per_rank": float(num_micro_batches),
        "perf/dummy_micro_batches": float(sum(num_micro_batches - len(c) for c in per_rank_chunks)),
        "perf/rank_token_imbalance": _imbalance([sum(row_lengths[r] for r in rows) for rows in per_rank_rows]),
    }
    return [
        PackedBatch(
            micro_batches=mbs,
            global_num_loss_tokens=num_loss_tokens,
            global_num_samples=num_samples,
            pack_length=pack_length,
            metrics=dict(metrics),
        )
        for mbs in ranks_mbs
    ]


def _imbalance(tokens_per_rank: Sequence[int]) -> float:
    """max / mean tokens per rank (1.0 = perfect balance)."""
    mean = sum(tokens_per_rank) / len(tokens_per_rank)
    return max(tokens_per_rank) / mean if mean else 1.0


def pack_step(
    groups: Sequence[Group],
    *,
    num_mini_batches: int,
    pack_length: int,
    num_ranks: int = 1,
    micro_batch_rows: int = 1,
    pad_token_id: int = 0,
) -> tuple[list[list[PackedBatch]], dict[str, float]]:
    """One training step: one PackedBatch per (rank, mini-batch), the mini-batches splitting the groups evenly
    (group j goes to mini-batch j mod n; sample ids unique over the step), and the packing metrics of all the
    mini-batches (`PACKING_REDUCTIONS`)."""
    num_mb = min(num_mini_batches, max(1, len(groups)))
    per_rank: list[list[PackedBatch]] = [[] for _ in range(num_ranks)]
    metrics = MetricReducer()
    first_id = 0
    for j in range(num_mb):
        inputs = pack_inputs_from_groups(groups[j::num_mb], first_id)
        first_id += len(inputs)
        batches = build_packed_batches(
            inputs,
            pack_length=pack_length,
            num_ranks=num_ranks,
            micro_batch_rows=micro_batch_rows,
            pad_token_id=pad_token_id,
        )
        for rank, pb in enumerate(batches):
            per_rank[rank].append(pb)
        metrics.add_all(
            batches[0].metrics, PACKING_REDUCTIONS, weight=batches[0].metrics["perf/num_packed_rows"] or 1.0
        )
    return per_rank, metrics.result()
