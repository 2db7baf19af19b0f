"""User tools loaded by import path in the tool tests ("envs_user_tools:<name>"): well-behaved and misbehaving."""

from __future__ import annotations

import threading

from rlvr.envs.tool_calls import ToolSpec
from rlvr.envs.tools import Tool

RELEASE = threading.Event()  # set by the tests to let an abandoned `hang` call finish


def reverse(text: str) -> str:
    """Reverse a string."""
    return text[::-1]


def hang(seconds: float = 60.0) -> str:
    """Block until released (a tool that hangs)."""
    RELEASE.wait(seconds)
    return "finally"


def crash() -> str:
    """Raise an unexpected error (a tool that crashes)."""
    raise RuntimeError("boom")


def flood(n: int = 100_000) -> str:
    """Return far too much output (a tool that floods)."""
    return "x" * n


SHOUT = Tool(
    ToolSpec("shout", "Upper-case a string.", {"type": "object", "properties": {"text": {}}}),
    lambda arguments, row: str(arguments["text"]).upper(),
    timeout_s=1.0,
)


def spin() -> str:
    """Spin forever holding the GIL (only a process kill stops it)."""
    while True:
        pass


def die(code: int = 3) -> str:
    """Exit the process at once (a hard crash)."""
    import os

    os._exit(code)
