"""The token-exact episode loop with a scripted turn generator: the learner's ids are the engine's ids plus
observation ids (never a re-rendering), masks, log-probs, versions, limits, tool errors and metrics."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from rlvr.envs.base import Observation, StepResult
from rlvr.envs.engine_turns import episode_to_sample
from rlvr.envs.episode import Episode, EpisodeLimits, GeneratedTurn, run_episode
from rlvr.envs.tool_calls import ToolSpec
from rlvr.envs.tool_env import ToolEnv
from rlvr.envs.tools import Tool, ToolSet, lookup_tool
from rlvr.envs.turns import ObservationTokenizer

ROW = {
    "prompt": "What is the secret code of item K3? Put the final answer in \\boxed{}.",
    "ground_truth": "4821",
    "verifier": "math",
    "table": {"item B7": "1111", "item K3": "4821"},
}
CALL = (
    '<think>\nI need the code.</think>\n<tool_call>\n{"name": "lookup", "arguments": {"key": "item K3"}}\n</tool_call>'
)
ANSWER = "<think>\nThe tool said 4821.</think>\nThe answer is \\boxed{4821}."
RESPONSE = "<tool_response>\n4821\n</tool_response>"


def _spans(ep: Episode) -> list[list[int]]:
    return [ep.token_ids[t.start : t.end] for t in ep.turns]


def test_learner_ids_are_engine_ids_plus_observation_ids(
    scripted: Callable[..., Any], obs_tokens: ObservationTokenizer, chat_tokenizer: Any
) -> None:
    gen = scripted([CALL, ANSWER])
    ep = run_episode(ToolEnv(tools=["lookup"]), ROW, gen, obs_tokens)
    prompt = obs_tokens.first(ToolEnv(tools=["lookup"]).reset(ROW))
    observation = obs_tokens.encode(obs_tokens.template.render(RESPONSE, turn_closed=True))
    turn1, turn2 = (list(t.token_ids) for t in gen.produced)
    assert ep.token_ids == prompt + turn1 + observation + turn2
    assert ep.prompt_length == len(prompt)
    assert gen.seen == [prompt, prompt + turn1 + observation]  # the engine continued exactly these ids
    assert _spans(ep) == [turn1, turn2]
    assert (ep.end_reason, ep.reward_terms) == ("done", {"math": 1.0})


def test_the_episode_does_not_re_render_earlier_turns(
    scripted: Callable[..., Any], obs_tokens: ObservationTokenizer, chat_tokenizer: Any
) -> None:
    ep = run_episode(ToolEnv(tools=["lookup"]), ROW, scripted([CALL, ANSWER]), obs_tokens)
    messages = ToolEnv(tools=["lookup"]).reset(ROW).messages or []
    messages = messages + [
        {"role": "assistant", "content": CALL},
        {"role": "user", "content": RESPONSE},
        {"role": "assistant", "content": ANSWER},
    ]
    rendered = chat_tokenizer.apply_chat_template(messages, tokenize=False)
    re_rendered = chat_tokenizer.encode(rendered, add_special_tokens=False)
    # The template drops the first turn's <think> block: training on a re-rendering would train on ids the
    # engine never produced. The transcript keeps it, exactly as generated.
    assert "I need the code." not in rendered
    assert re_rendered != ep.token_ids
    assert "I need the code." in chat_tokenizer.decode(ep.token_ids)
    assert (
        chat_tokenizer.decode(ep.token_ids)
        == chat_tokenizer.decode(ep.token_ids[: ep.prompt_length])
        + CALL
        + "<|im_end|>\n<|im_start|>user\n"
        + RESPONSE
        + "<|im_end|>\n<|im_start|>assistant\n"
        + ANSWER
        + "<|im_end|>"
    )


def test_mask_logprobs_and_versions(scripted: Callable[..., Any], obs_tokens: ObservationTokenizer) -> None:
    gen = scripted([CALL, ANSWER], version=7)
    ep = run_episode(ToolEnv(tools=["lookup"]), ROW, gen, obs_tokens)
    assert len(ep.token_ids) == len(ep.loss_mask) == len(ep.logprobs) == len(ep.policy_versions)
    generated = {i for t in ep.turns for i in range(t.start, t.end)}
    for i in range(len(ep.token_ids)):
        assert ep.loss_mask[i] == int(i in generated)
        if i not in generated:
            assert (ep.logprobs[i], ep.policy_versions[i]) == (0.0, -1)  # prompt and observation tokens
    for turn, produced in zip(ep.turns, gen.produced, strict=True):
        assert ep.logprobs[turn.start : turn.end] == produced.logprobs  # the engine's own log-probs
        assert set(ep.policy_versions[turn.start : turn.end]) == {produced.policy_version}
        assert turn.policy_version == produced.policy_version
    assert [t.policy_version for t in ep.turns] == [7, 8]
    first = ep.turns[0]
    assert ep.loss_mask[first.observation_start : first.observation_end] == [0] * (
        first.observation_end - first.observation_start
    )


def test_metrics_and_sample_record(scripted: Callable[..., Any], obs_tokens: ObservationTokenizer) -> None:
    ep = run_episode(ToolEnv(tools=["lookup"]), ROW, scripted([CALL, ANSWER]), obs_tokens)
    m = ep.metrics()
    completion = len(ep.token_ids) - ep.prompt_length
    assert (m["turns"], m["tool_calls"], m["tool_errors"], m["answered"]) == (2, 1, 0, 1)
    assert m["observation_token_share"] == pytest.approx(m["observation_tokens"] / completion)
    assert 0 < m["observation_token_share"] < 1 and m["tool_latency_s"] >= 0
    sample = episode_to_sample(ep, "lookup:0:0", sample_index=2)
    assert sample.prompt_token_ids + sample.completion_token_ids == ep.token_ids
    assert len(sample.logprobs) == len(sample.completion_token_ids) == len(sample.metadata["completion_loss_mask"])
    assert (sample.version_start, sample.version_end, sample.finish_reason) == (3, 4, "stop")
    assert sample.metadata["end_reason"] == "done" and sample.completion_text == f"{CALL}<|im_end|>{ANSWER}<|im_end|>"


def test_a_turn_ended_by_a_stop_string_gets_the_end_of_turn_token(
    scripted: Callable[..., Any], obs_tokens: ObservationTokenizer, chat_tokenizer: Any
) -> None:
    gen = scripted([CALL, ANSWER], close=False)
    ep = run_episode(ToolEnv(tools=["lookup"]), ROW, gen, obs_tokens)
    first = ep.turns[0]
    observation = chat_tokenizer.decode(ep.token_ids[first.observation_start : first.observation_end])
    assert observation.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>")


class _AlwaysCalls:
    """An environment that never finishes: every step asks for another turn."""

    def reset(self, row: dict[str, Any]) -> Observation:
        return Observation(messages=[{"role": "user", "content": "go"}])

    def step(self, turn_text: str, turn_token_ids: list[int]) -> StepResult:
        return StepResult(Observation(text="again"), {"step": 0.5}, metrics={"steps": 1.0})


def test_max_turns(scripted: Callable[..., Any], obs_tokens: ObservationTokenizer) -> None:
    ep = run_episode(_AlwaysCalls(), {}, scripted(["a", "b", "c"]), obs_tokens, EpisodeLimits(max_turns=2))
    assert (ep.end_reason, len(ep.turns), ep.reward_terms) == ("max_turns", 2, {"step": 1.0})
    assert ep.turns[1].observation_start == -1 and ep.token_ids[-1] == obs_tokens.tokenizer.eos_token_id


def test_turn_length(scripted: Callable[..., Any], obs_tokens: ObservationTokenizer) -> None:
    gen = scripted([CALL])
    ep = run_episode(ToolEnv(tools=["lookup"]), ROW, gen, obs_tokens, EpisodeLimits(max_tokens_per_turn=5))
    assert (ep.end_reason, len(ep.turns), sum(ep.loss_mask)) == ("turn_length", 1, 5)
    assert ep.env_metrics == {}  # a cut turn is not stepped


def test_max_total_tokens(scripted: Callable[..., Any], obs_tokens: ObservationTokenizer) -> None:
    prompt = len(obs_tokens.first(_AlwaysCalls().reset({})))
    for total in (prompt + 3, prompt + 8, prompt + 12):
        gen = scripted(["abcdef"] * 5)
        ep = run_episode(_AlwaysCalls(), {}, gen, obs_tokens, EpisodeLimits(max_turns=5, max_total_tokens=total))
        assert ep.end_reason == "max_total_tokens" and len(ep.token_ids) <= total
    short = run_episode(_AlwaysCalls(), {}, scripted([]), obs_tokens, EpisodeLimits(max_total_tokens=prompt))
    assert (short.end_reason, short.turns) == ("max_total_tokens", [])


def test_malformed_call_is_an_error_observation_or_ends_the_episode(
    scripted: Callable[..., Any], obs_tokens: ObservationTokenizer
) -> None:
    bad = '<tool_call>{"name": "lookup", "arguments": {"key": </tool_call>'
    ep = run_episode(ToolEnv(tools=["lookup"]), ROW, scripted([bad, ANSWER]), obs_tokens)
    first = ep.turns[0]
    observation = obs_tokens.tokenizer.decode(ep.token_ids[first.observation_start : first.observation_end])
    assert "error: tool call is not valid JSON" in observation
    assert (ep.end_reason, ep.env_metrics["tool_errors"], ep.env_metrics["tool_error/parse_error"]) == ("done", 1, 1)
    ended = run_episode(ToolEnv(tools=["lookup"], end_on_tool_error=True), ROW, scripted([bad, ANSWER]), obs_tokens)
    assert (ended.end_reason, len(ended.turns)) == ("tool_error", 1)


def test_a_hanging_tool_does_not_stall_the_episode(
    scripted: Callable[..., Any], obs_tokens: ObservationTokenizer
) -> None:
    release = threading.Event()
    hang = Tool(ToolSpec("lookup", "hangs"), lambda arguments, row: str(release.wait(60)), timeout_s=0.2)
    try:
        ep = run_episode(ToolEnv(tools=ToolSet([hang])), ROW, scripted([CALL, ANSWER]), obs_tokens)
    finally:
        release.set()
    assert ep.end_reason == "done" and ep.env_metrics["tool_error/timeout"] == 1
    assert "timed out" in obs_tokens.tokenizer.decode(ep.token_ids[ep.turns[0].observation_start :])
    assert ep.reward_terms == {"math": 1.0}


def test_wrong_answer_scores_zero_and_bad_generators_are_rejected(
    scripted: Callable[..., Any], obs_tokens: ObservationTokenizer
) -> None:
    ep = run_episode(ToolEnv(tools=ToolSet([lookup_tool()])), ROW, scripted(["\\boxed{1111}"]), obs_tokens)
    assert (ep.reward_terms, ep.end_reason) == ({"math": 0.0}, "done")

    class _Broken:
        def generate_turn(self, token_ids: list[int], max_new_tokens: int) -> GeneratedTurn:
            return GeneratedTurn([1, 2, 3], [0.0], "stop", 0)

    with pytest.raises(ValueError, match="log-probs"):
        run_episode(ToolEnv(tools=["lookup"]), ROW, _Broken(), obs_tokens)


class _Buggy(_AlwaysCalls):
    def step(self, turn_text: str, turn_token_ids: list[int]) -> StepResult:
        raise KeyError("oops")


def test_an_environment_that_raises_ends_the_episode(
    scripted: Callable[..., Any], obs_tokens: ObservationTokenizer
) -> None:
    ep = run_episode(_Buggy(), {}, scripted(["a"]), obs_tokens)
    assert (ep.end_reason, ep.error, len(ep.turns)) == ("env_error", "KeyError: 'oops'", 1)
