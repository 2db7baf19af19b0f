"""The environment registry, the lookup task's rows, and the built-in environments end to end (scripted turns)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from rlvr.envs.base import Environment, Observation, StepResult
from rlvr.envs.episode import run_episode
from rlvr.envs.registration import register_env
from rlvr.envs.registry import get_env, known_envs, make_env
from rlvr.envs.tasks import lookup_rows
from rlvr.envs.tool_env import ToolEnv
from rlvr.envs.turns import ObservationTokenizer


class EchoEnv:
    """A user environment loaded by import path."""

    def __init__(self, greeting: str = "hi") -> None:
        self.greeting = greeting

    def reset(self, row: dict[str, Any]) -> Observation:
        return Observation(text=self.greeting)

    def step(self, turn_text: str, turn_token_ids: list[int]) -> StepResult:
        return StepResult(None, {"echo": 1.0}, done=True, reason="done")


def test_builtins_are_registered_and_user_envs_load_by_import_path() -> None:
    assert {"tool", "tool_lookup", "math_python"} <= set(known_envs())
    env = make_env("tool_lookup")
    assert isinstance(env, ToolEnv) and isinstance(env, Environment)
    assert [s.name for s in env.tools.specs()] == ["lookup"]
    user = make_env(f"{__name__}:EchoEnv", greeting="hello")
    assert isinstance(user, EchoEnv) and user.greeting == "hello"
    assert f"{__name__}:EchoEnv" in known_envs()


def test_registry_errors() -> None:
    with pytest.raises(ValueError, match="unknown environment 'nope'.*tool_lookup"):
        get_env("nope")
    with pytest.raises(ValueError, match="cannot import environment module"):
        get_env("no_such_module_xyz:Env")
    with pytest.raises(ValueError, match="already registered"):
        register_env("tool_lookup")(EchoEnv)


def test_lookup_rows_are_seeded_split_and_need_the_tool() -> None:
    train = lookup_rows("train", 50, seed=1)
    assert train == lookup_rows("train", 50, seed=1) and train != lookup_rows("train", 50, seed=2)
    test = lookup_rows("test", 30, seed=1)
    assert test == lookup_rows("test", 30, seed=9)  # the test split ignores the seed
    questions = lambda rows: {r["prompt"] for r in rows}  # noqa: E731
    assert not questions(train) & questions(lookup_rows("test", 200))
    for row in train + test:
        key = row["prompt"].split("item ")[1].split("?")[0]
        assert row["ground_truth"] == row["table"][f"item {key}"]
        assert row["ground_truth"] not in row["prompt"] and row["verifier"] == "math"
    for row in lookup_rows("train", 20, seed=0, kind="sum", num_entries=5):
        a, b = row["prompt"].split("items ")[1].split("?")[0].split(" and ")
        assert int(row["ground_truth"]) == int(row["table"][f"item {a}"]) + int(row["table"][f"item {b}"])
        assert len(row["table"]) == 5
    with pytest.raises(ValueError):
        lookup_rows("dev", 1)


def _call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_tool_lookup_multi_step_task_solved_through_the_tool(
    scripted: Callable[..., Any], obs_tokens: ObservationTokenizer
) -> None:
    row = lookup_rows("train", 1, seed=3, kind="sum")[0]
    a, b = row["prompt"].split("items ")[1].split("?")[0].split(" and ")
    total = int(row["table"][f"item {a}"]) + int(row["table"][f"item {b}"])
    turns = [_call("lookup", key=f"item {a}") + _call("lookup", key=f"item {b}"), f"\\boxed{{{total}}}"]
    ep = run_episode(make_env("tool_lookup"), row, scripted(turns), obs_tokens)
    assert (ep.end_reason, ep.reward_terms, ep.env_metrics["tool_calls"]) == ("done", {"math": 1.0}, 2)
    observation = obs_tokens.tokenizer.decode(ep.token_ids[ep.turns[0].observation_start : ep.turns[0].observation_end])
    assert row["table"][f"item {a}"] in observation and row["table"][f"item {b}"] in observation
    guessed = run_episode(make_env("tool_lookup"), row, scripted(["\\boxed{1234}"]), obs_tokens)
    assert guessed.reward_terms == {"math": float(total == 1234)}


def test_math_python_runs_the_tool_in_the_sandbox(
    scripted: Callable[..., Any], obs_tokens: ObservationTokenizer
) -> None:
    row = {"prompt": "What is 123 * 457 + 89?", "ground_truth": "56300", "verifier": "math"}
    turns = [_call("python", code="print(123 * 457 + 89)"), "\\boxed{56300}"]
    ep = run_episode(make_env("math_python"), row, scripted(turns), obs_tokens)
    first = ep.turns[0]
    assert "56300" in obs_tokens.tokenizer.decode(ep.token_ids[first.observation_start : first.observation_end])
    assert (ep.end_reason, ep.reward_terms, ep.env_metrics["tool_errors"]) == ("done", {"math": 1.0}, 0)
