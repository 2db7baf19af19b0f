"""Built-in environments, registered on import (`rlvr.envs.registry` imports this module).

- `tool`: the generic `ToolEnv` (tools, format and verifier from params).
- `tool_lookup`: `ToolEnv` with the `lookup` tool over the row's hidden table, answer checked by `math`
  (rows from `rlvr.envs.tasks.lookup_rows`: the answer is only obtainable through the tool).
- `tool_lookup_tiny`: the lookup task for the random-init tiny CPU model (`builtin:tool-lookup` rows,
  configs/tools-cpu.yaml): postfix compact calls `B?` over the row's table ("?" also ends the turn), errors
  rendered as "!", every observation closed by "=" (the value then reads like the copy demo's prompt "dbe="),
  no instructions, the
  answer scored by the row's verifier (`copy`, partial credit per character) only after a successful call (a
  guess scores 0), a `tool_call` term of 0.1, and a `clean_call` term of 0.1 when the call turn is the call alone
  (`B?`, nothing written before it), which puts the observation at the same place in every episode. One turn may call; the turn after it is the answer.
- `math_python`: `ToolEnv` with the `python` (code sandbox) and `calculator` tools, answer checked by `math`
  (rows of any math dataset with a `ground_truth`, e.g. `builtin:arith-l5`).
"""

from __future__ import annotations

from typing import Any

from rlvr.envs.registration import register_env
from rlvr.envs.tool_calls import CompactFormat
from rlvr.envs.tool_env import ToolEnv

LOOKUP_INSTRUCTIONS = (
    "Answer the question. The values are hidden: call the lookup tool to read them. When you "
    "know the answer, reply without a tool call and put it in \\boxed{}."
)
MATH_PYTHON_INSTRUCTIONS = (
    "Solve the math problem. You may run Python with the python tool (print what you "
    "need) or use the calculator. Put the final answer in \\boxed{}."
)

register_env("tool")(ToolEnv)


@register_env("tool_lookup")
def tool_lookup_env(**params: Any) -> ToolEnv:
    """`ToolEnv` with only the `lookup` tool, verifier `math`."""
    return ToolEnv(**{"tools": ["lookup"], "verifier": "math", "instructions": LOOKUP_INSTRUCTIONS, **params})


TINY_EOS = "<|endoftext|>"
"""The tiny model's EOS text (rlvr/models/tiny.py), which closes its turns and is not part of an answer."""


@register_env("tool_lookup_tiny")
def tool_lookup_tiny_env(**params: Any) -> ToolEnv:
    """`ToolEnv` for the tiny CPU model (module docstring); `params` override any setting."""
    tiny_format = CompactFormat(
        key_prefix="",
        max_calls=1,
        error_text="!",
        description="",
        call_pattern=r"([A-Za-z0-9_]+)\?",
        stop_strings=["?"],
        result_suffix="=",
    )
    defaults: dict[str, Any] = {
        "tools": ["lookup"],
        "tool_format": tiny_format,
        "verifier": "copy",
        "instructions": "",
        "call_reward": 0.1,
        "clean_call_reward": 0.1,
        "require_call": True,
        "max_call_turns": 1,
        "strip_suffixes": (TINY_EOS,),
    }
    return ToolEnv(**{**defaults, **params})


@register_env("math_python")
def math_python_env(**params: Any) -> ToolEnv:
    """`ToolEnv` with the `python` and `calculator` tools, verifier `math`."""
    return ToolEnv(
        **{"tools": ["python", "calculator"], "verifier": "math", "instructions": MATH_PYTHON_INSTRUCTIONS, **params}
    )
