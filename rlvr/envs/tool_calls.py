"""Tool-call formats: how calls are parsed from the model's text and how results are rendered back.

A format is an object with three methods (`ToolCallFormat`), so another convention plugs in by passing a
different object (or naming one by import path "pkg.module:Class" to `get_format`):

- `parse(text) -> ParsedCalls`: the calls in one policy turn plus one error string per malformed call;
- `render(results) -> str`: the observation content for those calls' results;
- `describe(tools) -> str`: the instructions for a system prompt (tool schemas and the call syntax).

Formats: `QwenFormat` ("qwen", the default) and `CompactFormat` ("compact": `?K3` -> "4821", for tiny models).
The default, `QwenFormat`, is the Hermes/Qwen2.5 convention:

    <tool_call>
    {"name": "lookup", "arguments": {"key": "K"}}
    </tool_call>

answered by one `<tool_response>...</tool_response>` block per call, in call order.

Invariants: `parse` never raises on model output. A block that is not a JSON object with a string "name" and an
object "arguments" (a JSON string holding an object is accepted), an unclosed `<tool_call>`, a block longer than
`max_call_chars`, and calls past `max_calls` are each reported as one error; the well-formed calls are kept.
"""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ToolSpec:
    """A tool as the model is told about it: name, description and JSON-schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)

    def schema(self) -> dict[str, Any]:
        """The OpenAI/Qwen function schema of this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: tool name and keyword arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedCalls:
    """The result of parsing one turn: well-formed calls and one message per malformed one; `other_text` is the
    turn's text outside the calls' markup (empty for a turn that is nothing but calls; `QwenFormat` strips the
    whitespace around its blocks, `CompactFormat` keeps every character, since for a tiny model a space or a newline
    is a token that moves what follows)."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    other_text: str = ""


@dataclass
class ToolResult:
    """The outcome of one call. `ok` False means an error observation; `reason` is the counted cause
    ("timeout", "crash", "unknown_tool", "bad_arguments", "parse_error", ...); `truncated` marks a capped output."""

    name: str
    content: str
    ok: bool = True
    reason: str | None = None
    latency_s: float = 0.0
    truncated: bool = False


class ToolCallFormat(Protocol):
    """A pluggable tool-call convention (module docstring)."""

    def parse(self, text: str) -> ParsedCalls:
        """Calls and malformed-call errors found in one policy turn; never raises."""
        ...

    def render(self, results: list[ToolResult]) -> str:
        """The observation content answering `results` (in call order)."""
        ...

    def describe(self, tools: list[ToolSpec]) -> str:
        """System-prompt instructions: the tools' schemas and how to call them."""
        ...


def _arguments(value: Any) -> dict[str, Any] | None:
    """The call's arguments as a dict (a JSON string holding an object is accepted), else None."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


class QwenFormat:
    """`<tool_call>{json}</tool_call>` calls, `<tool_response>` results (module docstring)."""

    open_tag, close_tag = "<tool_call>", "</tool_call>"
    response_open, response_close = "<tool_response>", "</tool_response>"

    def __init__(self, max_calls: int = 4, max_call_chars: int = 20_000) -> None:
        self.max_calls = max_calls
        self.max_call_chars = max_call_chars
        self._block = re.compile(re.escape(self.open_tag) + r"(.*?)" + re.escape(self.close_tag), re.DOTALL)

    def parse(self, text: str) -> ParsedCalls:
        out = ParsedCalls()
        end = 0
        for match in self._block.finditer(text):
            end = match.end()
            if len(out.calls) + len(out.errors) >= self.max_calls:
                out.errors.append(f"too many tool calls in one turn (at most {self.max_calls})")
                break
            call, error = self._parse_one(match.group(1))
            if call is not None:
                out.calls.append(call)
            else:
                out.errors.append(error)
        if self.open_tag in text[end:]:
            out.errors.append(f"unclosed {self.open_tag}: expected {self.close_tag}")
        out.other_text = self._block.sub("", text).strip()
        return out

    def _parse_one(self, body: str) -> tuple[ToolCall | None, str]:
        body = body.strip()
        if len(body) > self.max_call_chars:
            return None, f"tool call longer than {self.max_call_chars} characters"
        try:
            obj = json.loads(body)
        except ValueError as e:
            return None, f"tool call is not valid JSON ({e})"
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return None, 'tool call must be a JSON object with a string "name"'
        arguments = _arguments(obj.get("arguments", {}))
        if arguments is None:
            return None, f'tool call {obj["name"]!r}: "arguments" must be a JSON object'
        return ToolCall(obj["name"], arguments), ""

    def render(self, results: list[ToolResult]) -> str:
        return "\n".join(f"{self.response_open}\n{r.content}\n{self.response_close}" for r in results)

    def describe(self, tools: list[ToolSpec]) -> str:
        schemas = "\n".join(json.dumps(t.schema()) for t in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{schemas}\n</tools>\n\nFor each function call, return a json object with function name and "
            f"arguments within {self.open_tag}{self.close_tag} XML tags:\n{self.open_tag}\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n' + self.close_tag
        )


class CompactFormat:
    r"""`?K3` calls one tool (`tool`, default `lookup`) with `{argument: key_prefix + "K3"}`; the observation is the
    results' contents joined by spaces (e.g. "4821"). For tiny models: a call is a few tokens, and every character
    is one the lookup task's prompts already use. A turn without `?NAME` is the final answer.

    `error_text`, when given, renders a failed call as that text instead of the error message (a tiny model's
    vocabulary has no letters for "error: no entry ..."); `description` is what `describe` returns (the call
    syntax; "" to leave the system prompt without it). `call_pattern` is the regular expression of one call
    (group 1: the key), e.g. r"([A-Za-z0-9_]+)\?" for postfix calls `K3?`; `stop_strings` end a policy turn
    (with a postfix call, "?" ends the turn right at the call). `result_suffix` is appended to every observation
    (a delimiter such as "=" marks where the observation ends and the answer starts)."""

    def __init__(
        self,
        tool: str = "lookup",
        argument: str = "key",
        key_prefix: str = "item ",
        max_calls: int = 2,
        error_text: str | None = None,
        description: str = "Look up the code of item K3 with ?K3",
        call_pattern: str = r"\?\s*([A-Za-z0-9_]+)",
        stop_strings: tuple[str, ...] | list[str] = (),
        result_suffix: str = "",
    ):
        self.result_suffix = result_suffix
        self.tool, self.argument, self.key_prefix, self.max_calls = tool, argument, key_prefix, max_calls
        self.error_text, self.description = error_text, description
        self.stop_strings = list(stop_strings)
        self._call = re.compile(call_pattern)

    def parse(self, text: str) -> ParsedCalls:
        out = ParsedCalls()
        for match in self._call.finditer(text):
            if len(out.calls) >= self.max_calls:
                out.errors.append(f"too many tool calls in one turn (at most {self.max_calls})")
                break
            out.calls.append(ToolCall(self.tool, {self.argument: self.key_prefix + match.group(1)}))
        out.other_text = self._call.sub("", text)  # not stripped: a tiny model's whitespace is a token that moves
        return out

    def render(self, results: list[ToolResult]) -> str:
        shown = " ".join(r.content if r.ok or self.error_text is None else self.error_text for r in results)
        return shown + self.result_suffix

    def describe(self, tools: list[ToolSpec]) -> str:
        return self.description


FORMATS: dict[str, type] = {"qwen": QwenFormat, "compact": CompactFormat}


def get_format(name: str, **params: Any) -> ToolCallFormat:
    """A format by name ("qwen") or import path "pkg.module:Class", built with `params`."""
    if name in FORMATS:
        return FORMATS[name](**params)
    module_name, _, attr = name.partition(":")
    if not attr:
        raise ValueError(
            f"unknown tool-call format {name!r}; known: {', '.join(FORMATS)} "
            "(or give an import path 'pkg.module:Class')"
        )
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot load tool-call format {name!r}: {e}") from e
    return cls(**params)
