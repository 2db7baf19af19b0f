"""(a) The vLLM engine generates with log-probs, finish reasons and version stamps; (e) colocated sleep/wake
frees and restores GPU memory. One GPU; each engine runs in its own process (tests/gpu/gpu_helpers.py)."""

from __future__ import annotations

import math
import time

import pytest
from gpu_helpers import build_tiny_dir, copy_pairs, engine_proc, make_cfg

pytestmark = pytest.mark.gpu


def _poll_until(eng, num: int, timeout: float = 90) -> list:
    got, deadline = [], time.monotonic() + timeout
    while len(got) < num:
        assert time.monotonic() < deadline, f"only {len(got)} of {num} samples within {timeout}s"
        got += eng.call("poll")
        time.sleep(0.05)
    return got


@pytest.mark.parametrize("lean", [False, True], ids=["vllm_text", "lean"])
def test_generate_logprobs_finish_reasons_versions(tmp_path, gpus, lean) -> None:
    gpus(1)
    from transformers import AutoTokenizer

    from rlvr.types import PromptRequest, SamplingParams

    model_dir = build_tiny_dir(tmp_path / "tiny")
    tok = AutoTokenizer.from_pretrained(model_dir)
    eng = engine_proc("0", model_dir, make_cfg(max_new_tokens=24, lean=lean), initial_version=3)
    try:
        pairs = copy_pairs(tok, 6)
        reqs = [
            PromptRequest(f"p{i}", p, 4, SamplingParams(temperature=1.0, max_new_tokens=24, seed=100 + i))
            for i, (p, _) in enumerate(pairs)
        ]
        samples = eng.call("generate", reqs, 120)
        assert [(s.prompt_id, s.sample_index) for s in samples] == [(f"p{i}", j) for i in range(6) for j in range(4)]
        for s in samples:
            assert 0 < len(s.completion_token_ids) == len(s.logprobs) <= 24
            assert all(math.isfinite(x) and x <= 1e-4 for x in s.logprobs)
            assert s.finish_reason in ("stop", "length")
            if s.finish_reason == "length":
                assert len(s.completion_token_ids) == 24
            else:
                assert s.completion_token_ids[-1] == tok.eos_token_id  # the stop token is kept, with its log-prob
            assert (s.version_start, s.version_end, s.engine_id) == (3, 3, 0)
        # seeded: sample j of a prompt does not depend on the batch it ran in
        again = eng.call("generate", reqs[:2], 120)
        assert [s.completion_token_ids for s in again] == [s.completion_token_ids for s in samples[:8]]
        # teacher-forced prompt log-probs (score) agree with the sampled-token log-probs at temperature 1
        diffs = []
        for s in samples[:8]:
            scored = eng.call("score", s.prompt_token_ids, s.completion_token_ids)
            diffs += [abs(a - b) for a, b in zip(scored, s.logprobs, strict=True)]
        print(f"score vs sampled log-probs (same engine): mean {sum(diffs) / len(diffs):.2e}, max {max(diffs):.2e}")
        assert max(diffs) < 5e-2
        with pytest.raises(RuntimeError, match="temperature 1.0 only"):
            eng.call("score", pairs[0][0], pairs[0][1], 0.7)

        # streaming: submit/poll, greedy samples are identical, stop strings end with "stop"
        eng.call(
            "submit",
            [
                PromptRequest(
                    "g0", pairs[0][0], 3, SamplingParams(temperature=0.0, max_new_tokens=24, stop_strings=["a"])
                )
            ],
        )
        greedy = _poll_until(eng, 3)
        assert len({tuple(s.completion_token_ids) for s in greedy}) == 1
        for s in greedy:
            if "a" in s.completion_text:
                assert s.finish_reason == "stop" and s.completion_text.endswith("a")
        stats = eng.call("stats")
        print("stats:", {k: round(v, 3) for k, v in stats.items()})
        assert stats["completed_prompts"] >= 9 and stats["policy_version"] == 3 and stats["generated_tokens"] > 0
        assert {"running", "queued", "kv_usage", "tokens_per_s"} <= stats.keys()

        # pause holds admission; abort_all returns what was queued and nothing comes out for it
        eng.call("pause")
        eng.call("submit", [PromptRequest("held", pairs[1][0], 2, SamplingParams(max_new_tokens=24, seed=1))])
        time.sleep(0.5)
        assert eng.call("poll") == [] and eng.call("stats")["queued_prompts"] == 1
        assert eng.call("abort_all") == ["held"]
        eng.call("resume")
        time.sleep(0.5)
        assert eng.call("poll") == []
        assert len(eng.call("generate", reqs[:1], 60)) == 4  # still serving after abort + resume
    finally:
        eng.close()


def test_colocated_sleep_frees_and_wake_restores_memory(tmp_path, gpus) -> None:
    gpus(1)
    from transformers import AutoTokenizer

    model_dir = build_tiny_dir(tmp_path / "tiny")
    tok = AutoTokenizer.from_pretrained(model_dir)
    pairs = copy_pairs(tok, 4)
    eng = engine_proc("0", model_dir, make_cfg(colocate=True, gpu_memory_utilization=0.3))
    try:
        before = [eng.call("score", p, c) for p, c in pairs]
        free_awake, total = eng.call("mem_get_info")
        eng.call("sleep", 1)
        free_asleep, _ = eng.call("mem_get_info")
        eng.call("wake_up")
        free_woken, _ = eng.call("mem_get_info")
        gib = 1 << 30
        print(
            f"free GiB awake {free_awake / gib:.2f}, asleep {free_asleep / gib:.2f}, woken {free_woken / gib:.2f} "
            f"(total {total / gib:.1f})"
        )
        assert free_asleep - free_awake > 0.15 * total  # the KV cache (most of the 30% reservation) is released
        assert free_asleep - free_woken > 0.15 * total  # and taken again
        after = [eng.call("score", p, c) for p, c in pairs]
        diff = max(abs(a - b) for x, y in zip(before, after) for a, b in zip(x, y))
        assert diff < 1e-3, f"weights not restored after wake_up (max log-prob change {diff})"
    finally:
        eng.close()
