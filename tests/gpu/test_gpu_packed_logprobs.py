"""(d) Packed vs unpacked learner log-probs on a GPU: bf16, torch's sdpa kernels, both packing paths."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("attention", ["varlen", "mask"])
def test_packed_equals_one_by_one_on_gpu(attention: str, gpus) -> None:
    gpus(1, vllm=False)
    import torch
    import transformers

    from rlvr.algorithms.packing import PackInput, build_packed_batches
    from rlvr.learner.logprobs import packed_logprobs

    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=512, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=512)
    config._attn_implementation = "sdpa"
    model = transformers.Qwen2ForCausalLM(config).to("cuda", torch.bfloat16).eval()
    g = torch.Generator().manual_seed(1)
    inputs = []
    for i in range(12):
        prompt = torch.randint(0, 512, (5 + i % 7,), generator=g).tolist()
        completion = torch.randint(0, 512, (3 + (5 * i) % 23,), generator=g).tolist()
        inputs.append(PackInput(i, prompt, completion, [0.0] * len(completion), 1.0))
    (mb,) = build_packed_batches(inputs, pack_length=96, micro_batch_rows=8)[0].micro_batches
    assert int((mb.position_ids == 0).sum()) > mb.input_ids.shape[0], "rows must hold several samples"
    with torch.no_grad():
        lp, _ = packed_logprobs(model, mb.input_ids.cuda(), mb.position_ids.cuda(), temperature=0.8,
                                attention=attention, chunk_size=32)
        diffs = []
        for item in inputs:
            ids = torch.tensor([list(item.prompt_token_ids) + list(item.completion_token_ids)], device="cuda")
            pos = torch.arange(ids.shape[1], device="cuda").unsqueeze(0)
            ref, _ = packed_logprobs(model, ids, pos, temperature=0.8, attention="varlen")
            got = lp[mb.sample_ids.cuda() == item.sample_id]
            assert got.shape == ref[0].shape
            diffs.append((got - ref[0]).abs())
    d = torch.cat(diffs)
    print(f"packed vs one-by-one ({attention}, bf16 sdpa): mean abs diff {d.mean().item():.2e}, max {d.max().item():.2e}")
    assert d.mean().item() < 1e-2 and d.max().item() < 1e-1  # bf16 kernels on different shapes
