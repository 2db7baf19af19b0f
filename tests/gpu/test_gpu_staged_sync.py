"""The staged NCCL weight sync (`--rollout.vllm-staged-sync`) on two GPUs: the trainer (learner stand-in) on GPU 0
broadcasts SFT-trained weights while the vLLM engine on GPU 1 decodes long requests. The engine receives them in the
background and pauses only to load: the requests finish stamped (old version, new version), the engine's log-probs
then match the learner's as after a plain NCCL sync, and the phases (background receive, generation lost) are printed."""

from __future__ import annotations

import json
import time

import pytest
from gpu_helpers import build_tiny_dir, copy_pairs, engine_proc, make_cfg, trainer_proc

from rlvr.launch.local_cluster import free_port

pytestmark = pytest.mark.gpu

LONG = 1900  # tokens per completion (ignore_eos): the sync lands while they decode


def test_staged_sync_lands_while_requests_decode(tmp_path, gpus) -> None:
    gpus(2)
    from transformers import AutoTokenizer

    from rlvr.types import PromptRequest, SamplingParams

    model_dir = build_tiny_dir(tmp_path / "tiny")
    tok = AutoTokenizer.from_pretrained(model_dir)
    trainer = trainer_proc("0", model_dir)
    engine = None
    try:
        engine = engine_proc("1", model_dir, make_cfg(max_new_tokens=LONG, staged=True), ignore_eos=True)
        trainer.call("sft", 60)
        port = free_port()
        trainer.send("init_nccl", "127.0.0.1", port, 2)
        engine.call("init_weight_transfer", "127.0.0.1", port, 1, 2)
        info = trainer.result()
        pairs = copy_pairs(tok, 8)
        learner = trainer.call("logprobs", pairs)
        version = engine.call("policy_version")
        reqs = [
            PromptRequest(f"long{i}", p, 2, SamplingParams(max_new_tokens=LONG, seed=i))
            for i, (p, _) in enumerate(pairs[:4])
        ]
        engine.call("submit", reqs)
        deadline = time.monotonic() + 60
        while engine.call("stats")["inflight_samples"] < 8:
            assert time.monotonic() < deadline, "requests never started"
            time.sleep(0.05)
        time.sleep(0.2)
        for k in range(3):  # every sync stages: the buffers of one sync must not crowd out the next one's copy
            engine.send("receive_weights_nccl", info, version + 1 + k)
            sent = trainer.call("send_nccl", timeout=300)
            got = engine.result(300)
            print(
                json.dumps({"check": f"staged nccl sync {k}", **{k: round(v, 5) for k, v in {**sent, **got}.items()}})
            )
            assert got["sync/staged"] == 1.0, f"sync {k} fell back to the paused path (no free memory for the copy?)"
        samples, deadline = [], time.monotonic() + 120
        while len(samples) < 8:
            assert time.monotonic() < deadline, f"only {len(samples)} of 8 samples finished"
            samples += engine.call("poll")
            time.sleep(0.1)
        assert all(s.version_start == version and s.version_end == version + 3 for s in samples)
        assert all(len(s.completion_token_ids) == LONG for s in samples)
        after = [engine.call("score", p, c) for p, c in pairs]
        flat = [abs(x - y) for u, v in zip(after, learner, strict=True) for x, y in zip(u, v, strict=True)]
        print(
            json.dumps(
                {"check": "staged sync: engine score vs learner", "mean": sum(flat) / len(flat), "max": max(flat)}
            )
        )
        assert sum(flat) / len(flat) < 0.05 and max(flat) < 0.5  # as the plain NCCL sync (test_gpu_weight_sync)
    finally:
        if engine is not None:
            engine.close()
        trainer.close()
