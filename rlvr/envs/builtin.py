"""Built-in environments, registered on import (`rlvr.envs.registry` imports this module).

- `tool`: the generic `ToolEnv` (tools, format and verifier from params).
- `tool_lookup`: `ToolEnv` with the `lookup` tool over the row's hidden table, answer checked by `math`
  (rows from `rlvr.envs.tasks.lookup_rows`: the answer is only obtainable through the tool).
- `math_python`: `ToolEnv` with the `python` (code sandbox) and `calculator` tools, answer checked by `math`
  (rows of any math dataset with a `ground_truth`, e.g. `builtin:arith-l5`).
"""

from __future__ import annotations

from typing import Any

from rlvr.envs.registration import register_env
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


@register_env("math_python")
def math_python_env(**params: Any) -> ToolEnv:
    """`ToolEnv` with the `python` and `calculator` tools, verifier `math`."""
    return ToolEnv(
        **{"tools": ["python", "calculator"], "verifier": "math", "instructions": MATH_PYTHON_INSTRUCTIONS, **params}
    )
