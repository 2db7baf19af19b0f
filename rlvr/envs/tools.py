"""The tool set: `calculator`, `python` (in the code sandbox), `lookup` (a table given by the row) and user tools.

A `Tool` is a spec (what the model is told) plus a function `fn(arguments, row) -> str`. `ToolSet.execute`
runs one call and always returns a `ToolResult`, never raises and never stalls:

- each call runs in its own daemon thread and is waited for at most `Tool.timeout_s`; a call still running
  then is abandoned (its thread is left to finish on its own and counted in `ToolSet.abandoned`) and answered
  with an error observation, reason "timeout". In-process tools must therefore be cheap and side-effect free;
  code that may hang for real runs out of process: the `python` tool runs in the code sandbox
  (`rlvr.rewards.sandbox`), whose launcher kills the program at its time limit;
- an exception is an error observation: reason "tool_error" for `ToolError` (the tool's own message, e.g. an
  unknown key), "bad_arguments" for a `TypeError` raised by the call itself, "crash" for anything else;
- output longer than `max_output_chars` is cut, marked in the text and counted (reason "output_truncated",
  still ok); unknown tool names give reason "unknown_tool".

The `python` tool takes a `ProgramRunner` (`program -> stdout or None`): by default a `LocalSandboxExecutor`'s
`run_capture`, the same sandbox the `code` verifiers use; the integration may pass one that goes through the
verifier pool instead. The program is wrapped so that its stderr and any traceback go to stdout and a per-call
nonce marks a normal end: no end marker means it was killed (time limit, crash, output or memory limit).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import operator
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from rlvr.envs.tool_calls import ToolCall, ToolResult, ToolSpec

ToolFn = Callable[[dict[str, Any], dict[str, Any]], str]
"""fn(arguments, row) -> output text."""
ProgramRunner = Callable[[str], "str | None"]
"""program -> its stdout (capped), or None when the sandbox itself failed."""


class ToolError(Exception):
    """A tool's expected failure (bad input, missing key): its message becomes the observation."""


def required(arguments: dict[str, Any], name: str) -> Any:
    """The argument `name`, or a ToolError saying it is missing (the model's mistake, not a crash)."""
    if name not in arguments:
        raise ToolError(f"missing argument {name!r}")
    return arguments[name]


@dataclass(frozen=True)
class Tool:
    """A callable tool: what the model is told (`spec`), the function, and the wall-clock limit per call."""

    spec: ToolSpec
    fn: ToolFn
    timeout_s: float = 5.0


class ToolExecutor(Protocol):
    """What an environment needs from a tool set: the specs to describe, and contained execution of one call.
    Implemented in process by `ToolSet` and in a child process by `rlvr.envs.tool_process.ProcessToolSet`."""

    def specs(self) -> list[ToolSpec]: ...

    def execute(self, call: ToolCall, row: dict[str, Any]) -> ToolResult: ...


def _truncate(text: str, max_chars: int) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    return text[:max_chars] + f"\n... [output truncated: {len(text) - max_chars} more characters]", True


class ToolSet:
    """Named tools and the contained execution of calls (module docstring)."""

    def __init__(self, tools: list[Tool], max_output_chars: int = 2000) -> None:
        self.tools = {t.spec.name: t for t in tools}
        if len(self.tools) != len(tools):
            raise ValueError(f"duplicate tool names in {[t.spec.name for t in tools]}")
        self.max_output_chars = max_output_chars
        self.abandoned = 0  # calls that outlived their timeout (threads left running)

    def specs(self) -> list[ToolSpec]:
        """The specs of every tool, in registration order."""
        return [t.spec for t in self.tools.values()]

    def execute(self, call: ToolCall, row: dict[str, Any]) -> ToolResult:
        """Run one call with its timeout; always a result (module docstring)."""
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolResult(
                call.name,
                f"error: unknown tool {call.name!r}; available: {', '.join(self.tools)}",
                ok=False,
                reason="unknown_tool",
            )
        start = time.monotonic()
        box: dict[str, Any] = {}
        thread = threading.Thread(
            target=_run_into, args=(tool.fn, call.arguments, row, box), daemon=True, name=f"tool-{call.name}"
        )
        thread.start()
        thread.join(tool.timeout_s)
        latency = time.monotonic() - start
        if thread.is_alive():
            self.abandoned += 1
            return ToolResult(
                call.name,
                f"error: tool {call.name!r} timed out after {tool.timeout_s:g}s",
                ok=False,
                reason="timeout",
                latency_s=latency,
            )
        if "error" in box:
            reason, message = box["error"]
            content, _ = _truncate(f"error: {message}", self.max_output_chars)
            return ToolResult(call.name, content, ok=False, reason=reason, latency_s=latency)
        content, truncated = _truncate(str(box.get("output", "")), self.max_output_chars)
        return ToolResult(
            call.name,
            content,
            ok=True,
            reason="output_truncated" if truncated else None,
            latency_s=latency,
            truncated=truncated,
        )


def _run_into(fn: ToolFn, arguments: dict[str, Any], row: dict[str, Any], box: dict[str, Any]) -> None:
    """Thread body: the tool's output or its classified error into `box`."""
    try:
        box["output"] = fn(arguments, row)
    except ToolError as e:
        box["error"] = ("tool_error", str(e)[:500])
    except TypeError as e:
        box["error"] = ("bad_arguments", f"{type(e).__name__}: {e}"[:500])
    except BaseException as e:  # trust boundary: whatever a tool does, the episode gets an observation
        box["error"] = ("crash", f"{type(e).__name__}: {e}"[:500])


# ---- calculator -------------------------------------------------------------------------------------------

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION_CHARS = 200
MAX_MAGNITUDE = 1e100


def evaluate_arithmetic(expression: str) -> int | float:
    """The value of an arithmetic expression: numbers, + - * / // % **, unary signs and parentheses only
    (an `ast` walk, no eval). Raises ToolError for anything else, division by zero or huge values."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ToolError(f"not an arithmetic expression: {e.msg}") from None
    return _eval_node(tree.body)


def _eval_node(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval_node(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 1000:
            raise ToolError("exponent too large")
        try:
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("result too large") from None
    raise ToolError(f"unsupported syntax: {type(node).__name__}")


def _bounded(value: int | float) -> int | float:
    if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
        raise ToolError("result too large or not real")
    return value


def _calculator(arguments: dict[str, Any], row: dict[str, Any]) -> str:
    value = evaluate_arithmetic(str(required(arguments, "expression")))
    return str(int(value)) if isinstance(value, float) and value.is_integer() and abs(value) < 1e15 else str(value)


def calculator_tool(timeout_s: float = 2.0) -> Tool:
    """`calculator(expression)`: safe arithmetic."""
    spec = ToolSpec(
        "calculator",
        "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
        {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    )
    return Tool(spec, _calculator, timeout_s)


# ---- lookup -----------------------------------------------------------------------------------------------


def _lookup(arguments: dict[str, Any], row: dict[str, Any]) -> str:
    table = row.get("table", row.get("metadata", {}).get("table"))
    if not isinstance(table, dict):
        raise ToolError("this task has no lookup table")
    key = str(required(arguments, "key")).strip()
    if key not in table:
        raise ToolError(f"no entry for key {key!r}; keys: {', '.join(list(map(str, table))[:20])}")
    return str(table[key])


def lookup_tool(timeout_s: float = 2.0) -> Tool:
    """`lookup(key)`: the value of `key` in the row's table (`row["table"]` or `row["metadata"]["table"]`)."""
    spec = ToolSpec(
        "lookup",
        "Look up the value stored under a key in this task's table.",
        {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    )
    return Tool(spec, _lookup, timeout_s)


# ---- python (code sandbox) --------------------------------------------------------------------------------

_WRAPPER = """import sys, traceback
sys.stderr = sys.stdout
_source = {source!r}
try:
    exec(compile(_source, "<tool>", "exec"), {{"__name__": "__main__"}})
except SystemExit:
    pass
except BaseException:
    traceback.print_exc(file=sys.stdout)
    print({error!r}, flush=True)
else:
    print({ok!r}, flush=True)
"""


def sandbox_runner(timeout_s: float = 4.0, max_output_bytes: int = 64 * 1024) -> ProgramRunner:
    """`run_capture` of a `LocalSandboxExecutor` with a time limit and an output cap (writes past 16x the cap
    kill the program through RLIMIT_FSIZE, so a flood ends early)."""
    from rlvr.rewards.sandbox import LocalSandboxExecutor, SandboxLimits

    limits = SandboxLimits(
        test_timeout_s=timeout_s, max_output_bytes=max_output_bytes, file_size_bytes=16 * max_output_bytes
    )
    return LocalSandboxExecutor(limits).run_capture


class PythonTool:
    """The `python(code)` tool function: runs `code` through a `ProgramRunner` (module docstring)."""

    def __init__(self, runner: ProgramRunner, timeout_s: float = 4.0) -> None:
        self.runner = runner
        self.timeout_s = timeout_s

    def __call__(self, arguments: dict[str, Any], row: dict[str, Any]) -> str:
        nonce = secrets.token_hex(8)
        ok, error = f"__tool_ok_{nonce}__", f"__tool_error_{nonce}__"
        start = time.monotonic()
        output = self.runner(_WRAPPER.format(source=str(required(arguments, "code")), ok=ok, error=error))
        if output is None:
            raise RuntimeError("the code sandbox failed to run the program")
        body = output.rstrip("\n")
        if body.endswith(ok):
            return body[: -len(ok)].rstrip("\n")
        if body.endswith(error):
            raise ToolError("the program raised an exception:\n" + body[: -len(error)].rstrip("\n")[-1500:])
        cause = "time limit" if time.monotonic() - start >= self.timeout_s else "crash, output or memory limit"
        raise ToolError(f"the program was killed ({cause}) before finishing; its output so far:\n" + body[:1500])


def python_tool(runner: ProgramRunner | None = None, timeout_s: float = 4.0) -> Tool:
    """`python(code)`: run a program in the code sandbox and see its stdout (with stderr and tracebacks).
    The outer timeout leaves room for the sandbox's own start-up and kill before the call is abandoned."""
    spec = ToolSpec(
        "python",
        "Run a Python program and return what it prints.",
        {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    )
    fn = PythonTool(runner or sandbox_runner(timeout_s), timeout_s)
    return Tool(spec, fn, timeout_s + 20.0)


# ---- user tools -------------------------------------------------------------------------------------------


def load_user_tool(path: str, timeout_s: float = 5.0) -> Tool:
    """A tool named by import path "pkg.module:attr": a `Tool` object as is, or a function `fn(**arguments)`
    wrapped into one (its name, first docstring line and parameter names make the spec)."""
    module_name, _, attr = path.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"cannot load tool {path!r}: {e}") from e
    if isinstance(obj, Tool):
        return obj
    if not callable(obj):
        raise ValueError(f"tool {path!r} is neither a Tool nor callable")
    params = [p for p in inspect.signature(obj).parameters]
    spec = ToolSpec(
        attr,
        (inspect.getdoc(obj) or attr).splitlines()[0],
        {"type": "object", "properties": {p: {} for p in params}, "required": params},
    )
    return Tool(spec, lambda arguments, row: str(obj(**arguments)), timeout_s)


BUILTIN_TOOLS: dict[str, Callable[[], Tool]] = {
    "calculator": calculator_tool,
    "lookup": lookup_tool,
    "python": python_tool,
}


def build_toolset(names: list[str], max_output_chars: int = 2000, timeout_s: float | None = None) -> ToolSet:
    """A tool set from built-in names and user import paths; `timeout_s` (when given) is every tool's limit
    (the `python` tool keeps its extra room for the sandbox's start-up and kill)."""
    tools = [BUILTIN_TOOLS[n]() if n in BUILTIN_TOOLS else load_user_tool(n) for n in names]
    if timeout_s is not None:
        tools = [
            python_tool(timeout_s=timeout_s) if isinstance(t.fn, PythonTool) else replace(t, timeout_s=timeout_s)
            for t in tools
        ]
    return ToolSet(tools, max_output_chars)
