"""The `VerifierPool`'s jobs (rlvr/rewards/pool.py; docs/multi-turn.md): `run_tool` calls of multi-turn episodes
(tool calls, answer checks) from queued to answered, on the parent's side.

Invariants:
- Every job added gets exactly one answer in `done` (the function's return value, or a `JobFailure` "timeout" or
  "crash"), unless it is cancelled while still queued (`cancel`: no answer ever); a job already running cannot be
  cancelled.
- A job's id is the caller's; the pool's task id (unique among rows and jobs) is the key here, so equal job ids
  from different callers never mix.
- Queued jobs wait in `pending`, first in first out, and are dispatched only after every queued scoring row (the
  pool's dispatcher decides); `started` lists the job ids a worker took, so a caller can time a job from its
  dispatch rather than from its submission.
- Plain state only: no threads, no pipes, no lock of its own. The pool calls every method under its lock; only
  its dispatcher thread reads a running job's spec without it (nothing else removes a running job's spec).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class JobFailure:
    """A `run_tool` job without an answer: reason "timeout" (soft limit, or killed at the hard one) or "crash"
    (it raised, or its worker died). `rlvr.envs.jobs` turns it into an error observation."""

    reason: str
    message: str
    latency_s: float = 0.0


class ToolJobs:
    """A pool's jobs by task id, their answers and counts (module docstring)."""

    def __init__(self) -> None:
        self.specs: dict[int, tuple[Any, Any, tuple, float]] = {}  # task id -> (job id, fn, args, timeout_s)
        self.done: list[tuple[Any, Any]] = []  # (job id, output or JobFailure) since the last `take`
        self.pending: deque[int] = deque()  # queued job task ids: dispatched after every queued row
        self.started: list[Any] = []  # job ids a worker took since the last `take(started=True)`
        self.counts = {"jobs": 0, "job_timeouts": 0, "job_crashes": 0}

    def __contains__(self, task_id: object) -> bool:
        return task_id in self.specs

    def add(self, task_id: int, job_id: Any, fn: Any, args: tuple, timeout_s: float) -> None:
        """Queue the job `fn(*args)` under the pool's `task_id`."""
        self.specs[task_id] = (job_id, fn, tuple(args), float(timeout_s))
        self.pending.append(task_id)

    def take(self, started: bool = False) -> Any:
        """Answers since the last call, as (job_id, output or JobFailure); with `started`: (that list, the ids of
        the jobs a worker took since the last such call)."""
        done, self.done = self.done, []
        if not started:
            return done
        taken, self.started = self.started, []
        return done, taken

    def cancel(self, job_ids: Sequence[Any]) -> int:
        """Forget the queued jobs among `job_ids`; returns how many."""
        wanted = set(job_ids)
        gone = [t for t in self.pending if self.specs[t][0] in wanted]
        for t in gone:
            del self.specs[t]
        if gone:
            dropped = set(gone)
            self.pending = deque(t for t in self.pending if t not in dropped)
        return len(gone)

    def dispatch(self, task_id: int) -> tuple[tuple, float]:
        """A worker takes the job: (the message for its pipe, the job's own time limit)."""
        job_id, fn, args, limit = self.specs[task_id]
        self.started.append(job_id)
        return ("job", task_id, fn, args, limit), limit

    def hard_failure(self, task_id: int, status: str, message: str) -> tuple[str, str]:
        """The answer of a running job whose worker was killed at the hard limit (`status` "timeout") or died."""
        if status == "timeout":
            limit = self.specs[task_id][3]
            return ("timeout", f"timed out after {limit:g}s (no answer by the hard limit; its worker was killed)")
        return ("crash", message)

    def complete(self, task_id: int, out: Any, elapsed: float) -> None:
        """File a job's answer: ("ok", value) -> value; (reason, message) -> JobFailure."""
        job_id = self.specs.pop(task_id)[0]
        self.counts["jobs"] += 1
        if out[0] == "ok":
            self.done.append((job_id, out[1]))
            return
        self.counts["job_timeouts" if out[0] == "timeout" else "job_crashes"] += 1
        self.done.append((job_id, JobFailure(out[0], out[1], elapsed)))

    def metrics(self, reset: bool = False) -> dict[str, float]:
        """`reward/pool/{jobs_queued,jobs,job_timeouts,job_crashes}`."""
        out = {"reward/pool/jobs_queued": float(len(self.pending))}
        for key, value in self.counts.items():
            out[f"reward/pool/{key}"] = float(value)
        if reset:
            self.counts = dict.fromkeys(self.counts, 0)
        return out
