"""Pure token-selection and stop rules (rlvr.rollout.sampling), hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.rollout.sampling import check_finish, filter_top_k_top_p, sample_rows, validate_params
from rlvr.types import SamplingParams

NEG_INF = float("-inf")


def test_top_k_and_top_p_filtering() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    assert filter_top_k_top_p(logits, top_k=2, top_p=1.0).isinf().tolist() == [False, False, True, True]
    # Mass before each token: 0, 0.5, 0.8, 0.95 -> top_p 0.6 keeps the first two, 0.85 the first three.
    assert filter_top_k_top_p(logits, top_k=0, top_p=0.6).isinf().tolist() == [False, False, True, True]
    assert filter_top_k_top_p(logits, top_k=0, top_p=0.85).isinf().tolist() == [False, False, False, True]
    assert filter_top_k_top_p(logits, top_k=0, top_p=0.01).isinf().tolist() == [False, True, True, True]
    shuffled = logits[[2, 0, 3, 1]]
    assert filter_top_k_top_p(shuffled, top_k=0, top_p=0.6).isinf().tolist() == [True, False, True, False]


def test_sample_rows_records_unfiltered_tempered_logprobs() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 3.0, 0.0, 0.0]])
    params = [SamplingParams(temperature=0.5, top_k=1), SamplingParams(temperature=0.0)]
    gens = [torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)]
    tokens, logprobs = sample_rows(logits, params, gens)
    assert tokens == [0, 1]
    row0 = logits[0] / 0.5
    assert logprobs[0] == pytest.approx(float(row0[0] - row0.logsumexp(0)), abs=1e-6)  # not 0: before top-k
    assert logprobs[1] == pytest.approx(3.0 - math.log(math.exp(3.0) + 3.0), abs=1e-6)  # greedy: temperature 1


def test_check_finish_order() -> None:
    decode = lambda ids: "".join(chr(ord("a") + i) for i in ids)  # noqa: E731
    params = SamplingParams(max_new_tokens=3, stop_strings=["cd"])
    assert check_finish([0], params, {9}, decode) is None
    assert check_finish([0, 9], params, {9}, decode) == "stop"
    assert check_finish([2, 3], params, set(), decode) == "stop"
    assert check_finish([0, 1, 2], params, set(), decode) == "length"
    assert check_finish([0], params, set(), decode, at_position_limit=True) == "length"
    with pytest.raises(ValueError, match="top_p"):
        validate_params(SamplingParams(top_p=0.0))
