"""Feeding engines and collecting complete groups (the engine side of `rlvr.orchestration.collector`).

The feeder submits prompts, least-loaded engine first, up to the in-flight limit its caller computes (the
collector's staleness window, docs/design.md, Algorithms), and hands out the complete groups the engines return.

Engine handles: the feeder calls `handle.submit.remote(requests)`, `handle.poll.remote()` and
`handle.stats.remote()` and resolves the answers with `engine_get`: a Ray actor handle (`EngineActor`) returns
ObjectRefs; an in-process handle (the tests' `FakeEngine`) may return the answers themselves.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

from rlvr.orchestration.accounting import PromptLedger
from rlvr.orchestration.actors import engine_get
from rlvr.orchestration.episodes import EpisodeRunner
from rlvr.orchestration.health import EngineFailure
from rlvr.types import Group, PromptRequest, Sample


class RolloutFeeder:
    """Owns the outstanding prompts: who has them, and the re-queue list after a restart."""

    def __init__(
        self, engines: list, stream, ledger: PromptLedger, timeout_s: float, episodes: EpisodeRunner | None = None
    ) -> None:
        self.engines, self.stream, self.ledger, self.timeout_s = engines, stream, ledger, timeout_s
        self.episodes = episodes  # multi-turn: prompts routed to an environment run as episodes
        self.turns_submitted = 0  # episode turns sent to the engines (after the first), over the run
        self.outstanding: dict[str, tuple[int, PromptRequest]] = {}  # prompt_id -> (engine index, request)
        self.requests: dict[str, PromptRequest] = {}  # every prompt pulled and not yet resolved
        self._order: dict[str, int] = {}  # prompt_id -> submission sequence number (deterministic batch order)
        self._seq = 0
        self.requeue: list[PromptRequest] = []
        self.exhausted = False
        self.eval_samples: list[Sample] = []
        # complete groups taken from living engines by a poll that then raised for a dead one: handed out by the
        # next poll (an engine's poll() is destructive, so dropping them would strand their prompts)
        self.arrived: list[Group] = []

    @property
    def busy(self) -> bool:
        """Groups still to come from the engines, or back already and not yet handed out by `poll`."""
        return bool(self.outstanding or self.arrived)

    def _next_request(self) -> PromptRequest | None:
        if self.requeue:
            return self.requeue.pop(0)
        req = self.stream.next_request()
        if req is None:
            self.exhausted = True
            return None
        self.ledger.pull(req.prompt_id)
        return req

    def top_up(self, max_new: int, limit: int) -> int:
        """Submit at most `max_new` prompts while fewer than `limit` are outstanding or arrived-not-handed-out;
        returns how many were submitted (the caller subtracts the groups it holds from its limit)."""
        per_engine: dict[int, list[PromptRequest]] = defaultdict(list)
        load = self.outstanding_per_engine()
        n = 0
        while len(self.outstanding) + len(self.arrived) < limit and n < max_new:
            req = self._next_request()
            if req is None:
                break
            idx = min(range(len(self.engines)), key=lambda i: load[i])
            load[idx] += 1
            self.outstanding[req.prompt_id] = (idx, req)
            self.requests[req.prompt_id] = req
            self._order[req.prompt_id] = self._seq
            self._seq += 1
            n += 1
            env = self.episodes.route(req) if self.episodes is not None else None
            if env is None:
                per_engine[idx].append(req)
                continue
            assert self.episodes is not None
            per_engine[idx].extend(self.episodes.start(req, env, idx))
        self._submit(per_engine)
        return n

    def _submit(self, per_engine: dict[int, list[PromptRequest]]) -> None:
        """Send requests engine by engine; after a failure the prompts not sent are taken back (re-queued) and
        the failure raised. A turn request's prompt is its episode group's (re-queued whole: it starts over)."""
        failure: EngineFailure | None = None
        for i, reqs in per_engine.items():
            if failure is not None:  # not sent: take them back for the next top-up
                for pid in dict.fromkeys(self._prompt_of(r.prompt_id) for r in reqs):
                    if pid in self.outstanding:
                        self._take_back(pid)
                continue
            try:
                engine_get(self.engines[i].submit.remote(reqs), i, self.timeout_s)
            except EngineFailure as e:
                failure = e
        if failure is not None:
            raise failure

    def _prompt_of(self, request_id: str) -> str:
        if self.episodes is not None and request_id in self.episodes.turns:
            return self.episodes.turns[request_id][0]
        return request_id

    def _take_back(self, prompt_id: str) -> None:
        self.requeue.append(self.outstanding.pop(prompt_id)[1])
        if self.episodes is not None:
            self.episodes.drop(prompt_id)

    def poll(self) -> list[Group]:
        """Complete groups returned by the engines since the last poll (non-blocking on the engines).

        Every engine is asked; when one is dead or silent the groups the others returned are kept (`arrived`)
        for the next poll and the first failure is raised."""
        refs = [e.poll.remote() for e in self.engines]
        results: list[list[Sample]] = []
        failure: EngineFailure | None = None
        for i, ref in enumerate(refs):
            try:
                results.append(engine_get(ref, i, self.timeout_s))
            except EngineFailure as e:
                failure = failure or e
        by_prompt: dict[str, list[Sample]] = defaultdict(list)
        turns: dict[int, list[PromptRequest]] = defaultdict(list)
        for samples in results:
            for s in samples:
                if self.episodes is not None and self.episodes.owns(s.prompt_id):  # an episode's turn
                    for req in self.episodes.on_sample(s):
                        turns[self.episodes.engine_of(req)].append(req)
                    continue
                if s.is_eval:  # an overlapped eval: collected by the Evaluator (evaluation.py)
                    self.eval_samples.append(s)
                    continue
                by_prompt[s.prompt_id].append(s)
        groups, self.arrived = self.arrived, []
        for pid, samples in by_prompt.items():
            if pid not in self.outstanding:
                continue  # an aborted request that finished anyway: already re-queued elsewhere
            del self.outstanding[pid]
            groups.append(Group(prompt_id=pid, samples=sorted(samples, key=lambda s: s.sample_index)))
        if self.episodes is not None:
            failure = failure or self._step_episodes(turns, groups)
        if failure is not None:
            self.arrived = groups
            raise failure
        return groups

    def _step_episodes(self, turns: dict[int, list[PromptRequest]], groups: list[Group]) -> EngineFailure | None:
        """Episodes: job answers, next turns submitted, finished groups into `groups` (eval ones are the
        Evaluator's); returns a submit failure instead of raising it, so the finished groups are not lost."""
        assert self.episodes is not None
        for req in self.episodes.poll_jobs():
            turns[self.episodes.engine_of(req)].append(req)
        failure: EngineFailure | None = None
        try:
            self._submit(turns)
            self.turns_submitted += sum(len(reqs) for reqs in turns.values())
        except EngineFailure as e:  # the prompts not sent start over: their turns are not counted
            failure = e
        for g in self.episodes.take_finished():
            if g.samples and g.samples[0].is_eval:  # an eval's episodes: collected by the Evaluator
                self.eval_samples.extend(g.samples)
                continue
            if g.prompt_id not in self.outstanding:
                continue  # re-queued meanwhile: it starts over
            del self.outstanding[g.prompt_id]
            groups.append(g)
        return failure

    def outstanding_per_engine(self) -> list[int]:
        """Prompts each engine has work for (the health check's "load"): an episode group counts only while one of
        its turns is on the engine, not while all its episodes wait for tool jobs (no tokens are due then)."""
        waiting: set[str] = set()
        if self.episodes is not None:
            generating = {pid for pid, _ in self.episodes.turns.values()}
            waiting = {pid for pid in self.episodes.groups if pid not in generating}
        load = [0] * len(self.engines)
        for pid, (idx, _) in self.outstanding.items():
            load[idx] += pid not in waiting
        return load

    def wait_groups(self, min_groups: int, deadline: float, on_idle: Callable[[], None] | None = None) -> list[Group]:
        """Poll until `min_groups` complete groups arrived; `on_idle` runs between polls (health, signals)."""
        groups: list[Group] = []
        last_check = time.time()
        try:
            while len(groups) < min_groups:
                groups += self.poll()
                if on_idle is not None and time.time() - last_check > 0.5:
                    on_idle()
                    last_check = time.time()
                if len(groups) >= min_groups:
                    break
                if time.time() > deadline:
                    raise TimeoutError(
                        f"no rollouts within --rollout.timeout-s {self.timeout_s}: {len(self.outstanding)}"
                        f" prompts outstanding on {len(self.engines)} engines"
                    )
                time.sleep(0.005)
        except EngineFailure:
            self.arrived = groups + self.arrived  # what arrived before the failure is not lost with it
            raise
        return groups

    def requeue_from(self, engine_index: int) -> list[str]:
        """Take back every prompt assigned to an engine (it died or was aborted): they will be resubmitted."""
        ids = [pid for pid, (i, _) in self.outstanding.items() if i == engine_index]
        for pid in ids:
            self._take_back(pid)
        return ids

    def order(self, prompt_id: str) -> int:
        return self._order.get(prompt_id, 0)

    def forget(self, prompt_id: str) -> None:
        self.requests.pop(prompt_id, None)
        self._order.pop(prompt_id, None)

    def state_dict(self, in_flight: set[str]) -> dict:
        """Stream position plus the requests of every prompt still in flight: resubmitted first on resume."""
        queued = {r.prompt_id for r in self.requeue}
        reqs = list(self.requeue) + [r for pid, r in self.requests.items() if pid in in_flight and pid not in queued]
        return {"requeue": reqs, "stream": self.stream.state_dict()}

    def load_state_dict(self, d: dict) -> None:
        self.requeue = list(d["requeue"])
        self.stream.load_state_dict(d["stream"])


def is_stale(group: Group, learner_version: int, async_steps: int) -> bool:
    """Staleness = learner version - version_start of the oldest sample (the conservative end, docs/design.md, Records)."""
    return learner_version - min(s.version_start for s in group.samples) > async_steps
