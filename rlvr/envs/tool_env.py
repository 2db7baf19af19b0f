"""`ToolEnv`: a tool-calling environment whose final answer is checked by an existing verifier.

Episode: the first observation is a system message (instructions plus the tool-call format's description of
the tools) and the row's prompt. Each policy turn is parsed with the tool-call format:

- calls (or malformed calls) -> every call is executed by the tool set (`tools`: names, or any `ToolExecutor` such
  as a `ToolSet` or a `ProcessToolSet`; contained: timeouts, errors and output caps, see rlvr/envs/tools.py), and the results are the next observation; a malformed call gets an error
  result (reason "parse_error"). With `end_on_tool_error`, any failed call ends the episode instead, reason
  "tool_error";
- no call at all -> the turn is the final answer: the row's verifier (`row["verifier"]`, else the env's
  `verifier`) scores it from the row's metadata, reward term `verifier name -> score`, and the episode is done.

Step metrics (summed per episode by the loop): `tool_calls`, `tool_errors`, `tool_latency_s`, and one
`tool_error/<reason>` counter per failure reason ("timeout", "crash", "parse_error", "unknown_tool", ...);
`answered` is 1 on the final-answer step, `unscored` 1 when the verifier returned None.
"""

from __future__ import annotations

from typing import Any

from rlvr.envs.base import Observation, StepResult
from rlvr.envs.tool_calls import ToolCallFormat, ToolResult, get_format
from rlvr.envs.tools import ToolExecutor, build_toolset

DEFAULT_INSTRUCTIONS = (
    "Solve the task. Call the tools when you need them; when you know the answer, reply "
    "without a tool call and put the final answer in \\boxed{}."
)


class ToolEnv:
    """The tool-calling environment (module docstring); one instance per episode."""

    def __init__(
        self,
        tools: list[str] | ToolExecutor | None = None,
        tool_format: str | ToolCallFormat = "qwen",
        verifier: str = "math",
        instructions: str = DEFAULT_INSTRUCTIONS,
        end_on_tool_error: bool = False,
        max_output_chars: int = 2000,
    ) -> None:
        if tools is None or isinstance(tools, (list, tuple)):
            tools = build_toolset(list(tools or ["calculator"]), max_output_chars)
        self.tools: ToolExecutor = tools
        self.format = get_format(tool_format) if isinstance(tool_format, str) else tool_format
        self.verifier = verifier
        self.instructions = instructions
        self.end_on_tool_error = end_on_tool_error
        self.row: dict[str, Any] = {}

    def reset(self, row: dict[str, Any]) -> Observation:
        self.row = row
        system = f"{self.instructions}\n\n{self.format.describe(self.tools.specs())}"
        return Observation(
            messages=[{"role": "system", "content": system}, {"role": "user", "content": str(row["prompt"])}]
        )

    def step(self, turn_text: str, turn_token_ids: list[int]) -> StepResult:
        parsed = self.format.parse(turn_text)
        if not parsed.calls and not parsed.errors:
            return self._final_answer(turn_text)
        results = [self.tools.execute(call, self.row) for call in parsed.calls]
        results += [ToolResult("?", f"error: {error}", ok=False, reason="parse_error") for error in parsed.errors]
        metrics = _tool_metrics(results)
        if self.end_on_tool_error and metrics["tool_errors"] > 0:
            return StepResult(None, done=True, reason="tool_error", metrics=metrics)
        return StepResult(Observation(text=self.format.render(results)), metrics=metrics)

    def _final_answer(self, turn_text: str) -> StepResult:
        from rlvr.rewards.registry import get_reward  # the reward registry is only needed to score

        name = str(self.row.get("verifier") or self.verifier)
        metadata = {**self.row, **(self.row.get("metadata") or {})}
        score = get_reward(name).fn(turn_text, metadata)
        terms = {} if score is None else {name: float(score)}
        return StepResult(
            None, terms, done=True, reason="done", metrics={"answered": 1.0, "unscored": float(score is None)}
        )


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
