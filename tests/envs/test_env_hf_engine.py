"""Two turns through the real transformers engine (tiny random Qwen2 on CPU, generating from token ids): the
transcript is the engine's ids plus observation ids, and the recorded log-probs are the engine's."""

from __future__ import annotations

from typing import Any

import pytest

from rlvr.envs.base import Observation, StepResult
from rlvr.envs.engine_turns import EngineTurnGenerator, episode_to_sample
from rlvr.envs.episode import EpisodeLimits, run_episode
from rlvr.envs.turns import ObservationTokenizer
from rlvr.rollout.hf_engine import TransformersEngine
from rlvr.types import SamplingParams

RESPONSE = "<tool_response>\n3\n</tool_response>"


class TwoTurnEnv:
    """Answers the first turn with a fixed tool response and ends after the second."""

    def __init__(self) -> None:
        self.steps = 0

    def reset(self, row: dict[str, Any]) -> Observation:
        return Observation(messages=[{"role": "user", "content": "What is 1+2?"}])

    def step(self, turn_text: str, turn_token_ids: list[int]) -> StepResult:
        self.steps += 1
        if self.steps == 2:
            return StepResult(None, {"r": 1.0}, done=True, reason="done")
        return StepResult(Observation(text=RESPONSE), metrics={"tool_calls": 1.0})


def test_two_turns_on_the_transformers_engine(
    engine: TransformersEngine, chat_tokenizer: Any, obs_tokens: ObservationTokenizer
) -> None:
    # A random model seldom emits EOS: stop on 3/4 of the vocabulary so that turns end by "stop", not length.
    stops = [i for i in range(len(chat_tokenizer)) if i % 4]
    sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, seed=11, stop_token_ids=stops)
    generator = EngineTurnGenerator(engine, sampling, prompt_id="hf-episode")
    ep = run_episode(TwoTurnEnv(), {}, generator, obs_tokens, EpisodeLimits(max_turns=3, max_tokens_per_turn=32))
    assert (ep.end_reason, len(ep.turns), ep.reward_terms) == ("done", 2, {"r": 1.0})

    first, second = ep.turns
    prompt = obs_tokens.first(TwoTurnEnv().reset({}))
    turn1, turn2 = ep.token_ids[first.start : first.end], ep.token_ids[second.start : second.end]
    observation = obs_tokens.next(Observation(text=RESPONSE), turn1)
    assert ep.token_ids == prompt + turn1 + observation + turn2
    assert first.end == first.observation_start and first.observation_end == second.start
    assert ep.loss_mask == [0] * len(prompt) + [1] * len(turn1) + [0] * len(observation) + [1] * len(turn2)
    for turn in ep.turns:  # the recorded log-probs are the engine's for exactly this context
        scored = engine.score(ep.token_ids[: turn.start], ep.token_ids[turn.start : turn.end], temperature=1.0)
        assert ep.logprobs[turn.start : turn.end] == pytest.approx(scored, abs=1e-4)
        assert turn.policy_version == engine.policy_version
    assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.loss_mask, strict=True) if m == 0)
    sample = episode_to_sample(ep, "hf:0:0")
    assert sample.prompt_token_ids == prompt and len(sample.logprobs) == len(sample.completion_token_ids)
