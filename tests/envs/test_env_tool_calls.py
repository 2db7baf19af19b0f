"""The Qwen-style tool-call format: well-formed calls, malformed input, rendering, pluggability."""

from __future__ import annotations

import json

import pytest

from rlvr.envs.tool_calls import QwenFormat, ToolResult, ToolSpec, get_format


def _call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_parses_calls_in_order_and_ignores_text_around() -> None:
    text = (
        f"<think>plan</think>Let me look.{_call('lookup', key='item K3')} and {_call('calculator', expression='1+2')}"
    )
    parsed = QwenFormat().parse(text)
    assert parsed.errors == []
    assert [(c.name, c.arguments) for c in parsed.calls] == [
        ("lookup", {"key": "item K3"}),
        ("calculator", {"expression": "1+2"}),
    ]
    assert parsed.other_text == "<think>plan</think>Let me look. and"
    assert QwenFormat().parse(f"\n{_call('lookup', key='K3')}\n").other_text == ""  # nothing but the call


def test_no_call_is_a_final_answer() -> None:
    parsed = QwenFormat().parse("The answer is \\boxed{42}.")
    assert parsed.calls == [] and parsed.errors == []


def test_arguments_given_as_a_json_string_are_accepted() -> None:
    text = '<tool_call>{"name": "lookup", "arguments": "{\\"key\\": \\"A1\\"}"}</tool_call>'
    assert QwenFormat().parse(text).calls[0].arguments == {"key": "A1"}


@pytest.mark.parametrize(
    "body",
    [
        '{"name": "lookup", "arguments": {"key": "A1"}',  # truncated JSON
        "not json at all",
        '["lookup", {"key": "A1"}]',  # not an object
        '{"arguments": {"key": "A1"}}',  # no name
        '{"name": "", "arguments": {}}',  # empty name
        '{"name": "lookup", "arguments": [1, 2]}',  # arguments not an object
        '{"name": "lookup", "arguments": "{broken"}',  # arguments string that is not JSON
    ],
)
def test_malformed_calls_become_errors_and_good_ones_are_kept(body: str) -> None:
    parsed = QwenFormat().parse(f"<tool_call>{body}</tool_call>{_call('calculator', expression='2*3')}")
    assert len(parsed.errors) == 1
    assert [c.name for c in parsed.calls] == ["calculator"]


def test_unclosed_call_oversized_call_and_too_many_calls() -> None:
    fmt = QwenFormat(max_calls=2, max_call_chars=100)
    assert fmt.parse('<tool_call>{"name": "lookup"').errors[0].startswith("unclosed")
    assert "longer than" in fmt.parse(_call("python", code="x" * 500)).errors[0]
    parsed = fmt.parse(_call("a") + _call("b") + _call("c"))
    assert [c.name for c in parsed.calls] == ["a", "b"] and "too many" in parsed.errors[0]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "<tool_call>",
        "</tool_call>",
        "<tool_call></tool_call>",
        "\x00\xff{{{",
        "<tool_call>" * 1000,
        '<tool_call>{"name": 1e999999}</tool_call>',
    ],
)
def test_parse_never_raises(text: str) -> None:
    parsed = QwenFormat().parse(text)
    assert isinstance(parsed.calls, list) and isinstance(parsed.errors, list)


def test_render_and_describe() -> None:
    fmt = QwenFormat()
    rendered = fmt.render([ToolResult("lookup", "1234"), ToolResult("calculator", "error: x", ok=False)])
    assert rendered == "<tool_response>\n1234\n</tool_response>\n<tool_response>\nerror: x\n</tool_response>"
    described = fmt.describe([ToolSpec("lookup", "Look up.", {"type": "object"})])
    assert '"name": "lookup"' in described and "<tool_call>" in described


class _BracketFormat(QwenFormat):
    """Another convention: [[call]]{json}[[/call]]."""

    open_tag, close_tag = "[[call]]", "[[/call]]"


def test_formats_are_pluggable_by_name_and_import_path() -> None:
    assert isinstance(get_format("qwen"), QwenFormat)
    fmt = get_format(f"{__name__}:_BracketFormat")
    assert fmt.parse('[[call]]{"name": "x", "arguments": {}}[[/call]]').calls[0].name == "x"
    with pytest.raises(ValueError, match="unknown tool-call format"):
        get_format("nope")
