"""Work an environment step hands out instead of doing itself: tool calls and answer checks as `Job`s.

A staged environment (`StagedEnvironment`: `begin_step` / `end_step`, e.g. `ToolEnv`) splits a step in three:
`begin_step(turn)` returns either the finished `StepResult` or a list of `Job`s; whoever drives the episode runs
the jobs (the collector sends them to the verifier pool's isolated workers, `VerifierPool.run_tool`; the plain
loop `run_episode` runs them in process through `run_local`) and gives their outputs, in order, to
`end_step(outputs)`. An output is the job function's return value, or a `JobFailure` when the job timed out or
its worker died: the environment turns that into an error observation (a tool) or an unscored answer.

Job functions are module-level (picklable by reference), pure functions of their arguments, so any process can run
them: `execute_tool` builds the named tool set once per process and runs one call with its containment
(rlvr/envs/tools.py); `verify_answer` scores a final answer with a registered verifier.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rlvr.envs.base import StepResult
from rlvr.envs.tool_calls import ToolCall, ToolResult
from rlvr.envs.tools import ToolSet, build_toolset


@dataclass(frozen=True)
class Job:
    """One unit of work: `fn(*args)`, allowed `timeout_s` (the runner's hard limit adds its own grace)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    timeout_s: float
    kind: str = "tool"
    """"tool" (a tool call) or "verify" (an answer check): metrics and failure handling tell them apart."""


@dataclass
class JobFailure:
    """A job that gave no answer: reason "timeout" (killed at its limit) or "crash" (raised or its worker died)."""

    reason: str
    message: str
    latency_s: float = 0.0


@dataclass
class PendingStep:
    """What `begin_step` hands out: the jobs to run, and the environment's own notes for `end_step`."""

    jobs: list[Job]
    state: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class StagedEnvironment(Protocol):
    """An environment whose steps may need jobs run elsewhere (module docstring)."""

    def begin_step(self, turn_text: str, turn_token_ids: list[int]) -> StepResult | PendingStep: ...

    def end_step(self, pending: PendingStep, outputs: list[Any]) -> StepResult: ...


def run_local(job: Job) -> Any:
    """Run a job in this process (the plain episode loop); an exception becomes a `JobFailure`."""
    try:
        return job.fn(*job.args)
    except Exception as e:  # trust boundary: a user tool or verifier bug is this job's failure
        return JobFailure("crash", f"{type(e).__name__}: {e}"[:500])


_TOOLSETS: dict[tuple[tuple[str, ...], int, float | None], ToolSet] = {}


def execute_tool(
    names: tuple[str, ...], max_output_chars: int, timeout_s: float | None, call: ToolCall, row: dict[str, Any]
) -> ToolResult:
    """One tool call with the named tool set (built once per process and cached)."""
    key = (tuple(names), max_output_chars, timeout_s)
    tools = _TOOLSETS.get(key)
    if tools is None:
        tools = _TOOLSETS[key] = build_toolset(list(names), max_output_chars, timeout_s)
    return tools.execute(call, row)


def verify_answer(name: str, text: str, metadata: dict[str, Any]) -> float | None:
    """The registered verifier `name`'s score of a final answer (None: it could not score)."""
    from rlvr.rewards.registry import get_reward  # the reward registry is only needed to score

    score = get_reward(name).fn(text, metadata)
    return None if score is None else float(score)
