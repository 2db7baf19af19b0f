"""The sampled tokens' log-probs read from vLLM's output in both of its layouts: the flat one rlvr asks for
(`SamplingParams(flat_logprobs=True)`: parallel lists, the sampled token first in each position's range) and the
list of `{token_id: Logprob}` dicts. vLLM's own `FlatLogprobs` class is used where vllm is installed (GPU hosts);
a stand-in with the same fields elsewhere."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from rlvr.rollout.vllm_engine import sampled_logprobs


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class Flat:  # the fields of vllm.logprobs.FlatLogprobs
    start_indices: list[int] = field(default_factory=list)
    end_indices: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def __getitem__(self, i: int) -> dict[int, Logprob]:
        s, e = self.start_indices[i], self.end_indices[i]
        return {self.token_ids[k]: Logprob(self.logprobs[k]) for k in range(s, e)}


def _flat(positions: list[list[tuple[int, float]]]) -> Flat:
    f = Flat()
    for pos in positions:
        f.start_indices.append(len(f.token_ids))
        for t, lp in pos:
            f.token_ids.append(t)
            f.logprobs.append(lp)
        f.end_indices.append(len(f.token_ids))
    return f


def test_flat_and_dict_layouts_give_the_same_logprobs() -> None:
    tokens = [5, 9, 5]
    positions = [[(5, -0.1)], [(9, -2.5), (3, -0.2)], [(7, -0.3), (5, -1.25)]]  # sampled first, or later in range
    dicts = [{t: Logprob(lp) for t, lp in pos} for pos in positions]
    assert sampled_logprobs(dicts, tokens) == [-0.1, -2.5, -1.25]
    assert sampled_logprobs(_flat(positions), tokens) == [-0.1, -2.5, -1.25]


def test_a_missing_token_is_an_error_in_both_layouts() -> None:
    with pytest.raises(KeyError):
        sampled_logprobs([{1: Logprob(-0.5)}], [2])
    with pytest.raises(KeyError):
        sampled_logprobs(_flat([[(1, -0.5)]]), [2])


def test_vllms_own_flat_logprobs() -> None:
    mod: Any = pytest.importorskip("vllm.logprobs")
    flat = mod.create_sample_logprobs(True)
    for t, lp in [(5, -0.1), (9, -2.5), (5, -1.25)]:
        flat.append({t: mod.Logprob(logprob=lp, rank=1, decoded_token=None)})
    assert sampled_logprobs(flat, [5, 9, 5]) == [-0.1, -2.5, -1.25]
