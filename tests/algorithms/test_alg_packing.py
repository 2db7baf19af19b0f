"""Packer invariants (hypothesis), alignment convention, masks and normalisers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlvr.algorithms.packing import (
    PackInput,
    assign_rows_to_ranks,
    block_causal_mask,
    build_packed_batches,
    first_fit_decreasing,
    pack_inputs_from_groups,
    pack_step,
    packing_efficiency,
)
from rlvr.types import Group, Sample


def _inputs(lengths: list[tuple[int, int]], in_loss: list[bool] | None = None) -> list[PackInput]:
    flags = in_loss or [True] * len(lengths)
    return [
        PackInput(i, [100 + i] * p, [200 + i] * c, [-0.01 * (j + 1) for j in range(c)], float(i + 1), f)
        for i, ((p, c), f) in enumerate(zip(lengths, flags))
    ]


def test_alignment_convention_hand() -> None:
    batch = build_packed_batches(_inputs([(2, 3), (1, 1)]), pack_length=8)[0]
    (mb,) = batch.micro_batches
    assert mb.input_ids.tolist() == [[100, 100, 200, 200, 200, 101, 201]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1]]
    assert mb.loss_mask.tolist() == [[False, False, True, True, True, False, True]]
    assert mb.advantages.tolist() == [[0, 0, 1, 1, 1, 0, 2]]
    torch.testing.assert_close(mb.engine_logprobs, torch.tensor([[0, 0, -0.01, -0.02, -0.03, 0, -0.01]]))
    assert mb.sample_ids.tolist() == [[0, 0, 0, 0, 0, 1, 1]]
    assert mb.cu_seqlens == [[0, 5, 7]]
    assert batch.global_num_loss_tokens == 4 and batch.global_num_samples == 2


def test_padding_segment_and_masked_samples() -> None:
    batches = build_packed_batches(
        _inputs([(2, 3), (1, 1), (3, 2)], [True, False, True]), pack_length=7, micro_batch_rows=2
    )
    (mb,) = batches[0].micro_batches
    assert mb.input_ids.shape == (2, 7)
    assert mb.position_ids[1].tolist() == [0, 1, 2, 3, 4, 0, 1]  # padding restarts as its own segment
    assert mb.cu_seqlens == [[0, 5, 7], [0, 5, 7]]
    assert mb.sample_ids[1, -1] == -1 and not mb.loss_mask[1, -1]
    assert batches[0].global_num_samples == 2  # the masked sample does not count
    assert batches[0].global_num_loss_tokens == 5


def test_empty_prompt_first_token_not_in_loss() -> None:
    (mb,) = build_packed_batches(_inputs([(0, 3)]), pack_length=4)[0].micro_batches
    assert mb.loss_mask.tolist() == [[False, True, True]]


def test_errors() -> None:
    with pytest.raises(ValueError, match="pack_length 4"):
        build_packed_batches(_inputs([(3, 2)]), pack_length=4)
    bad = [PackInput(0, [1], [2, 3], [-0.1], 1.0)]
    with pytest.raises(ValueError, match="logprobs"):
        build_packed_batches(bad, pack_length=8)
    with pytest.raises(ValueError, match="unique"):
        build_packed_batches(_inputs([(1, 1)]) * 2, pack_length=8)


def test_block_causal_mask_matches_loop() -> None:
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 1], [0, 1, 2, 3, 4, 5, 6, 7]])
    mask = block_causal_mask(pos)
    for b in range(2):
        seg, s = [], -1
        for p in pos[b].tolist():
            s += p == 0
            seg.append(s)
        for i in range(8):
            for j in range(8):
                assert bool(mask[b, 0, i, j]) == (j <= i and seg[i] == seg[j])
    additive = block_causal_mask(pos, dtype=torch.float32)
    assert additive.dtype == torch.float32 and additive[0, 0, 3, 2] == torch.finfo(torch.float32).min
    assert additive[0, 0, 2, 1] == 0


def test_dummy_micro_batches_equalise_ranks() -> None:
    batches = build_packed_batches(_inputs([(2, 2)] * 3), pack_length=4, num_ranks=4)
    assert [len(b.micro_batches) for b in batches] == [1, 1, 1, 1]
    dummy = batches[3].micro_batches[0]
    assert not dummy.loss_mask.any() and (dummy.sample_ids == -1).all() and dummy.num_samples == 0
    assert all(b.global_num_loss_tokens == 6 and b.global_num_samples == 3 for b in batches)


def test_pack_inputs_from_groups() -> None:
    samples = [Sample("p", i, [1, 2], [3], "x", [-0.5], "stop", 0, 0) for i in range(2)]
    group = Group("p", samples, advantages=[1.0, -1.0], loss_masks=[True, False])
    inputs = pack_inputs_from_groups([group, group])
    assert [i.sample_id for i in inputs] == [0, 1, 2, 3]
    assert [i.in_loss for i in inputs] == [True, False, True, False]
    with pytest.raises(ValueError, match="advantages"):
        pack_inputs_from_groups([Group("q", samples)])


def test_pack_step_splits_mini_batches_and_reduces_all_their_metrics() -> None:
    groups = [
        Group(
            f"p{g}",
            [Sample(f"p{g}", i, [1, 2], [3] * (g + 1), "x", [-0.5] * (g + 1), "stop", 0, 0) for i in range(2)],
            advantages=[1.0, -1.0],
        )
        for g in range(3)
    ]
    per_rank, m = pack_step(groups, num_mini_batches=2, pack_length=8, num_ranks=2)
    assert [len(r) for r in per_rank] == [2, 2]  # one PackedBatch per (rank, mini-batch)
    ids = [set(mb.sample_ids[mb.sample_ids >= 0].tolist()) for r in per_rank for pb in r for mb in pb.micro_batches]
    assert set().union(*ids) == set(range(6))  # unique over the step
    mini = [
        build_packed_batches(pack_inputs_from_groups(groups[j::2]), pack_length=8, num_ranks=2)[0].metrics
        for j in range(2)
    ]
    assert m["perf/num_packed_rows"] == sum(x["perf/num_packed_rows"] for x in mini)  # every mini-batch, not the last
    assert m["perf/micro_batches_per_rank"] == sum(x["perf/micro_batches_per_rank"] for x in mini)
    assert m["perf/rank_token_imbalance"] == max(x["perf/rank_token_imbalance"] for x in mini)


def test_efficiency() -> None:
    assert packing_efficiency(6, 2, 4) == 0.75 and packing_efficiency(0, 0, 4) == 0.0


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.tuples(st.integers(1, 20), st.integers(0, 20)), min_size=1, max_size=40),
    pack_length=st.integers(40, 90),
    num_ranks=st.integers(1, 4),
    micro_batch_rows=st.integers(1, 3),
    pad_multiple=st.sampled_from([1, 8]),
)
def test_packer_invariants(
    lengths: list[tuple[int, int]], pack_length: int, num_ranks: int, micro_batch_rows: int, pad_multiple: int
) -> None:
    inputs = _inputs(lengths)
    batches = build_packed_batches(
        inputs,
        pack_length=pack_length,
        num_ranks=num_ranks,
        micro_batch_rows=micro_batch_rows,
        pad_multiple=pad_multiple,
    )
    assert len(batches) == num_ranks
    assert len({len(b.micro_batches) for b in batches}) == 1  # same micro-batch count on every rank
    token_count: dict[int, int] = {}
    rank_tokens, rank_rows, row_lengths = [], [], []
    for batch in batches:
        tokens = rows = 0
        for mb in batch.micro_batches:
            assert mb.input_ids.shape[1] <= pack_length and mb.input_ids.shape[0] <= micro_batch_rows
            for r in range(mb.input_ids.shape[0]):
                real = int((mb.sample_ids[r] >= 0).sum())
                if real:
                    rows += 1
                    row_lengths.append(real)
                tokens += real
                # every sample occupies one contiguous run with positions 0..n-1
                for sid in mb.sample_ids[r].unique().tolist():
                    if sid >= 0:
                        where = (mb.sample_ids[r] == sid).nonzero().flatten()
                        assert where.tolist() == list(range(int(where[0]), int(where[-1]) + 1))
                        assert mb.position_ids[r, where].tolist() == list(range(len(where)))
                        token_count[sid] = token_count.get(sid, 0) + len(where)
                assert mb.cu_seqlens[r][-1] == mb.input_ids.shape[1]
        rank_tokens.append(tokens)
        rank_rows.append(rows)
    # nothing dropped or duplicated
    assert token_count == {i.sample_id: i.num_tokens for i in inputs}
    assert max(rank_rows) - min(rank_rows) <= 1
    assert max(rank_tokens) - min(rank_tokens) <= max(row_lengths)  # balance within one row
    assert batches[0].global_num_loss_tokens == sum(max(c, 0) if p else max(c - 1, 0) for p, c in lengths)
    assert sum(int(mb.loss_mask.sum()) for b in batches for mb in b.micro_batches) == batches[0].global_num_loss_tokens


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), min_size=0, max_size=60), pack_length=st.integers(50, 120))
def test_ffd_properties(lengths: list[int], pack_length: int) -> None:
    bins = first_fit_decreasing(lengths, pack_length)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    sums = [sum(lengths[i] for i in b) for b in bins]
    assert all(s <= pack_length for s in sums)
    # first fit: no two bins could be merged (so at most one bin is at most half full)
    assert all(sums[i] + sums[j] > pack_length for i in range(len(bins)) for j in range(i + 1, len(bins)))
    ranks = assign_rows_to_ranks(sums, 3)
    assert sorted(r for rows in ranks for r in rows) == list(range(len(bins)))
