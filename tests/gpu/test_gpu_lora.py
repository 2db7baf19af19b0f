"""LoRA on GPU (issue 20): rlvr's learner (peft, bf16 base) on one GPU and a vLLM engine with LoRA on, in its own
process on the same GPU. After a sync that carries only the adapter, vLLM's log-probs match the learner's and
differ from before; an adapter update while requests run lands in flight (the same stamps as full weights).

Skips cleanly without CUDA or vllm (tests/gpu/conftest.py)."""

from __future__ import annotations

import json
import time
import traceback
from typing import Any

import pytest
from gpu_helpers import Proc, _pin, _serve, build_tiny_dir, copy_pairs, engine_proc, make_cfg

pytestmark = pytest.mark.gpu

RANK, LONG = 8, 1500


def _lora_cfg(max_new_tokens: int = 32) -> Any:
    cfg = make_cfg(max_new_tokens=max_new_tokens, gpu_memory_utilization=0.3)
    cfg.learner.lora_rank, cfg.learner.lora_alpha = RANK, 16
    cfg.learner.backend = "torch"
    cfg.model.dtype = "bfloat16"
    return cfg


class _LoraLearner:
    """rlvr's LearnerWorker with LoRA on this process's GPU; the adapter is set to random values (a trained one)."""

    def __init__(self, model_dir: str) -> None:
        import torch

        from rlvr.learner.worker import LearnerWorker

        self.w = LearnerWorker(_lora_cfg(), model_dir, 0, 1, "127.0.0.1", 0, "cuda")
        self.g = torch.Generator().manual_seed(0)

    def perturb(self, scale: float = 0.05) -> int:
        import torch

        with torch.no_grad():
            for name, p in self.w.model.named_parameters():
                if ".lora_B." in name:
                    p.copy_(torch.randn(p.shape, generator=self.g) * scale)
        return sum(1 for _ in self.w.named_weights())

    def named_weights(self) -> list:
        return [(n, t.cpu()) for n, t in self.w.named_weights()]  # CPU tensors: what the gloo group delivers

    def scores(self, pairs: list) -> list:
        return [self.w.score(p, c) for p, c in pairs]

    def full_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.w.model.get_base_model().parameters())


def _learner_main(conn: Any, gpu: str, model_dir: str) -> None:
    _pin(gpu)
    try:
        learner = _LoraLearner(model_dir)
    except BaseException:
        conn.send(("err", traceback.format_exc()))
        return
    conn.send(("ok", None))
    _serve(conn, learner, {})


def _diffs(a: list, b: list) -> tuple[float, float]:
    flat = [abs(x - y) for u, v in zip(a, b, strict=True) for x, y in zip(u, v, strict=True)]
    return sum(flat) / len(flat), max(flat)


@pytest.fixture(scope="module")
def lora_pair(tmp_path_factory, gpus):
    gpus(1)
    from transformers import AutoTokenizer

    model_dir = build_tiny_dir(tmp_path_factory.mktemp("tiny"))
    learner = Proc(_learner_main, (("0"), model_dir))
    engine = None
    try:
        engine = engine_proc("0", model_dir, _lora_cfg(LONG), ignore_eos=True)
        yield learner, engine, AutoTokenizer.from_pretrained(model_dir)
    finally:
        if engine is not None:
            engine.close()
        learner.close()


def test_adapter_sync_engine_matches_learner(lora_pair) -> None:
    learner, engine, tok = lora_pair
    pairs = copy_pairs(tok, 8)
    before = [engine.call("score", p, c) for p, c in pairs]
    learner.call("perturb")
    named = learner.call("named_weights")
    assert named and all(".lora_A." in n or ".lora_B." in n for n, _ in named)
    sent_bytes = sum(t.numel() * t.element_size() for _, t in named)
    t0 = time.perf_counter()
    engine.call("load_adapter", named, 1)
    load_s = time.perf_counter() - t0
    assert engine.call("policy_version") == 1
    want = learner.call("scores", pairs)
    after = [engine.call("score", p, c) for p, c in pairs]
    mean_after, max_after = _diffs(after, want)
    mean_before, _ = _diffs(before, want)
    print(
        json.dumps(
            {
                "check": "lora sync: vLLM score vs learner",
                "adapter_bytes": sent_bytes,
                "full_bytes": learner.call("full_bytes"),
                "engine_load_s": round(load_s, 4),
                "mean_abs_diff_after": round(mean_after, 5),
                "max_abs_diff_after": round(max_after, 5),
                "mean_abs_diff_before": round(mean_before, 5),
            }
        ),
        flush=True,
    )
    assert sent_bytes < learner.call("full_bytes") / 5
    assert mean_after < 0.05 and max_after < 0.5  # bf16: HF sdpa + peft vs vLLM's kernels + punica LoRA
    assert mean_before > 5 * mean_after


def test_adapter_update_while_requests_run(lora_pair) -> None:
    from rlvr.types import PromptRequest, SamplingParams

    learner, engine, tok = lora_pair
    version = engine.call("policy_version")
    pairs = copy_pairs(tok, 4)
    engine.call(
        "submit",
        [
            PromptRequest(f"long{i}", p, 2, SamplingParams(max_new_tokens=LONG, seed=i))
            for i, (p, _) in enumerate(pairs)
        ],
    )
    deadline = time.monotonic() + 60
    while engine.call("stats")["inflight_samples"] < 8:
        assert time.monotonic() < deadline, "requests never started"
        time.sleep(0.05)
    time.sleep(0.2)
    learner.call("perturb")
    engine.call("load_adapter", learner.call("named_weights"), version + 1)
    samples, deadline = [], time.monotonic() + 120
    while len(samples) < 8:
        assert time.monotonic() < deadline, f"only {len(samples)} of 8 samples finished"
        samples += engine.call("poll")
        time.sleep(0.1)
    assert all(s.finish_reason == "length" and len(s.completion_token_ids) == LONG for s in samples)
    assert all(s.version_start == version for s in samples)
    assert all(s.version_end == version + 1 for s in samples), "requests finished before the update landed"
