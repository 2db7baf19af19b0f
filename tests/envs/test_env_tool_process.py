"""`ProcessToolSet`: tools that spin forever or kill their process cost a child process, never the caller."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rlvr.envs.tool_calls import ToolCall
from rlvr.envs.tool_env import ToolEnv
from rlvr.envs.tool_process import ProcessToolSet


@pytest.fixture
def tools() -> Iterator[ProcessToolSet]:
    # spawn: the child imports the tool modules fresh (tests/envs is on the path the child inherits)
    toolset = ProcessToolSet(
        ["calculator", "envs_user_tools:spin", "envs_user_tools:die", "envs_user_tools:flood"],
        max_output_chars=100,
        grace_s=0.5,
        start_method="spawn",
    )
    yield toolset
    toolset.close()


def test_calls_run_in_the_child(tools: ProcessToolSet) -> None:
    assert [s.name for s in tools.specs()] == ["calculator", "spin", "die", "flood"]
    assert tools.execute(ToolCall("calculator", {"expression": "2**5"}), {}).content == "32"
    flooded = tools.execute(ToolCall("flood", {}), {})
    assert flooded.ok and flooded.truncated


def test_a_spinning_tool_is_killed_and_the_next_call_works(tools: ProcessToolSet) -> None:
    tools._timeouts["spin"] = 0.5  # the user tool's default is 5 s: keep the test short
    first = tools._process.pid
    result = tools.execute(ToolCall("spin", {}), {})
    assert (result.ok, result.reason, tools.kills) == (False, "timeout", 1) and "killed" in result.content
    assert tools._process.pid != first
    assert tools.execute(ToolCall("calculator", {"expression": "1+1"}), {}).content == "2"


def test_a_dying_tool_is_a_crash_and_the_next_call_works(tools: ProcessToolSet) -> None:
    result = tools.execute(ToolCall("die", {}), {})
    assert (result.ok, result.reason, tools.deaths) == (False, "crash", 1)
    assert tools.execute(ToolCall("calculator", {"expression": "3*3"}), {}).content == "9"


def test_tool_env_takes_a_process_tool_set(tools: ProcessToolSet) -> None:
    env = ToolEnv(tools=tools)
    env.reset({"prompt": "x", "ground_truth": "1"})
    step = env.step('<tool_call>{"name": "die", "arguments": {}}</tool_call>', [])
    assert step.metrics["tool_error/crash"] == 1 and step.observation is not None
    assert "crashed" in step.observation.text
