"""The tool-job path of multi-turn episodes (docs/multi-turn.md): the jobs an environment's `begin_step` hands out
(tool calls, the answer check; `rlvr.envs.jobs`) between the `EpisodeRunner` and the verifier pool's workers.

- `JobQueue` holds an `EpisodeRunner`'s jobs, id `<turn id>/j<slot>`. They wait in it, first in first out, until
  the `ToolRunner` has a free slot (`free_slots`: a few per verifier worker, `JOBS_PER_WORKER`; the rest of the
  pool's queue is the scores'), then run in the verifier pool's workers (their timeouts, and a hard kill as
  backstop). Every job still held gets exactly one answer out of `poll`: the pool's, or, when none came by
  `timeout_s * 2 + JOB_GRACE_S` after a worker took it (after it was handed over, for a runner that does not
  report dispatch), a `JobFailure` ("timeout", counted as lost), so a lost job cannot stall a step. An answer
  whose id is not held (a dropped group's job, a second answer) comes out with no entry and is ignored.
- `drop` forgets a prompt's jobs: queued ones never reach the runner, handed-over ones are cancelled there
  (no answer, or one that is ignored) and their slots go to the next queued jobs.
- `PoolToolRunner` (an in-process `VerifierPool`: tests, `rlvr eval`) and `ActorToolRunner` (the verifier actors
  of a training run) are the runners. Their outputs are `rlvr.envs.jobs.JobFailure`s, never the pool's own.
  `ActorToolRunner` replaces a verifier actor that dies and answers its outstanding jobs at once ("crash",
  counted in its `lost`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from rlvr.envs.jobs import Job, JobFailure
from rlvr.telemetry.logs import get_logger

logger = get_logger(__name__)

JOB_GRACE_S = 30.0
"""Seconds past twice a job's own limit after which the collector stops waiting for the pool's answer."""
JOBS_PER_WORKER = 2
"""Tool jobs a runner keeps outstanding per verifier worker (the rest wait in the `EpisodeRunner`)."""
WARN_EVERY_S = 60.0
"""At most one warning per this many seconds about a verifier actor that keeps failing."""


class ToolRunner(Protocol):
    """Where jobs run: `submit` never blocks; `poll` returns (job_id, output or `JobFailure`) pairs.

    Optional (a runner without them takes every job at once and its jobs are timed from their submission):
    `free_slots()` (how many more jobs it takes now), `take_started()` (ids of the jobs a worker took since
    the last call), `cancel(job_ids)` (forget jobs: never answered, or answered and ignored) and `lost` (jobs
    it failed itself, e.g. on a dead actor)."""

    def submit(self, job_id: str, job: Job) -> None: ...

    def poll(self) -> list[tuple[str, Any]]: ...


def _as_failure(output: Any) -> Any:
    """The pool's own `JobFailure` (rlvr.rewards.pool_jobs, which cannot import envs) as the environments' one."""
    if type(output).__name__ == "JobFailure" and not isinstance(output, JobFailure):
        return JobFailure(output.reason, output.message, output.latency_s)
    return output


class PoolToolRunner:
    """Jobs in an in-process `VerifierPool` (tests, `rlvr eval`), at most `max_outstanding` at a time
    (default `JOBS_PER_WORKER` per worker)."""

    def __init__(self, pool: Any, max_outstanding: int | None = None) -> None:
        self.pool = pool
        self.max_outstanding = max_outstanding or JOBS_PER_WORKER * pool.settings.num_workers
        self.outstanding: set[str] = set()
        self._started: list[str] = []

    def free_slots(self) -> int:
        return self.max_outstanding - len(self.outstanding)

    def submit(self, job_id: str, job: Job) -> None:
        self.outstanding.add(job_id)
        self.pool.run_tool(job_id, job.fn, job.args, job.timeout_s)

    def poll(self) -> list[tuple[str, Any]]:
        done, started = self.pool.poll_tools(started=True)
        self._started += started
        self.outstanding.difference_update(job_id for job_id, _ in done)
        return [(job_id, _as_failure(out)) for job_id, out in done]

    def take_started(self) -> list[str]:
        started, self._started = self._started, []
        return started

    def cancel(self, job_ids: list[str]) -> None:
        self.outstanding.difference_update(job_ids)
        self.pool.cancel_jobs(job_ids)


class ActorToolRunner:
    """Jobs on the verifier actors (`actors.verifiers`, read on every call: a replaced actor is picked up), each
    to the actor with the fewest outstanding, at most `per_actor` each. A verifier actor that dies (its
    `poll_tools` raises or times out) is replaced (`rlvr.orchestration.actors.replace_verifiers`, as scoring
    does; at most once per `timeout_s`); the jobs outstanding on an actor that is no longer in `actors.verifiers`
    (replaced here or by the scorer) are answered at once with a `JobFailure` ("crash", counted in `lost`)."""

    def __init__(self, actors: Any, timeout_s: float, per_actor: int = 8) -> None:
        self.actors, self.timeout_s, self.per_actor = actors, timeout_s, per_actor
        self.lost = 0
        self._where: dict[str, Any] = {}  # job id -> the actor it went to
        self._started: list[str] = []
        self._replaced_at = -float("inf")
        self._warned_at = -float("inf")

    def _load(self, actor: Any) -> int:
        return sum(a is actor for a in self._where.values())

    def free_slots(self) -> int:
        return sum(max(0, self.per_actor - self._load(v)) for v in self.actors.verifiers)

    def submit(self, job_id: str, job: Job) -> None:
        actor = min(self.actors.verifiers, key=self._load)
        self._where[job_id] = actor
        actor.run_tool.remote(job_id, job.fn, job.args, job.timeout_s)

    def poll(self) -> list[tuple[str, Any]]:
        import ray

        verifiers = list(self.actors.verifiers)
        refs = [v.poll_tools.remote(True) for v in verifiers]
        out: list[tuple[str, Any]] = []
        failure: Exception | None = None
        for ref in refs:
            try:
                done, started = ray.get(ref, timeout=self.timeout_s)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                failure = failure or e
                continue
            self._started += started
            for job_id, o in done:
                self._where.pop(job_id, None)
                out.append((job_id, _as_failure(o)))
        if failure is not None:
            self._on_failure(failure)
        current = self.actors.verifiers
        for job_id, actor in list(self._where.items()):
            if not any(actor is v for v in current):  # its actor was replaced: no answer will come
                del self._where[job_id]
                self.lost += 1
                out.append((job_id, JobFailure("crash", "its verifier actor died and was replaced")))
        return out

    def _on_failure(self, e: Exception) -> None:
        from rlvr.orchestration.actors import replace_verifiers

        now = time.monotonic()
        if now - self._replaced_at >= self.timeout_s:
            self._replaced_at = now
            replace_verifiers(self.actors, e)
        elif now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            logger.warning("verifier actor still does not answer poll_tools (%s); its jobs will time out", e)

    def take_started(self) -> list[str]:
        started, self._started = self._started, []
        return started

    def cancel(self, job_ids: list[str]) -> None:
        by_actor: dict[int, tuple[Any, list[str]]] = {}
        for job_id in job_ids:
            actor = self._where.pop(job_id, None)
            if actor is not None:
                by_actor.setdefault(id(actor), (actor, []))[1].append(job_id)
        for actor, ids in by_actor.values():
            actor.cancel_jobs.remote(ids)  # fire and forget: a dead actor's jobs are gone anyway


@dataclass
class JobEntry:
    """A job of an episode's step: whose (prompt id `pid`, episode `k`, its turn request id), and its slot."""

    pid: str
    k: int
    turn_id: str
    slot: int
    job: Job
    sent: bool = False  # handed to the tool runner (else waiting in the queue)
    deadline: float | None = None  # set when the job is dispatched (or handed over, see the module docstring)


class JobQueue:
    """An `EpisodeRunner`'s jobs on their way through `tools` (module docstring); `clock` times their deadlines."""

    def __init__(self, tools: ToolRunner, clock: Any = time.monotonic) -> None:
        self.tools, self.clock = tools, clock
        self.jobs: dict[str, JobEntry] = {}  # job id -> its episode, turn, slot, deadline
        self.queued: deque[str] = deque()  # job ids waiting for a free slot of the tool runner, oldest first

    def add(self, job_id: str, entry: JobEntry) -> None:
        """Queue a job (`send` hands it over when the runner has room)."""
        self.jobs[job_id] = entry
        self.queued.append(job_id)

    def send(self) -> None:
        """Hand queued jobs to the tool runner, oldest first, while it has free slots."""
        free_slots = getattr(self.tools, "free_slots", None)
        timed_at_dispatch = hasattr(self.tools, "take_started")
        while self.queued:
            if free_slots is not None and free_slots() <= 0:
                return
            job_id = self.queued.popleft()
            entry = self.jobs[job_id]
            entry.sent = True
            if not timed_at_dispatch:
                entry.deadline = self.clock() + 2 * entry.job.timeout_s + JOB_GRACE_S
            self.tools.submit(job_id, entry.job)

    def poll(self) -> tuple[list[tuple[JobEntry | None, Any]], int]:
        """The answers since the last call, in order, as (its entry, taken out of the queue, or None when the id is
        not held; output), those past their deadline among them; and how many were past it (lost)."""
        answers = self.tools.poll()
        now = self.clock()
        take_started = getattr(self.tools, "take_started", None)
        for job_id in take_started() if take_started is not None else []:
            entry = self.jobs.get(job_id)
            if entry is not None and entry.deadline is None:
                entry.deadline = now + 2 * entry.job.timeout_s + JOB_GRACE_S
        lost = [j for j, entry in self.jobs.items() if entry.deadline is not None and now > entry.deadline]
        if lost:
            self._cancel_at_tools(lost)
            answers += [(j, JobFailure("timeout", "no answer from the verifier pool in time")) for j in lost]
        return [(self.jobs.pop(job_id, None), output) for job_id, output in answers], len(lost)

    def drop(self, prompt_id: str) -> None:
        """Forget the jobs of `prompt_id` (cancelled at the runner where they were handed over); the slots they
        held go to the next queued jobs."""
        gone = {j: entry for j, entry in self.jobs.items() if entry.pid == prompt_id}
        if not gone:
            return
        for j in gone:
            del self.jobs[j]
        self.queued = deque(j for j in self.queued if j not in gone)
        self._cancel_at_tools([j for j, entry in gone.items() if entry.sent])
        self.send()

    def _cancel_at_tools(self, job_ids: list[str]) -> None:
        cancel = getattr(self.tools, "cancel", None)
        if cancel is not None and job_ids:
            cancel(job_ids)
