"""packed_logprobs on a tiny random Qwen2: packed rows equal samples run one by one (varlen and mask paths,
transformers' sdpa/eager and rlvr's torch_varlen attention, fused and autograd heads), values and gradients."""

from __future__ import annotations

import pytest
import torch
import transformers

from rlvr.algorithms.entropy import entropy_from_logits
from rlvr.algorithms.packing import PackInput, build_packed_batches
from rlvr.learner import attention
from rlvr.learner.fused_head import LinearLogprob, fusable
from rlvr.learner.logprobs import packed_logprobs


def _model(impl: str, tied: bool = False) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    attention.register()
    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        tie_word_embeddings=tied,
    )
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


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(
    ("impl", "path"),
    [("sdpa", "varlen"), ("sdpa", "mask"), ("eager", "varlen"), ("eager", "mask"), ("torch_varlen", "varlen")],
)
def test_packed_equals_one_by_one(impl: str, path: str, fused: bool) -> None:
    model = _model(impl)
    inputs, ids, pos, sids = _batch()
    with torch.no_grad():
        lp, ent = packed_logprobs(
            model,
            ids,
            pos,
            temperature=0.7,
            attention=path,
            chunk_size=3,  # type: ignore[arg-type]
            return_entropy=True,
            fused=fused,
        )
    # eager attention runs its softmax in fp32 even for an fp64 model, hence 1e-6 rather than 1e-12
    tol = 1e-12 if impl == "sdpa" else 1e-6
    for item in inputs:
        expected_lp, expected_ent = _one_by_one(
            model, list(item.prompt_token_ids) + list(item.completion_token_ids), 0.7
        )
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


@pytest.mark.parametrize(
    ("impl", "fused", "tied"),
    [("sdpa", False, False), ("sdpa", True, False), ("sdpa", True, True), ("torch_varlen", True, True)],
)
def test_gradients_match_one_by_one(impl: str, fused: bool, tied: bool) -> None:
    model = _model(impl, tied)
    assert fusable(model.get_output_embeddings())
    inputs, ids, pos, sids = _batch()
    lp, _ = packed_logprobs(model, ids, pos, chunk_size=4, attention="varlen", fused=fused)
    weights = torch.linspace(-1.0, 2.0, lp.numel(), dtype=lp.dtype).reshape(lp.shape)  # per-token upstream grads
    (lp * weights)[sids >= 0].sum().backward()
    packed = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    total = 0.0
    for i in inputs:
        where = sids == i.sample_id
        lp1 = _one_by_one(model, list(i.prompt_token_ids) + list(i.completion_token_ids), 1.0)[0]
        total = total + (lp1 * weights[where][1:]).sum()
    total.backward()  # type: ignore[union-attr]
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


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_fused_head_matches_autograd_reference(chunk: int) -> None:
    """LinearLogprob's closed-form gradient == autograd through log_softmax (hidden and weight), any chunking."""
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(13, 8, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 8, dtype=torch.float64, generator=g, requires_grad=True)
    targets = torch.randint(0, 11, (13,), generator=g)
    upstream = torch.randn(13, dtype=torch.float64, generator=g)
    lp, ent = LinearLogprob.apply(hidden, weight, targets, 0.6, chunk)
    (lp * upstream).sum().backward()
    got = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    logp = torch.log_softmax(hidden @ weight.T / 0.6, -1)
    ref_lp = logp.gather(-1, targets[:, None])[:, 0]
    (ref_lp * upstream).sum().backward()
    torch.testing.assert_close(lp, ref_lp.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, -(logp.exp() * logp).sum(-1).detach(), rtol=0, atol=1e-12)
    assert not ent.requires_grad
    torch.testing.assert_close(got[0], hidden.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(got[1], weight.grad, rtol=0, atol=1e-12)


def test_fused_head_falls_back_for_entropy_grad_and_bias() -> None:
    assert not fusable(torch.nn.Linear(4, 5, bias=True))
    model = _model("sdpa")
    _, ids, pos, _ = _batch()
    _, ent = packed_logprobs(model, ids, pos, return_entropy=True, entropy_requires_grad=True, fused=True)
    assert ent is not None and ent.requires_grad  # the entropy bonus needs the autograd path


def test_varlen_metadata_segments() -> None:
    pos = torch.tensor([[0, 1, 2, 0, 1, 0], [3, 4, 0, 1, 2, 3]])  # row 2 starts mid-count: still a new segment
    meta = attention.varlen_metadata(pos)
    assert meta["cu_seq_lens_q"].tolist() == [0, 3, 5, 6, 8, 12] and meta["max_length_q"] == 4
    assert meta["cu_seq_lens_q"].dtype == torch.int32 and meta["cu_seq_lens_k"] is meta["cu_seq_lens_q"]


def test_torch_varlen_errors_and_plain_batches() -> None:
    q = torch.randn(2, 4, 3, 8)
    meta = attention.varlen_metadata(torch.tensor([[0, 1, 2, 0, 1, 2]]))
    with pytest.raises(ValueError, match="batch 1"):
        attention.varlen_attention_forward(torch.nn.Module(), q, q, q, None, **meta)
    with pytest.raises(ValueError, match="padding masks"):
        attention.varlen_attention_forward(torch.nn.Module(), q, q, q, torch.ones(2, 1, 3, 3, dtype=torch.bool))
    # without cu_seqlens each row is one causal sequence (the reference model calls in the tests above rely on it)
    out, _ = attention.varlen_attention_forward(torch.nn.Module(), q, q, q, None)
    ref = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2)
    torch.testing.assert_close(out, ref)


def test_compiled_layers_and_head_match_eager(monkeypatch) -> None:
    """learner.compile's plumbing (regional layer compile with dynamic shapes + compiled head kernels): same
    log-probs and gradients as eager. aot_eager runs the same graphs without needing a C++/Triton toolchain."""
    from rlvr.learner import fused_head
    from rlvr.learner.model import compile_for_training

    monkeypatch.setattr(fused_head, "_kernels", dict(fused_head._kernels))
    inputs, ids, pos, sids = _batch()
    results = []
    for compiled in (False, True):
        model = _model("torch_varlen", tied=True).train()
        if compiled:
            assert compile_for_training(model, backend="aot_eager") == 2
        lp, _ = packed_logprobs(model, ids, pos, chunk_size=4)
        lp.sum().backward()
        results.append((lp.detach(), [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=0, atol=1e-12)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


def test_auto_attention_resolution() -> None:
    from rlvr.learner.model import resolve_attn_implementation

    assert resolve_attn_implementation("auto", "cpu") == "sdpa"
    assert resolve_attn_implementation("eager", "cuda") == "eager"
    assert resolve_attn_implementation("auto", "cuda", "mask") == "sdpa"  # explicit masks need a mask-taking kernel
    # flash kernels refuse float32 ("FlashAttention only support fp16 and bf16"): auto falls back to sdpa
    assert resolve_attn_implementation("auto", "cuda", "auto", torch.float32) == "sdpa"


@pytest.mark.parametrize("entropy", [False, True])
def test_extra_head_calls_change_nothing_but_the_call_count(entropy: bool) -> None:
    """`head_calls` (ZeRO-3 ranks agreeing on one count): the head runs exactly that often, in forward and in the
    checkpointed recompute, and the log-probs, entropies and gradients are the chunked path's own."""
    from rlvr.learner.logprobs import head_chunks

    model = _model("sdpa")
    head = model.get_output_embeddings()
    _, ids, pos, sids = _batch()
    calls = []
    hook = head.register_forward_hook(lambda *_: calls.append(1))

    def run(head_calls: int | None) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor], int]:
        model.zero_grad()
        calls.clear()
        lp, ent = packed_logprobs(
            model, ids, pos, chunk_size=4, fused=False, head_calls=head_calls, return_entropy=entropy
        )
        lp[sids >= 0].sum().backward()
        return (
            lp.detach(),
            None if ent is None else ent.detach(),
            [p.grad.clone() for p in model.parameters()],
            len(calls),
        )

    need = head_chunks(ids.shape[1] - 1, 4)
    lp0, ent0, grads0, calls0 = run(None)
    lp1, ent1, grads1, calls1 = run(need + 3)
    hook.remove()
    assert calls0 == 2 * need and calls1 == 2 * (need + 3)  # forward + recompute in backward, per chunk
    torch.testing.assert_close(lp1, lp0, rtol=0, atol=0)
    if entropy:
        torch.testing.assert_close(ent1, ent0, rtol=0, atol=0)
    for a, b in zip(grads1, grads0):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="head_calls"):
        packed_logprobs(model, ids, pos, chunk_size=4, fused=False, head_calls=need - 1)
