"""A `VerifierPool` worker process (rlvr/rewards/pool.py): what runs inside it (score rows and run jobs, one at a
time, each under its own SIGALRM soft limit, and answer every task over the pipe) and the parent's handle on it.

Invariants:
- Every task the worker receives gets exactly one answer, unless the worker dies (the parent then answers it):
  a row gets `("result", task_id, RewardResult, [CallStats])`, status "timeout" when its `timeout_s` ran out
  (scores all None) or "error" when reward code raised anything, `sys.exit` included; a job gets
  `("job", task_id, ("ok", value) | (reason, message), elapsed_s, retire)`, reason "timeout" or "crash".
- The soft timeout is a BaseException raised by SIGALRM in the main thread, so reward or tool code's
  `except Exception` cannot swallow it; the alarm is disarmed before the answer is sent.
- A job that leaves a thread running (an abandoned tool call) retires the worker after its answer (`retire`
  True): the parent starts a new one, so no stray thread outlives its job.
- The worker ignores SIGINT (Ctrl-C is the parent's, which closes the pool) and stops when it receives None.
- `start_worker` never forks the caller: the context is the pool's ("forkserver" or "spawn").
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from rlvr.rewards.scorer import CallStats, RewardScorer, RewardsSettings
from rlvr.types import RewardResult


class _SoftTimeout(BaseException):
    """Raised by SIGALRM inside a worker; a BaseException so reward code's `except Exception` cannot eat it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _SoftTimeout()


def worker_main(conn: Connection, settings: RewardsSettings, current_fn: Any) -> None:
    """Worker process loop: build the scorer, then score rows and run jobs until it receives None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes the pool
    signal.signal(signal.SIGALRM, _on_alarm)
    scorer = RewardScorer(settings)

    def mark(name: str) -> None:
        current_fn.value = name.encode()[:127]

    scorer.on_call_start = mark
    baseline_threads = threading.active_count()
    conn.send(("ready",))
    while True:
        task = conn.recv()
        if task is None:
            return
        if task[0] == "job":
            # a job that left a thread running (an abandoned tool call) retires this worker: the parent replaces it
            answer = _run_job(task[1], task[2], task[3], task[4])
            retire = threading.active_count() > baseline_threads
            conn.send((*answer, retire))
            if retire:
                return
            continue
        task_id, text, metadata, token_ids = task
        start = time.perf_counter()
        stats: list[CallStats] = []
        try:
            signal.setitimer(signal.ITIMER_REAL, settings.timeout_s)
            try:
                result, stats = scorer.score_detailed(text, metadata, token_ids)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _SoftTimeout:
            fn = scorer.current_fn or "?"
            result = RewardResult(
                scores={k: None for k in scorer.keys(metadata)},
                total=None,
                status="timeout",
                error=f"timed out after {settings.timeout_s}s in {fn}",
                elapsed_s=time.perf_counter() - start,
            )
            stats = [CallStats(fn, time.perf_counter() - start, error=False, timeout=True)]
        except BaseException as e:  # trust boundary: reward code called sys.exit or similar; report it
            result = RewardResult(
                scores={},
                total=None,
                status="error",
                error=f"{type(e).__name__}: {e}",
                elapsed_s=time.perf_counter() - start,
            )
        current_fn.value = b""
        conn.send(("result", task_id, result, stats))


def _run_job(task_id: int, fn: Any, args: tuple, timeout_s: float) -> tuple:
    """One `run_tool` job in a worker: ("job", task_id, output or JobFailure-like (reason, message), elapsed)."""
    start = time.perf_counter()
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        try:
            out: Any = ("ok", fn(*args))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _SoftTimeout:
        out = ("timeout", f"timed out after {timeout_s:g}s")
    except BaseException as e:  # trust boundary: a tool's crash is this job's failure, never the worker's
        out = ("crash", f"{type(e).__name__}: {e}"[:500])
    return ("job", task_id, out, time.perf_counter() - start)


@dataclass
class WorkerHandle:
    """The parent's handle on one worker: its process and pipe, the reward function it runs now (`current_fn`,
    shared memory the worker writes), whether it has said "ready", and the task it holds (None when idle) with
    when it took it and its hard deadline (`time.monotonic`)."""

    process: Any
    conn: Connection
    current_fn: Any
    ready: bool = False
    task_id: int | None = None
    deadline: float = 0.0
    started: float = 0.0


def start_worker(ctx: Any, settings: RewardsSettings) -> WorkerHandle:
    """Start a worker process (`worker_main`) in the multiprocessing context `ctx`; it sends ("ready",) once its
    scorer is built."""
    parent, child = ctx.Pipe()
    current_fn = ctx.Array("c", 128, lock=False)
    process = ctx.Process(target=worker_main, args=(child, settings, current_fn), name="rlvr-verifier", daemon=True)
    process.start()
    child.close()
    return WorkerHandle(process=process, conn=parent, current_fn=current_fn)
