"""Health of the actors: failures classified by role, stuck-engine detection, graceful-stop signals.

- `EngineFailure` / `LearnerFailure` name the actor and the reason (its traceback when it died with one).
- `EngineWatch` declares an engine stuck when it has prompts outstanding and its generated-token counter has
  not moved for `heartbeat_timeout_s` (a threaded engine still answers pings while its worker is wedged).
- `StopSignals`: the first SIGINT/SIGTERM asks the driver to checkpoint and exit with `EXIT_PREEMPTED`
  (resumable, non-zero so that schedulers retry or requeue); a second one exits at once. `handlers_kept`
  keeps its handlers in place while Ray starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: "try again later"
PREEMPTED_MESSAGE = "preempted, resumable: a checkpoint was written; start the same command again to resume"


class ActorFailure(RuntimeError):
    """An actor died or stopped answering."""

    def __init__(self, role: str, index: int, reason: str) -> None:
        super().__init__(f"{role} {index}: {reason}")
        self.role, self.index, self.reason = role, index, reason


class EngineFailure(ActorFailure):
    def __init__(self, index: int, reason: str) -> None:
        super().__init__("engine", index, reason)


class LearnerFailure(ActorFailure):
    def __init__(self, index: int, reason: str) -> None:
        super().__init__("learner", index, reason)


class StopRequested(Exception):
    """Raised inside the loop when a stop signal arrived; the driver checkpoints and exits."""


def describe(error: BaseException) -> str:
    """One line for logs: the type and first line, plus the actor's own traceback tail where Ray has it."""
    text = str(error).strip().splitlines()
    tail = " | ".join(line.strip() for line in text[-3:]) if text else ""
    return f"{type(error).__name__}: {tail}"[:2000]


class EngineWatch:
    """Tracks per-engine progress: generated tokens counter and when it last moved."""

    def __init__(self, num_engines: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.last_tokens = [-1.0] * num_engines
        self.last_move = [time.time()] * num_engines

    def reset(self, index: int) -> None:
        self.last_tokens[index], self.last_move[index] = -1.0, time.time()

    def update(self, index: int, generated_tokens: float, outstanding: int) -> str | None:
        """Returns a reason when the engine is stuck."""
        now = time.time()
        if generated_tokens != self.last_tokens[index] or outstanding == 0:
            self.last_tokens[index], self.last_move[index] = generated_tokens, now
            return None
        idle = now - self.last_move[index]
        if idle > self.timeout_s:
            return (
                f"stuck: {outstanding} prompts outstanding and no token generated for {idle:.0f}s "
                f"(--cluster.heartbeat-timeout-s {self.timeout_s:g})"
            )
        return None


class StopSignals:
    """Installs SIGINT/SIGTERM handlers in the main thread for the duration of a run."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._old: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            sys.stderr.write(f"rlvr: second signal ({name}): exiting now without a checkpoint\n")
            os._exit(128 + signum)
        self.requested = name
        sys.stderr.write(f"rlvr: {name} received: writing a checkpoint, then exiting (send again to exit now)\n")

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]


@contextlib.contextmanager
def handlers_kept(signals: StopSignals | None) -> Iterator[None]:
    """While active, nothing in this process replaces the SIGINT/SIGTERM handlers of `signals`, and they are
    installed again on exit. ray.init installs a Python SIGTERM handler that calls sys.exit at once, and its core
    worker an absl "failure signal handler" (C) that prints a stack and aborts the process on SIGTERM (seen: exit
    -6 after a SIGTERM that landed during ray.init); blocking the signals around ray.init does not help, because another thread may take the
    signal and the main thread then runs whichever handler is installed at that moment."""
    if signals is None or threading.current_thread() is not threading.main_thread():
        yield  # only the main thread sets handlers (and StopSignals installs none elsewhere)
        return
    original = signal.signal
    sigs = (signal.SIGINT, signal.SIGTERM)

    def guarded(sig: int, handler: Any) -> Any:
        if sig in sigs:
            return signal.getsignal(sig)
        return original(sig, handler)

    # Ray's core worker installs absl's failure signal handler when the driver connects unless
    # `ray._private.ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER` is true. That constant is read from the
    # environment when ray is first imported, so setting the variable here would be too late: set the constant.
    ray_constants: Any = None  # no ray: nothing installs that handler
    try:
        from ray._private import ray_constants
    except ImportError:
        pass
    old_const = getattr(ray_constants, "RAY_DISABLE_FAILURE_SIGNAL_HANDLER", None)
    if ray_constants is not None:
        ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    signal.signal = guarded  # type: ignore[assignment]
    try:
        yield
    finally:
        signal.signal = original
        for sig in sigs:  # re-installs Python's own C-level handler over anything set with sigaction
            original(sig, signal.getsignal(sig))
        if ray_constants is not None:
            ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = old_const


def skipped_steps_message(metrics: dict[str, float], limit: int) -> str:
    """Why a run stops after `limit` optimizer steps in a row were skipped for a non-finite loss or gradient."""
    return (
        f"{int(metrics['learner/consecutive_skips'])} optimizer steps in a row were skipped for a non-finite loss "
        f"or gradient (--learner.max-consecutive-skips {limit}): lower --learner.lr, check the rewards and the data"
    )
