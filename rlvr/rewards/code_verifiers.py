"""Code verifiers: `code` (pass fraction) and `code_binary` (1 only if every test passes).

The program is the last fenced code block (```python ... ``` or ``` ... ```) after the reasoning block.
Tests come from `metadata["tests"]` or else `metadata["ground_truth"]`: a list (or a JSON string of a list)
of assert strings and/or `{"input": ..., "output": ...}` stdin/stdout cases (see rewards/sandbox.py). Assert
tests are judged outside the program's process and see only plain data from it (bool, int, float, str, bytes,
None and containers of them): a wrong program scores 0 however it tampers with its own interpreter.

Params: `executor_url` (str, default "": use the default executor, normally the local sandbox; else POST to
that sandbox service), `test_timeout_s` (per-test seconds for the local sandbox).

Invariants: no code block -> 0.0; no tests -> None; the program never runs in this process.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from rlvr.rewards.answer_text import final_answer_text
from rlvr.rewards.registration import register_reward
from rlvr.rewards.sandbox import CodeExecutor, LocalSandboxExecutor, RemoteExecutor, SandboxLimits, default_executor

_FENCE_RE = re.compile(r"```[ \t]*([\w+-]*)[ \t]*\n(.*?)```", re.DOTALL)


def last_code_block(text: str) -> str | None:
    """The body of the last fenced code block in `text`, or None."""
    blocks = _FENCE_RE.findall(text)
    return blocks[-1][1] if blocks else None


def parse_tests(metadata: dict) -> list[Any] | None:
    """The row's tests as a list (see module docstring), or None when it has none."""
    tests = metadata.get("tests", metadata.get("ground_truth"))
    if tests is None:
        return None
    if isinstance(tests, str):
        tests = json.loads(tests) if tests.lstrip().startswith(("[", "{")) else [tests]
    if isinstance(tests, dict) and "inputs" in tests:  # {"inputs": [...], "outputs": [...]} (APPS style)
        tests = [{"input": i, "output": o} for i, o in zip(tests["inputs"], tests["outputs"], strict=True)]
    if not isinstance(tests, list) or not all(isinstance(t, (str, dict)) for t in tests):
        raise ValueError(f"code: tests must be a list of assert strings or {{input, output}} dicts, got {tests!r:.200}")
    return tests


@functools.lru_cache(maxsize=16)
def _executor(executor_url: str, test_timeout_s: float) -> CodeExecutor:
    if executor_url:
        return RemoteExecutor(executor_url, max_execution_time=test_timeout_s)
    return LocalSandboxExecutor(SandboxLimits(test_timeout_s=test_timeout_s))


def _pass_results(completion_text: str, metadata: dict, executor_url: str, test_timeout_s: float) -> list[bool] | None:
    tests = parse_tests(metadata)
    if not tests:
        return None
    program = last_code_block(final_answer_text(completion_text))
    if program is None or not program.strip():
        return [False] * len(tests)
    if not executor_url and test_timeout_s == SandboxLimits.test_timeout_s:
        return default_executor().run(program, tests)  # not cached: set_default_executor may change it
    return _executor(executor_url, float(test_timeout_s)).run(program, tests)


@register_reward("code")
def code_reward(
    completion_text: str, metadata: dict, executor_url: str = "", test_timeout_s: float = SandboxLimits.test_timeout_s
) -> float | None:
    """Fraction of the row's tests that the last code block passes."""
    results = _pass_results(completion_text, metadata, executor_url, test_timeout_s)
    return None if results is None else sum(results) / len(results)


@register_reward("code_binary")
def code_binary_reward(
    completion_text: str, metadata: dict, executor_url: str = "", test_timeout_s: float = SandboxLimits.test_timeout_s
) -> float | None:
    """1.0 if the last code block passes every test, else 0.0."""
    results = _pass_results(completion_text, metadata, executor_url, test_timeout_s)
    return None if results is None else float(all(results))
