"""`ProcessToolSet`: the tool set run in a child process, for tools that may hang or crash for real.

`ToolSet` (tools.py) contains what an in-process tool can do to a thread: raise, return too much, or run past
its timeout (the thread is abandoned). It cannot stop a tool that spins forever holding the GIL, leaks memory,
segfaults or calls `os._exit`. `ProcessToolSet` has the same `specs` / `execute` interface (`ToolExecutor`) but
runs every call in a child process (started with "forkserver" by default, never fork: the caller may hold
threads) that builds the tool set from the same names:

- a call that does not answer within its tool's timeout plus `grace_s` is answered with reason "timeout", and
  the child is SIGKILLed and replaced;
- a child that dies mid-call (segfault, `os._exit`) gives reason "crash" and is replaced;
- the child's own `ToolSet` still classifies exceptions and caps output, as in-process.

Counters: `kills` (children killed on timeout) and `deaths` (children that died by themselves). This is the
shape the verifier pool will take on for tools in training (docs/multi-turn.md): calls leave the engine's
loop and a stuck tool costs one process, never a stalled step.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing.connection import Connection
from typing import Any

from rlvr.envs.tool_calls import ToolCall, ToolResult, ToolSpec
from rlvr.envs.tools import build_toolset


def _child_main(conn: Connection, names: list[str], max_output_chars: int) -> None:
    """Child loop: build the tool set, then answer (call, row) requests until None."""
    tools = build_toolset(names, max_output_chars)
    conn.send(tools.specs())
    while True:
        request = conn.recv()
        if request is None:
            return
        call, row = request
        conn.send(tools.execute(call, row))


class ProcessToolSet:
    """Tool calls in a replaceable child process (module docstring)."""

    def __init__(
        self,
        names: list[str],
        max_output_chars: int = 2000,
        grace_s: float = 2.0,
        start_method: str = "forkserver",
        start_timeout_s: float = 120.0,
    ) -> None:
        self.names = list(names)
        self.max_output_chars = max_output_chars
        self.grace_s = grace_s
        self.start_timeout_s = start_timeout_s
        self._ctx: Any = mp.get_context(start_method)
        self._timeouts = {t.spec.name: t.timeout_s for t in build_toolset(self.names, max_output_chars).tools.values()}
        self._process: Any = None
        self._conn: Connection | None = None
        self._specs: list[ToolSpec] = []
        self.kills = 0
        self.deaths = 0
        self._start()

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._process = self._ctx.Process(
            target=_child_main, args=(child, self.names, self.max_output_chars), daemon=True, name="rlvr-tools"
        )
        self._process.start()
        child.close()
        if not parent.poll(self.start_timeout_s):
            self._process.kill()
            raise RuntimeError(f"tool process did not start within {self.start_timeout_s}s")
        self._specs = parent.recv()
        self._conn = parent

    def _restart(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
        if self._process is not None:
            self._process.join(10)
        if self._conn is not None:
            self._conn.close()
        self._start()

    def specs(self) -> list[ToolSpec]:
        """The tools' specs, as the child built them."""
        return list(self._specs)

    def execute(self, call: ToolCall, row: dict[str, Any]) -> ToolResult:
        """Run one call in the child; a timeout or a dead child gives an error result and a fresh child."""
        assert self._conn is not None
        timeout = self._timeouts.get(call.name, 0.0) + self.grace_s
        start = time.monotonic()
        try:
            self._conn.send((call, row))
            if self._conn.poll(timeout):
                result: ToolResult = self._conn.recv()
                return result
            self.kills += 1
            reason, message = "timeout", f"tool {call.name!r} timed out after {timeout:g}s; its process was killed"
        except (EOFError, OSError, BrokenPipeError):
            self.deaths += 1
            reason, message = "crash", f"tool {call.name!r} crashed (its process died)"
        self._restart()
        return ToolResult(call.name, f"error: {message}", ok=False, reason=reason, latency_s=time.monotonic() - start)

    def close(self) -> None:
        """Stop the child (idempotent)."""
        if self._conn is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._conn.close()
            self._conn = None
        if self._process is not None:
            self._process.join(5)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)
            self._process = None
