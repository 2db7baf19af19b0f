"""`VerifierPool`: runs the `RewardScorer` in worker processes with timeouts, restarts and metrics.

A plain class (the Ray actor wrapping it in training lives in orchestration/). One dispatcher thread in the
caller's process hands rows and jobs to idle workers one at a time over pipes and watches them. The workers' own
loop is rlvr/rewards/pool_worker.py; the jobs' bookkeeping (queue, answers, cancel, counts) rlvr/rewards/pool_jobs.py.

Invariants:
- Every submitted row gets exactly one `RewardResult`; no verifier failure is ever raised to the caller.
- Back-pressure: at most `max_queue` rows are queued or running; `submit` blocks until there is room.
- Time: each row has `timeout_s`. The worker arms a SIGALRM soft timeout in its main thread (math-verify's
  own SIGALRM timeouts are disabled, see math_verifiers.py) and reports status "timeout"; if the worker does
  not answer by `timeout_s + hard_grace_s` the parent SIGKILLs it and starts a new one. Either way the row's
  scores are all None, total None, status "timeout", and the running function's `timeouts` count goes up.
- A worker that dies (segfault, os._exit) is replaced; its row gets status "error" and the running
  function's `errors` count goes up.
- Workers are started with "forkserver" (default) or "spawn", never fork: the caller may hold threads.
- Config errors (unknown function names, bad params) raise ValueError in the constructor, since the parent
  builds a scorer first.
- Jobs (`run_tool` / `poll_tools` / `cancel_jobs`: multi-turn tool calls and answer checks, docs/multi-turn.md):
  a module-level function and its arguments run in a worker like a row, under the job's own `timeout_s`
  (SIGALRM) and hard limit (`timeout_s + hard_grace_s`, then SIGKILL and a new worker). Every job gets exactly
  one answer, the function's return value or a `JobFailure` ("timeout" or "crash"), unless it was cancelled
  while queued (no answer). `run_tool` never blocks: the caller bounds its jobs (the collector's `EpisodeRunner`
  keeps a few per worker outstanding and queues the rest itself). Scoring rows go before queued jobs (a step
  waits on its scores). A worker left with a running thread after a job (an abandoned tool call) retires after
  answering and is replaced.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

from rlvr.rewards.pool_jobs import JobFailure as JobFailure  # re-exported: the pool's answers are these
from rlvr.rewards.pool_jobs import ToolJobs
from rlvr.rewards.pool_worker import start_worker
from rlvr.rewards.scorer import CallStats, RewardScorer, RewardsSettings
from rlvr.types import RewardResult

Item = tuple[str, dict, "list[int] | None"]  # (completion_text, metadata, completion_token_ids)


@dataclass
class _FnMetrics:
    calls: int = 0
    time_s: float = 0.0
    timeouts: int = 0
    errors: int = 0


@dataclass
class _Batch:
    results: list[RewardResult | None]
    remaining: int
    internal: bool = False
    done: threading.Event = field(default_factory=threading.Event)


class VerifierPool:
    """Scores (completion_text, metadata, completion_token_ids) items in worker processes (module docstring)."""

    def __init__(
        self,
        settings: RewardsSettings | Any,
        *,
        num_workers: int | None = None,
        timeout_s: float | None = None,
        max_queue: int | None = None,
        hard_grace_s: float = 2.0,
        start_method: str = "forkserver",
    ) -> None:
        self.settings = RewardsSettings.from_config(settings)
        if num_workers is not None:
            self.settings.num_workers = num_workers
        if timeout_s is not None:
            self.settings.timeout_s = timeout_s
        if max_queue is not None:
            self.settings.max_queue = max_queue
        if self.settings.num_workers < 1 or self.settings.timeout_s <= 0 or self.settings.max_queue < 1:
            raise ValueError(
                f"VerifierPool needs num_workers >= 1, timeout_s > 0, max_queue >= 1; got "
                f"{self.settings.num_workers}, {self.settings.timeout_s}, {self.settings.max_queue}"
            )
        self._scorer = RewardScorer(self.settings)  # validates names and params here, in the caller
        self._ctx: Any = mp.get_context(start_method)  # a concrete context (fork/spawn/forkserver)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(["rlvr.rewards.builtin", "math_verify"])
        self._hard_timeout = self.settings.timeout_s + hard_grace_s
        self._hard_grace = hard_grace_s
        self._lock = threading.Lock()
        self._space = threading.BoundedSemaphore(self.settings.max_queue)
        self._pending: deque[int] = deque()
        self._tasks: dict[int, tuple[Any, int, Item]] = {}
        self._batches: dict[Any, _Batch] = {}
        self._done: list[tuple[Any, list[RewardResult]]] = []
        self._ids = itertools.count()
        self._fn: dict[str, _FnMetrics] = {}
        self._counts = {"timeouts": 0, "crashes": 0, "restarts": 0, "completed": 0}
        self._jobs = ToolJobs()  # `run_tool` jobs, guarded by `_lock` like the rows
        self._wake_r, self._wake_w = self._ctx.Pipe(duplex=False)
        self._closed = False
        self._broken: str | None = None
        self._startup_failures = 0
        self._workers = [start_worker(self._ctx, self.settings) for _ in range(self.settings.num_workers)]
        self._thread = threading.Thread(target=self._loop, name="verifier-pool", daemon=True)
        self._thread.start()

    # ----- public API -----
    def submit(self, batch_id: Any, items: Sequence[Item]) -> None:
        """Queue `items` under `batch_id` (unique among unfinished batches); blocks while the queue is full."""
        self._add(batch_id, items, internal=False)

    def poll(self) -> list[tuple[Any, list[RewardResult]]]:
        """Batches finished since the last poll, as (batch_id, results in item order). Non-blocking."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def run_tool(self, job_id: Any, fn: Any, args: tuple, timeout_s: float) -> None:
        """Queue the job `fn(*args)` (a module-level function: it is pickled by reference) for a worker; never
        blocks. Its answer comes back through `poll_tools` as `(job_id, fn's return value)`, or a `JobFailure`
        when it raised, ran past `timeout_s` (SIGALRM in the worker) or did not answer by `timeout_s +
        hard_grace_s` (the worker is SIGKILLed and replaced), or its worker died."""
        if self._closed:
            raise RuntimeError("VerifierPool is closed")
        with self._lock:
            self._jobs.add(next(self._ids), job_id, fn, args, timeout_s)
        self._wake()
        if self._broken is not None:
            self._fail_pending()

    def poll_tools(self, started: bool = False) -> Any:
        """`run_tool` jobs finished since the last call, as (job_id, output or JobFailure). Non-blocking. With
        `started`: (that list, the ids of the jobs a worker took since the last such call)."""
        with self._lock:
            return self._jobs.take(started)

    def cancel_jobs(self, job_ids: Sequence[Any]) -> int:
        """Forget the queued jobs among `job_ids` (they never run and get no answer); a job already running
        answers as usual. Returns how many were cancelled."""
        with self._lock:
            return self._jobs.cancel(job_ids)

    def score_many(self, items: Sequence[Item], timeout: float | None = None) -> list[RewardResult]:
        """Score `items` and wait for all results (results in item order)."""
        batch_id = ("__score_many__", next(self._ids))
        batch = self._add(batch_id, items, internal=True)
        if not batch.done.wait(timeout):
            raise TimeoutError(f"score_many: {batch.remaining} of {len(items)} rows still pending after {timeout}s")
        with self._lock:
            del self._batches[batch_id]
        return list(batch.results)  # type: ignore[arg-type]

    def metrics(self, reset: bool = False) -> dict[str, float]:
        """`reward/<fn>/{calls,mean_time_s,timeouts,errors}` and `reward/pool/{timeouts,crashes,restarts,completed,queued}`."""
        with self._lock:
            out: dict[str, float] = {}
            for name, m in self._fn.items():
                out[f"reward/{name}/calls"] = float(m.calls)
                out[f"reward/{name}/mean_time_s"] = m.time_s / m.calls if m.calls else 0.0
                out[f"reward/{name}/timeouts"] = float(m.timeouts)
                out[f"reward/{name}/errors"] = float(m.errors)
            for key, value in self._counts.items():
                out[f"reward/pool/{key}"] = float(value)
            out["reward/pool/queued"] = float(len(self._tasks))
            out.update(self._jobs.metrics(reset))
            if reset:
                self._fn.clear()
                self._counts = dict.fromkeys(self._counts, 0)
        return out

    def close(self) -> None:
        """Stop the dispatcher and the workers. Unfinished rows are dropped."""
        if self._closed:
            return
        self._closed = True
        self._wake()
        self._thread.join(timeout=10)
        for w in self._workers:
            try:
                w.conn.send(None)
            except OSError:
                pass
        for w in self._workers:
            w.process.join(timeout=2)
            if w.process.is_alive():
                w.process.kill()
                w.process.join(timeout=2)

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----- internals -----
    def _add(self, batch_id: Any, items: Sequence[Item], internal: bool) -> _Batch:
        if self._closed:
            raise RuntimeError("VerifierPool is closed")
        batch = _Batch(results=[None] * len(items), remaining=len(items), internal=internal)
        with self._lock:
            if batch_id in self._batches:
                raise ValueError(f"batch {batch_id!r} is already pending")
            self._batches[batch_id] = batch
            if not items:
                self._finish_batch(batch_id, batch)
        for index, item in enumerate(items):
            self._space.acquire()
            with self._lock:
                task_id = next(self._ids)
                self._tasks[task_id] = (batch_id, index, item)
                self._pending.append(task_id)
            self._wake()
        if self._broken is not None:
            self._fail_pending()
        return batch

    def _wake(self) -> None:
        with self._lock:
            try:
                self._wake_w.send_bytes(b"x")
            except OSError:
                pass

    def _finish_batch(self, batch_id: Any, batch: _Batch) -> None:
        batch.done.set()
        if not batch.internal:
            del self._batches[batch_id]
            self._done.append((batch_id, list(batch.results)))  # type: ignore[arg-type]

    def _complete(self, task_id: int, result: RewardResult, stats: list[CallStats]) -> None:
        with self._lock:
            batch_id, index, _ = self._tasks.pop(task_id)
            for s in stats:
                m = self._fn.setdefault(s.name, _FnMetrics())
                m.calls += 1
                m.time_s += s.elapsed_s
                m.timeouts += int(getattr(s, "timeout", False))
                m.errors += int(s.error)
            self._counts["completed"] += 1
            if result.status == "timeout":
                self._counts["timeouts"] += 1
            batch = self._batches[batch_id]
            batch.results[index] = result
            batch.remaining -= 1
            if batch.remaining == 0:
                self._finish_batch(batch_id, batch)
        self._space.release()

    def _complete_job(self, task_id: int, out: Any, elapsed: float) -> None:
        with self._lock:
            self._jobs.complete(task_id, out, elapsed)

    def _retire(self, i: int) -> None:
        """Worker i retires after its answer (a job left a thread running in it): join it, start a new one."""
        w = self._workers[i]
        w.process.join(timeout=5)
        if w.process.is_alive():
            w.process.kill()
            w.process.join(timeout=5)
        w.conn.close()
        with self._lock:
            self._counts["restarts"] += 1
        self._workers[i] = start_worker(self._ctx, self.settings)

    def _fail_worker(self, i: int, status: str, message: str) -> None:
        """Kill worker i (if alive), give its row a None result, and start a replacement."""
        w = self._workers[i]
        fn = w.current_fn.value.decode(errors="replace") or "?"
        if w.process.is_alive():
            w.process.kill()
        w.process.join(timeout=5)
        w.conn.close()
        if w.task_id is not None and w.task_id in self._jobs:
            elapsed = time.monotonic() - w.started
            self._complete_job(w.task_id, self._jobs.hard_failure(w.task_id, status, message), elapsed)
            self._startup_failures = 0
        elif w.task_id is not None:
            _, _, (text, metadata, _) = self._tasks[w.task_id]
            try:
                keys = self._scorer.keys(metadata)
            except Exception:  # trust boundary: malformed metadata must not stop the dispatcher
                keys = []
            elapsed = time.monotonic() - (w.deadline - self._hard_timeout)
            result = RewardResult(
                scores=dict.fromkeys(keys),
                total=None,
                status=status,  # type: ignore[arg-type]
                error=f"{message} in {fn}",
                elapsed_s=elapsed,
            )
            stat = CallStats(fn, elapsed, error=status == "error", timeout=status == "timeout")
            with self._lock:
                self._counts["crashes"] += int(status == "error")
            self._complete(w.task_id, result, [stat])
            self._startup_failures = 0
        elif not w.ready:
            self._startup_failures += 1
        with self._lock:
            self._counts["restarts"] += 1
        if self._startup_failures >= 3:
            self._broken = f"verifier workers die while starting ({message})"
            self._fail_pending()
        self._workers[i] = start_worker(self._ctx, self.settings)

    def _fail_pending(self) -> None:
        """Workers cannot start: answer every queued row with an error instead of hanging the caller."""
        with self._lock:
            pending, self._pending = list(self._pending) + list(self._jobs.pending), deque()
            self._jobs.pending = deque()
        for task_id in pending:
            if task_id in self._jobs:
                self._complete_job(task_id, ("crash", str(self._broken)), 0.0)
                continue
            self._complete(task_id, RewardResult(scores={}, total=None, status="error", error=self._broken), [])

    def _loop(self) -> None:
        while not self._closed:
            now = time.monotonic()
            with self._lock:
                for w in self._workers:
                    if w.ready and w.task_id is None and (self._pending or self._jobs.pending):
                        # rows first: a step waits on its scores; jobs are bounded by their caller
                        w.task_id = (self._pending or self._jobs.pending).popleft()
                        w.started = now
                        message: tuple
                        if w.task_id in self._jobs:
                            message, limit = self._jobs.dispatch(w.task_id)
                            w.deadline = now + limit + self._hard_grace
                        else:
                            _, _, (text, metadata, token_ids) = self._tasks[w.task_id]
                            w.deadline = now + self._hard_timeout
                            message = (w.task_id, text, metadata, token_ids)
                        try:
                            w.conn.send(message)
                        except OSError:
                            pass  # the worker died; its sentinel fires below
            busy = [w.deadline for w in self._workers if w.task_id is not None]
            wait_s = max(0.0, min([0.5, *(d - now for d in busy)]))
            waitables: list[Any] = [self._wake_r]
            for w in self._workers:
                waitables += [w.conn, w.process.sentinel]
            ready = set(wait(waitables, timeout=wait_s))
            if self._wake_r in ready:
                while self._wake_r.poll():
                    self._wake_r.recv_bytes()
            for i, w in enumerate(list(self._workers)):
                if w.conn in ready:
                    try:
                        msg = w.conn.recv()
                    except (EOFError, OSError):
                        msg = None
                    if msg is None:
                        self._fail_worker(i, "error", f"verifier worker died (exit code {w.process.exitcode})")
                    elif msg[0] == "ready":
                        w.ready = True
                        self._startup_failures = 0
                    elif msg[0] == "job":
                        w.task_id = None
                        self._complete_job(msg[1], msg[2], msg[3])
                        if msg[4]:
                            self._retire(i)
                    else:
                        _, task_id, result, stats = msg
                        w.task_id = None
                        self._complete(task_id, result, stats)
                elif w.process.sentinel in ready:
                    w.process.join(timeout=5)
                    self._fail_worker(i, "error", f"verifier worker died (exit code {w.process.exitcode})")
                elif w.task_id is not None and time.monotonic() > w.deadline:
                    self._fail_worker(i, "timeout", f"no answer after {self._hard_timeout:.1f}s; worker killed")
