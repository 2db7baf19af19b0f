"""packed_logprobs on a tiny random Qwen2: packed rows equal samples run one by one (varlen and mask paths)."""

from __future__ import annotations

import pytest
import torch
import transformers

from rlvr.algorithms.entropy import entropy_from_logits
from rlvr.algorithms.packing import PackInput, build_packed_batches
from rlvr.learner.logprobs import packed_logprobs


def _model(impl: str) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=64)
    config._attn_implementation = impl
    return transformers.Qwen2ForCausalLM(config).double().eval()


def _batch() -> tuple[list[PackInput], torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    inputs = []
    for i in range(7):
        prompt = torch.randint(0, 64, (2 + i % 3,), generator=g).tolist()
        completion = torch.randint(0, 64, (1 + (3 * i) % 7,), generator=g).tolist()
        inputs.append(PackInput(i, prompt, completion, [0.0] * len(completion), 1.0))
    (mb,) = build_packed_batches(inputs, pack_length=20, micro_batch_rows=8)[0].micro_batches
    assert mb.input_ids.shape[0] >= 2 and int((mb.position_ids == 0).sum()) > mb.input_ids.shape[0]
    return inputs, mb.input_ids, mb.position_ids, mb.sample_ids


def _one_by_one(model: transformers.PreTrainedModel, ids: list[int], temperature: float) -> tuple[torch.Tensor, ...]:
    logits = model(torch.tensor([ids])).logits[0, :-1] / temperature
    lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return lp, entropy_from_logits(logits)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("attention", ["varlen", "mask"])
def test_packed_equals_one_by_one(impl: str, attention: str) -> None:
    model = _model(impl)
    inputs, ids, pos, sids = _batch()
    with torch.no_grad():
        lp, ent = packed_logprobs(model, ids, pos, temperature=0.7, attention=attention, chunk_size=3,
                                  return_entropy=True)
    # eager attention runs its softmax in fp32 even for an fp64 model, hence 1e-6 rather than 1e-12
    tol = 1e-12 if impl == "sdpa" else 1e-6
    for item in inputs:
        expected_lp, expected_ent = _one_by_one(model, list(item.prompt_token_ids) + list(item.completion_token_ids), 0.7)
        where = sids == item.sample_id
        got_lp, got_ent = lp[where], ent[where]
        assert got_lp[0] == 0.0 and got_ent[0] == 0.0  # a sample's first token is predicted by nothing
        torch.testing.assert_close(got_lp[1:], expected_lp, rtol=0, atol=tol)
        torch.testing.assert_close(got_ent[1:], expected_ent, rtol=0, atol=tol)


def test_without_position_restarts_attention_leaks() -> None:
    """Sanity check of the test itself: packing without restarting position ids changes the log-probs."""
    model = _model("sdpa")
    _, ids, pos, _ = _batch()
    naive_pos = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        good, _ = packed_logprobs(model, ids, pos)
        bad, _ = packed_logprobs(model, ids, naive_pos)
    later = pos > 0
    assert not torch.allclose(good[later], bad[later])


def test_gradients_match_one_by_one() -> None:
    model = _model("sdpa")
    inputs, ids, pos, sids = _batch()
    lp, _ = packed_logprobs(model, ids, pos, chunk_size=4, attention="varlen")  # checkpointed chunks
    lp[sids >= 0].sum().backward()
    packed = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    total = sum(_one_by_one(model, list(i.prompt_token_ids) + list(i.completion_token_ids), 1.0)[0].sum()
                for i in inputs)
    total.backward()
    for a, p in zip(packed, model.parameters()):
        torch.testing.assert_close(a, p.grad, rtol=1e-9, atol=1e-12)


def test_entropy_grad_flag_and_errors() -> None:
    model = _model("sdpa")
    _, ids, pos, _ = _batch()
    _, ent = packed_logprobs(model, ids, pos, return_entropy=True)
    assert ent is not None and not ent.requires_grad
    _, ent = packed_logprobs(model, ids, pos, return_entropy=True, entropy_requires_grad=True)
    assert ent is not None and ent.requires_grad
    with pytest.raises(ValueError, match="attention"):
        packed_logprobs(model, ids, pos, attention="flex")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        packed_logprobs(model, ids[0], pos[0])
