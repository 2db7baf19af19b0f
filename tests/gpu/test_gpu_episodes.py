"""Two-turn episodes on the vLLM engine (the assertions of tests/envs/test_env_hf_engine.py, on a GPU): the transcript
is the engine's own ids plus the observation's ids, observation tokens carry no loss and no log-prob, each turn's
log-probs are the engine's for exactly its context, and each turn is stamped with the engine's policy version.
The engine runs in its own process (tests/gpu/gpu_helpers.py)."""

from __future__ import annotations

from typing import Any

import pytest
from gpu_helpers import build_tiny_dir, engine_proc, make_cfg

from rlvr.envs.base import Observation, StepResult

pytestmark = pytest.mark.gpu

RESPONSE = "=3"


class TwoTurnEnv:
    """Answers the first turn with a fixed observation and ends after the second."""

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, row: dict[str, Any]) -> Observation:
        return Observation(text="1+2=")

    def step(self, turn_text: str, turn_token_ids: list[int]) -> StepResult:
        self.steps += 1
        if self.steps == 2:
            return StepResult(None, {"r": 1.0}, done=True, reason="done")
        return StepResult(Observation(text=RESPONSE), metrics={"tool_calls": 1.0})


class ProcEngine:
    """The engine protocol's `generate`, answered by the engine process."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc

    def generate(self, requests: list, timeout_s: float | None = None) -> list:
        return self.proc.call("generate", requests, timeout_s or 120)


def test_two_turn_episode_on_vllm(tmp_path, gpus) -> None:
    gpus(1)
    from transformers import AutoTokenizer

    from rlvr.envs.engine_turns import EngineTurnGenerator, episode_to_sample
    from rlvr.envs.episode import EpisodeLimits, run_episode
    from rlvr.envs.settings import observation_tokenizer
    from rlvr.types import SamplingParams

    model_dir = build_tiny_dir(tmp_path / "tiny")
    tok = AutoTokenizer.from_pretrained(model_dir)
    obs = observation_tokenizer(tok, chat_template=False)
    eng = engine_proc("0", model_dir, make_cfg(max_new_tokens=16), initial_version=5)
    try:
        # a random model seldom emits EOS: stop on 3/4 of the vocabulary so that turns end by "stop"
        stops = [i for i in range(len(tok)) if i % 4]
        sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, seed=11, stop_token_ids=stops)
        generator = EngineTurnGenerator(ProcEngine(eng), sampling, prompt_id="vllm-episode")
        limits = EpisodeLimits(max_turns=3, max_tokens_per_turn=16)
        ep = run_episode(TwoTurnEnv(), {}, generator, obs, limits)
        assert (ep.end_reason, len(ep.turns), ep.reward_terms) == ("done", 2, {"r": 1.0})
        first, second = ep.turns
        prompt = obs.first(TwoTurnEnv().reset({}))
        turn1, turn2 = ep.token_ids[first.start : first.end], ep.token_ids[second.start : second.end]
        observation = obs.next(Observation(text=RESPONSE), turn1)
        assert ep.token_ids == prompt + turn1 + observation + turn2  # never re-rendered
        assert ep.loss_mask == [0] * len(prompt) + [1] * len(turn1) + [0] * len(observation) + [1] * len(turn2)
        diffs = []
        for turn in ep.turns:  # the engine's log-probs for exactly this context
            scored = eng.call("score", ep.token_ids[: turn.start], ep.token_ids[turn.start : turn.end])
            diffs += [abs(a - b) for a, b in zip(ep.logprobs[turn.start : turn.end], scored, strict=True)]
            assert turn.policy_version == 5
        print(f"episode turns vs engine score: max {max(diffs):.2e}")
        assert max(diffs) < 5e-2  # bf16 sampling vs teacher-forced scoring (test_gpu_vllm_engine.py's bound)
        assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.loss_mask, strict=True) if m == 0)
        sample = episode_to_sample(ep, "vllm:0:0")
        assert sample.prompt_token_ids == prompt and len(sample.logprobs) == len(sample.completion_token_ids)
        assert (sample.version_start, sample.version_end) == (5, 5)
    finally:
        eng.close()
