"""`ToolEnv`: a tool-calling environment whose final answer is checked by an existing verifier.

Episode: the first observation is a system message (instructions plus the tool-call format's description of
the tools) and the row's prompt. Each policy turn is parsed with the tool-call format:

- calls (or malformed calls) -> every call is executed by the tool set (`tools`: names, or any `ToolExecutor` such
  as a `ToolSet` or a `ProcessToolSet`; contained: timeouts, errors and output caps, see rlvr/envs/tools.py), and the results are the next observation; a malformed call gets an error
  result (reason "parse_error"). With `end_on_tool_error`, any failed call ends the episode instead, reason
  "tool_error";
- no call at all -> the turn is the final answer: the row's verifier (`row["verifier"]`, else the env's
  `verifier`) scores it from the row's metadata, reward term `verifier name -> score`, and the episode is done.

Shaping and text: `call_reward` adds a reward term `tool_call` once per episode, at the first step whose calls
all succeeded (a small well-formed-call term), and `clean_call_reward` a term `clean_call` at that step when the
turn holds nothing but its calls (`ParsedCalls.other_text` empty); `require_call` scores a final answer 0 (metric
`answered_without_call`) unless such a step came before it, so a guess earns no partial credit; after
`max_call_turns` turns with calls, the next turn is the final answer whatever it contains; `strip_suffixes` are
removed from the end of a turn before it is parsed or scored, and a stop string the answer turn ended on (the
format's turn delimiter, e.g. the compact format's "?") before it is scored. With no instructions and an empty format description, the first observation is the prompt
alone (no system message).

Staged (rlvr/envs/jobs.py): `begin_step` hands out the calls and the answer check as jobs; the collector runs them in
the verifier pool's workers, `step` runs them in process.

Step metrics (summed per episode by the loop): `tool_calls`, `tool_errors`, `tool_latency_s`, and one
`tool_error/<reason>` counter per failure reason ("timeout", "crash", "parse_error", "unknown_tool", ...);
`answered` is 1 on the final-answer step, `unscored` 1 when the verifier returned None.
"""

from __future__ import annotations

from typing import Any

from rlvr.envs.base import Observation, StepResult
from rlvr.envs.jobs import Job, JobFailure, PendingStep, execute_tool, run_local, verify_answer
from rlvr.envs.tool_calls import ParsedCalls, ToolCall, ToolCallFormat, ToolResult, get_format
from rlvr.envs.tools import ToolExecutor, build_toolset

DEFAULT_INSTRUCTIONS = (
    "Solve the task. Call the tools when you need them; when you know the answer, reply "
    "without a tool call and put the final answer in \\boxed{}."
)


class ToolEnv:
    """The tool-calling environment (module docstring); one instance per episode.

    Staged (rlvr/envs/jobs.py): `begin_step` parses the turn and hands out the tool calls (or the answer check) as
    jobs, `end_step` turns their outputs into the step's result; `step` does both, running the jobs in process.
    Jobs need tool names (`tools` given as names): a `ToolExecutor` object is run in process by `step` only."""

    def __init__(
        self,
        tools: list[str] | ToolExecutor | None = None,
        tool_format: str | ToolCallFormat = "qwen",
        verifier: str = "math",
        instructions: str = DEFAULT_INSTRUCTIONS,
        end_on_tool_error: bool = False,
        max_output_chars: int = 2000,
        timeout_s: float | None = None,
        call_reward: float = 0.0,
        clean_call_reward: float = 0.0,
        require_call: bool = False,
        max_call_turns: int | None = None,
        strip_suffixes: tuple[str, ...] | list[str] = (),
    ) -> None:
        self.tool_names: tuple[str, ...] | None = None
        if tools is None or isinstance(tools, (list, tuple)):
            self.tool_names = tuple(tools or ["calculator"])
            tools = build_toolset(list(self.tool_names), max_output_chars, timeout_s)
        self.tools: ToolExecutor = tools
        self.format = get_format(tool_format) if isinstance(tool_format, str) else tool_format
        self.stop_strings: list[str] = list(getattr(self.format, "stop_strings", []))
        """Where a policy turn should stop besides EOS (the format's, e.g. the end of a compact call)."""
        self.verifier = verifier
        self.instructions = instructions
        self.end_on_tool_error = end_on_tool_error
        self.max_output_chars = max_output_chars
        self.timeout_s = timeout_s
        self.call_reward = call_reward
        """Reward term `tool_call`, earned once per episode by the first step whose calls all succeeded."""
        self.clean_call_reward = clean_call_reward
        """Reward term `clean_call`, earned with `tool_call` when that turn holds nothing but its calls (no text
        around them): a call the observation can follow at a fixed place."""
        self.strip_suffixes = tuple(strip_suffixes)
        """Text removed from the end of a turn before it is parsed or scored (e.g. the tokenizer's EOS text,
        which the episode loop's decoding keeps)."""
        self.require_call = require_call
        """Score a final answer 0 (without running the verifier) unless a call succeeded earlier in the episode."""
        self.max_call_turns = max_call_turns
        """Turns that may call tools; the turn after them is the final answer whatever it contains."""
        self._call_rewarded = False
        self._called = False
        self._call_turns = 0
        self._limits = {t.spec.name: t.timeout_s for t in getattr(tools, "tools", {}).values()}
        self.row: dict[str, Any] = {}

    def reset(self, row: dict[str, Any]) -> Observation:
        self.row = row
        self._call_rewarded = False
        self._called = False
        self._call_turns = 0
        parts = [p for p in (self.instructions, self.format.describe(self.tools.specs())) if p]
        user = {"role": "user", "content": str(row["prompt"])}
        if not parts:  # nothing to say: the prompt alone (tiny models)
            return Observation(messages=[user])
        return Observation(messages=[{"role": "system", "content": "\n\n".join(parts)}, user])

    def step(self, turn_text: str, turn_token_ids: list[int]) -> StepResult:
        begun = self.begin_step(turn_text, turn_token_ids)
        if isinstance(begun, StepResult):
            return begun
        if begun.state["kind"] == "tools" and self.tool_names is None:  # a ToolExecutor object: its own containment
            outputs: list[Any] = [self.tools.execute(call, self.row) for call in begun.state["calls"]]
        else:
            outputs = [run_local(job) for job in begun.jobs]
        return self.end_step(begun, outputs)

    def begin_step(self, turn_text: str, turn_token_ids: list[int]) -> StepResult | PendingStep:
        """The turn's tool calls (or its answer check) as jobs; parse errors alone finish the step here."""
        for suffix in self.strip_suffixes:
            if suffix and turn_text.endswith(suffix):
                turn_text = turn_text[: -len(suffix)]
        if self.max_call_turns is not None and self._call_turns >= self.max_call_turns:
            parsed = ParsedCalls()  # the call budget is spent: this turn is the answer
        else:
            parsed = self.format.parse(turn_text)
        if not parsed.calls and not parsed.errors:
            for stop in self.stop_strings:  # the turn's delimiter, like EOS: not part of the answer
                if stop and turn_text.endswith(stop):
                    turn_text = turn_text[: -len(stop)]
                    break
            name = str(self.row.get("verifier") or self.verifier)
            if self.require_call and not self._called:
                metrics = {"answered": 1.0, "unscored": 0.0, "answered_without_call": 1.0}
                return StepResult(None, {name: 0.0}, done=True, reason="done", metrics=metrics)
            metadata = {**self.row, **(self.row.get("metadata") or {})}
            job = Job(verify_answer, (name, turn_text, metadata), self.timeout_s or 10.0, kind="verify")
            return PendingStep([job], {"kind": "answer", "verifier": name})
        calls = list(parsed.calls)
        self._call_turns += 1
        jobs = [
            Job(
                execute_tool,
                (self.tool_names, self.max_output_chars, self.timeout_s, call, self.row),
                self._limits.get(call.name, 1.0),
            )
            for call in calls
        ]
        clean = parsed.other_text in ("", *self.stop_strings)  # the turn's own delimiter is not extra text
        state = {"kind": "tools", "calls": calls, "errors": list(parsed.errors), "clean": clean}
        pending = PendingStep(jobs, state)
        return pending if jobs else self.end_step(pending, [])

    def end_step(self, pending: PendingStep, outputs: list[Any]) -> StepResult:
        """The step's result from its jobs' outputs (a `JobFailure` is an error result or an unscored answer)."""
        if pending.state["kind"] == "answer":
            [score] = outputs
            name = pending.state["verifier"]
            failed = isinstance(score, JobFailure)
            terms = {} if score is None or failed else {name: float(score)}
            metrics = {"answered": 1.0, "unscored": float(score is None or failed)}
            if failed:
                metrics[f"verify_error/{score.reason}"] = 1.0
            return StepResult(None, terms, done=True, reason="done", metrics=metrics)
        results = [_as_result(call, out) for call, out in zip(pending.state["calls"], outputs)]
        results += [
            ToolResult("?", f"error: {error}", ok=False, reason="parse_error") for error in pending.state["errors"]
        ]
        metrics = _tool_metrics(results)
        if self.end_on_tool_error and metrics["tool_errors"] > 0:
            return StepResult(None, done=True, reason="tool_error", metrics=metrics)
        call_terms: dict[str, float] = {}
        if results and all(r.ok for r in results):
            self._called = True
            if (self.call_reward or self.clean_call_reward) and not self._call_rewarded:
                self._call_rewarded = True
                if self.call_reward:
                    call_terms["tool_call"] = self.call_reward
                if self.clean_call_reward and pending.state.get("clean"):
                    call_terms["clean_call"] = self.clean_call_reward
        return StepResult(Observation(text=self.format.render(results)), call_terms, metrics=metrics)


def _as_result(call: ToolCall, output: Any) -> ToolResult:
    """A tool job's output as a `ToolResult` (a timed-out or crashed job: an error result with its reason)."""
    if isinstance(output, ToolResult):
        return output
    if isinstance(output, JobFailure):
        return ToolResult(
            call.name, f"error: {output.message}", ok=False, reason=output.reason, latency_s=output.latency_s
        )
    return ToolResult(call.name, f"error: tool returned {type(output).__name__}", ok=False, reason="crash")


def _tool_metrics(results: list[ToolResult]) -> dict[str, float]:
    """Counters of one step's tool results (module docstring)."""
    metrics = {
        "tool_calls": float(sum(r.reason != "parse_error" for r in results)),
        "tool_errors": float(sum(not r.ok for r in results)),
        "tool_latency_s": sum(r.latency_s for r in results),
    }
    for r in results:
        if r.reason is not None:
            key = f"tool_error/{r.reason}" if not r.ok else f"tool_{r.reason}"
            metrics[key] = metrics.get(key, 0.0) + 1.0
    return metrics
