"""The tool set: calculator, lookup, user tools by import path, the python tool in the real code sandbox, and
containment of tools that hang, crash or flood (an error observation with a counted reason, never a stall)."""

from __future__ import annotations

import re

import envs_user_tools
import pytest

from rlvr.envs.tool_calls import ToolCall
from rlvr.envs.tools import (
    PythonTool,
    ToolError,
    ToolSet,
    build_toolset,
    evaluate_arithmetic,
    load_user_tool,
    python_tool,
    sandbox_runner,
)

ROW = {"table": {"item K3": "4821", "item B7": "1111"}}


@pytest.mark.parametrize(
    ("expression", "value"),
    [("1+2*3", 7), ("(2+3)**2", 25), ("-7//2", -4), ("10/4", 2.5), ("2**10 % 7", 2), ("+-1", -1)],
)
def test_calculator_evaluates_arithmetic(expression: str, value: float) -> None:
    assert evaluate_arithmetic(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "x + 1",
        "print(1)",
        "1 if 1 else 2",
        "[1, 2]",
        "1/0",
        "9**9**9",
        "10**200",
        "1 +",
        "a" * 300,
        "'ab' * 3",
    ],
)
def test_calculator_rejects_everything_else(expression: str) -> None:
    with pytest.raises(ToolError):
        evaluate_arithmetic(expression)


def test_calculator_and_lookup_through_the_tool_set() -> None:
    tools = build_toolset(["calculator", "lookup"])
    assert tools.execute(ToolCall("calculator", {"expression": "6*7"}), ROW).content == "42"
    assert tools.execute(ToolCall("lookup", {"key": "item K3"}), ROW).content == "4821"
    missing = tools.execute(ToolCall("lookup", {"key": "item Z9"}), ROW)
    assert (missing.ok, missing.reason) == (False, "tool_error") and "item K3" in missing.content
    bad = tools.execute(ToolCall("calculator", {"expr": "1"}), ROW)
    assert (bad.ok, bad.reason) == (False, "tool_error") and "missing argument 'expression'" in bad.content
    unknown = tools.execute(ToolCall("search", {}), ROW)
    assert (unknown.ok, unknown.reason) == (False, "unknown_tool") and "calculator" in unknown.content


def test_user_tools_load_by_import_path() -> None:
    tools = build_toolset(["envs_user_tools:reverse", "envs_user_tools:SHOUT"])
    assert [s.name for s in tools.specs()] == ["reverse", "shout"]
    assert tools.specs()[0].description == "Reverse a string."
    assert tools.execute(ToolCall("reverse", {"text": "abc"}), {}).content == "cba"
    assert tools.execute(ToolCall("shout", {"text": "abc"}), {}).content == "ABC"
    wrong = tools.execute(ToolCall("reverse", {"txt": "abc"}), {})
    assert (wrong.ok, wrong.reason) == (False, "bad_arguments")
    with pytest.raises(ValueError, match="cannot load tool"):
        load_user_tool("envs_user_tools:missing")


def test_hanging_crashing_and_flooding_tools_are_contained_and_counted() -> None:
    hang = load_user_tool("envs_user_tools:hang", timeout_s=0.2)
    tools = ToolSet(
        [hang, load_user_tool("envs_user_tools:crash"), load_user_tool("envs_user_tools:flood")], max_output_chars=100
    )
    try:
        hung = tools.execute(ToolCall("hang", {}), {})
        assert (hung.ok, hung.reason) == (False, "timeout") and "timed out" in hung.content
        assert hung.latency_s >= 0.2 and tools.abandoned == 1
    finally:
        envs_user_tools.RELEASE.set()  # let the abandoned thread end
    crashed = tools.execute(ToolCall("crash", {}), {})
    assert (crashed.ok, crashed.reason) == (False, "crash") and "RuntimeError: boom" in crashed.content
    flooded = tools.execute(ToolCall("flood", {}), {})
    assert flooded.ok and flooded.truncated and flooded.reason == "output_truncated"
    assert len(flooded.content) < 200 and "truncated" in flooded.content


@pytest.fixture(scope="module")
def python_tools() -> ToolSet:
    """The python tool on the real subprocess sandbox (2 s per program, 4 KiB of output)."""
    return ToolSet(
        [python_tool(sandbox_runner(timeout_s=2.0, max_output_bytes=4096), timeout_s=2.0)], max_output_chars=500
    )


def test_python_tool_runs_code_in_the_sandbox(python_tools: ToolSet) -> None:
    result = python_tools.execute(
        ToolCall("python", {"code": "import sys\nprint(6*7)\nprint('warn', file=sys.stderr)"}), {}
    )
    assert result.ok and result.content == "42\nwarn"
    failed = python_tools.execute(ToolCall("python", {"code": "x = 1\nraise ValueError('bad value')"}), {})
    assert (failed.ok, failed.reason) == (False, "tool_error")
    assert "ValueError: bad value" in failed.content and "__tool_" not in failed.content


def test_python_tool_contains_hang_crash_and_flood(python_tools: ToolSet) -> None:
    hung = python_tools.execute(ToolCall("python", {"code": "print('started', flush=True)\nwhile True: pass"}), {})
    assert (hung.ok, hung.reason) == (False, "tool_error") and "killed (time limit)" in hung.content
    crashed = python_tools.execute(ToolCall("python", {"code": "import os\nos._exit(3)"}), {})
    assert (crashed.ok, crashed.reason) == (False, "tool_error") and "killed" in crashed.content
    flooded = python_tools.execute(ToolCall("python", {"code": "while True: print('y' * 1000)"}), {})
    assert not flooded.ok and "killed" in flooded.content and len(flooded.content) < 2000


def test_python_tool_sandbox_failure_is_a_crash() -> None:
    tools = ToolSet([python_tool(lambda program: None)])
    result = tools.execute(ToolCall("python", {"code": "print(1)"}), {})
    assert (result.ok, result.reason) == (False, "crash") and "sandbox failed" in result.content


def test_python_tool_takes_any_runner() -> None:
    seen: list[str] = []

    def runner(program: str) -> str:
        seen.append(program)
        marker = re.search(r"__tool_ok_\w+__", program)
        assert marker is not None
        return f"hello\n{marker.group(0)}\n"  # what the wrapped program prints when it ends normally

    assert PythonTool(runner)({"code": "print('hello')"}, {}) == "hello"
    assert "exec(compile(" in seen[0]
