"""(b) After a weight sync the engine's log-probs match the learner's for the same (SFT-trained) weights and
differ from before; (c) an update while requests run completes them with the new version stamped.

NCCL: the trainer (learner stand-in) on GPU 0, the vLLM engine on GPU 1. CUDA IPC: both on GPU 0, the
engine asleep while the trainer trains (colocated mode). Each side is its own process (gpu_helpers.py)."""

from __future__ import annotations

import json
import time

import pytest
from gpu_helpers import build_tiny_dir, copy_pairs, engine_proc, make_cfg, trainer_proc

from rlvr.launch.local_cluster import free_port

pytestmark = pytest.mark.gpu

LONG = 1900  # tokens per completion in the in-flight test (ignore_eos): seconds of decoding


def _diffs(a: list[list[float]], b: list[list[float]]) -> tuple[float, float]:
    flat = [abs(x - y) for u, v in zip(a, b, strict=True) for x, y in zip(u, v, strict=True)]
    return sum(flat) / len(flat), max(flat)


def _report(what: str, **figures: float) -> None:
    print(json.dumps({"check": what, **{k: round(v, 5) for k, v in figures.items()}}), flush=True)


@pytest.fixture(scope="module")
def nccl_pair(tmp_path_factory, gpus):
    """(trainer, engine, update_info, tokenizer, sft losses) with the NCCL group built."""
    gpus(2)
    from transformers import AutoTokenizer

    model_dir = build_tiny_dir(tmp_path_factory.mktemp("tiny"))
    tok = AutoTokenizer.from_pretrained(model_dir)
    trainer = trainer_proc("0", model_dir)
    engine = None
    try:
        engine = engine_proc("1", model_dir, make_cfg(max_new_tokens=LONG), ignore_eos=True)
        losses = trainer.call("sft", 60)
        port = free_port()
        trainer.send("init_nccl", "127.0.0.1", port, 2)  # both sides block until the group is complete
        engine.call("init_weight_transfer", "127.0.0.1", port, 1, 2)
        info = trainer.result()
        yield trainer, engine, info, tok, losses
    finally:
        if engine is not None:
            engine.close()
        trainer.close()


def _nccl_sync(trainer, engine, info, version: int) -> tuple[dict, dict]:
    engine.send("receive_weights_nccl", info, version)  # runs concurrently with the trainer's send
    sent = trainer.call("send_nccl", timeout=300)
    got = engine.result(300)
    return sent, got


def test_nccl_sync_engine_matches_learner(nccl_pair) -> None:
    from rlvr.types import PromptRequest, SamplingParams

    trainer, engine, info, tok, losses = nccl_pair
    print(f"SFT loss {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps")
    assert losses[-1] < 0.5 * losses[0]
    pairs = copy_pairs(tok, 8)
    learner = trainer.call("logprobs", pairs)
    before = [engine.call("score", p, c) for p, c in pairs]
    sent, got = _nccl_sync(trainer, engine, info, 1)
    _report("nccl sync", seconds=sent["sync/seconds"], bytes=sent["sync/bytes"], engine_s=got["sync/engine_total_s"])
    assert engine.call("policy_version") == 1
    after = [engine.call("score", p, c) for p, c in pairs]
    mean_after, max_after = _diffs(after, learner)
    mean_before, max_before = _diffs(before, learner)
    _report(
        "engine score vs learner (teacher-forced, T=1)",
        mean_abs_diff_after=mean_after,
        max_abs_diff_after=max_after,
        mean_abs_diff_before=mean_before,
        max_abs_diff_before=max_before,
    )
    assert mean_after < 0.05 and max_after < 0.5  # bf16: HF sdpa vs vLLM's flash-attention kernels
    assert mean_before > 10 * mean_after

    # sampled-token log-probs (processed_logprobs: after temperature) vs the learner at that temperature
    for temperature in (1.0, 0.7):
        reqs = [
            PromptRequest(
                f"t{temperature}-{i}", p, 2, SamplingParams(temperature=temperature, max_new_tokens=12, seed=7 + i)
            )
            for i, (p, _) in enumerate(pairs)
        ]
        samples = engine.call("generate", reqs, 120)
        assert all(s.version_start == s.version_end == 1 for s in samples)
        ref = trainer.call("logprobs", [(s.prompt_token_ids, s.completion_token_ids) for s in samples], temperature)
        mean_s, max_s = _diffs([s.logprobs for s in samples], ref)
        _report(f"engine sampled log-probs vs learner (T={temperature})", mean_abs_diff=mean_s, max_abs_diff=max_s)
        assert mean_s < 0.05 and max_s < 0.5


def test_nccl_update_while_requests_run(nccl_pair) -> None:
    from rlvr.types import PromptRequest, SamplingParams

    trainer, engine, info, tok, _ = nccl_pair
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
    sent, got = _nccl_sync(trainer, engine, info, version + 1)
    _report(
        "in-flight nccl update",
        pause_s=got["sync/pause_s"],
        engine_s=got["sync/engine_total_s"],
        seconds=sent["sync/seconds"],
    )
    samples, deadline = [], time.monotonic() + 120
    while len(samples) < 8:
        assert time.monotonic() < deadline, f"only {len(samples)} of 8 samples finished"
        samples += engine.call("poll")
        time.sleep(0.1)
    stamps = sorted({(s.version_start, s.version_end) for s in samples})
    print("in-flight (version_start, version_end):", stamps)
    assert all(s.finish_reason == "length" and len(s.completion_token_ids) == LONG for s in samples)
    assert all(s.version_start == version for s in samples)
    assert all(s.version_end == version + 1 for s in samples), "requests finished before the update landed"


def test_ipc_colocated_sync_matches_learner(tmp_path, gpus) -> None:
    gpus(1)
    from transformers import AutoTokenizer

    model_dir = build_tiny_dir(tmp_path / "tiny")
    tok = AutoTokenizer.from_pretrained(model_dir)
    pairs = copy_pairs(tok, 8)
    trainer = trainer_proc("0", model_dir)
    engine = None
    try:
        engine = engine_proc("0", model_dir, make_cfg(colocate=True, gpu_memory_utilization=0.3))
        before = [engine.call("score", p, c) for p, c in pairs]
        engine.call("init_weight_transfer")
        engine.call("sleep", 1)  # the learner trains while the engine sleeps
        trainer.call("sft", 60)
        learner = trainer.call("logprobs", pairs)
        engine.call("wake_up", ["weights"])  # weights first: the KV cache stays released during the transfer
        engine.call("begin_weight_update")
        trainer.send("send_ipc")
        sent = trainer.result(300, on_chunk=lambda chunk: engine.call("update_weights_chunk", chunk))
        engine.call("finish_weight_update", 1)
        engine.call("wake_up", ["kv_cache"])
        after = [engine.call("score", p, c) for p, c in pairs]
        mean_after, max_after = _diffs(after, learner)
        mean_before, _ = _diffs(before, learner)
        _report(
            "ipc colocated sync: engine score vs learner",
            seconds=sent["sync/seconds"],
            chunks=sent["sync/num_chunks"],
            mean_abs_diff_after=mean_after,
            max_abs_diff_after=max_after,
            mean_abs_diff_before=mean_before,
        )
        assert engine.call("policy_version") == 1
        assert mean_after < 0.05 and max_after < 0.5 and mean_before > 10 * mean_after
    finally:
        if engine is not None:
            engine.close()
        trainer.close()
