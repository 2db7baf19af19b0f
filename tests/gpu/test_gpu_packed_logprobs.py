"""(d) Packed vs unpacked learner log-probs on a GPU: bf16; transformers' sdpa (position-id varlen and explicit
mask paths) and rlvr's torch_varlen (torch's flash varlen kernel); fused head vs autograd head gradients."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _model(impl: str):
    import torch
    import transformers

    from rlvr.learner import attention

    attention.register()
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=512,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
    )
    config._attn_implementation = impl
    return transformers.Qwen2ForCausalLM(config).to("cuda", torch.bfloat16).eval()


def _micro_batch():
    import torch

    from rlvr.algorithms.packing import PackInput, build_packed_batches

    g = torch.Generator().manual_seed(1)
    inputs = []
    for i in range(12):
        prompt = torch.randint(0, 512, (5 + i % 7,), generator=g).tolist()
        completion = torch.randint(0, 512, (3 + (5 * i) % 23,), generator=g).tolist()
        inputs.append(PackInput(i, prompt, completion, [0.0] * len(completion), 1.0))
    (mb,) = build_packed_batches(inputs, pack_length=96, micro_batch_rows=8)[0].micro_batches
    assert int((mb.position_ids == 0).sum()) > mb.input_ids.shape[0], "rows must hold several samples"
    return inputs, mb


@pytest.mark.parametrize(("impl", "attention"), [("sdpa", "varlen"), ("sdpa", "mask"), ("torch_varlen", "varlen")])
def test_packed_equals_one_by_one_on_gpu(impl: str, attention: str, gpus) -> None:
    gpus(1, vllm=False)
    import torch

    from rlvr.learner.logprobs import packed_logprobs

    model = _model(impl)
    inputs, mb = _micro_batch()
    with torch.no_grad():
        lp, _ = packed_logprobs(
            model, mb.input_ids.cuda(), mb.position_ids.cuda(), temperature=0.8, attention=attention, chunk_size=32
        )
        diffs = []
        for item in inputs:
            ids = torch.tensor([list(item.prompt_token_ids) + list(item.completion_token_ids)], device="cuda")
            pos = torch.arange(ids.shape[1], device="cuda").unsqueeze(0)
            ref, _ = packed_logprobs(model, ids, pos, temperature=0.8, attention="varlen")
            got = lp[mb.sample_ids.cuda() == item.sample_id]
            assert got.shape == ref[0].shape
            diffs.append((got - ref[0]).abs())
    d = torch.cat(diffs)
    print(
        f"packed vs one-by-one ({impl}/{attention}, bf16): mean abs diff {d.mean().item():.2e}, "
        f"max {d.max().item():.2e}"
    )
    assert d.mean().item() < 1e-2 and d.max().item() < 1e-1  # bf16 kernels on different shapes


def test_fast_path_gradients_match_reference_on_gpu(gpus) -> None:
    """torch_varlen attention + fused head vs sdpa block mask + autograd head: same log-probs and gradients (bf16)."""
    gpus(1, vllm=False)
    import torch

    from rlvr.learner.logprobs import packed_logprobs

    _, mb = _micro_batch()
    ids, pos = mb.input_ids.cuda(), mb.position_ids.cuda()
    grads, lps = [], []
    for impl, attention, fused in (("sdpa", "mask", False), ("torch_varlen", "varlen", True)):
        model = _model(impl).train()
        lp, _ = packed_logprobs(model, ids, pos, temperature=0.8, attention=attention, chunk_size=32, fused=fused)
        weights = torch.linspace(-1.0, 1.0, lp.numel(), device="cuda").reshape(lp.shape)
        (lp * weights).sum().backward()
        grads.append(torch.cat([p.grad.float().flatten() for p in model.parameters()]))
        lps.append(lp.detach())
    cos = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0).item()
    rel = ((grads[0] - grads[1]).norm() / grads[0].norm()).item()
    d = (lps[0] - lps[1]).abs()
    print(
        f"fast path vs reference (bf16): logprob mean abs diff {d.mean().item():.2e}, grad cosine {cos:.5f}, "
        f"grad rel err {rel:.2e}"
    )
    assert d.mean().item() < 1e-2 and cos > 0.99 and rel < 0.1
