"""Collecting one training step's groups: the in-flight budget, staleness drops, shaping, filtering, and the policy
for a step whose prompts are all uninformative.

Rules (docs/design.md, Algorithms: staleness; AReaL-style bounded staleness), all in `RolloutCollector`:
- window: at most (async_steps + 1) * B prompts are submitted and unresolved or held; with async_steps = 0 that
  is one step's worth, submitted after the weight sync, so every sample is on-policy.
- budget: submissions still allowed. The window to start, B more per trained step (`advance`), one back per
  stale drop (regenerated with fresher weights) and, under active sampling, per filtered group (the step is
  topped up), B more per collection round without an informative group; at most max_pull_factor * B pulls per
  round.
- staleness: a group whose oldest sample was admitted more than async_steps versions before the learner's
  version is dropped (`dropped_stale`).
- a step takes B resolved prompts, or B informative groups under active sampling; arrivals beyond that are held
  (`pending`) for the next step, and count against the window.
- no informative group: a round whose resolved groups were all filtered (zero variance) is followed by another,
  up to `NO_SIGNAL_ROUNDS`; then the step trains on the last round's zero-variance groups (advantage 0), so that
  step and policy version advance (a solved task would otherwise stall the run). Each prompt ends in one ledger
  state: those groups are `trained`, never `filtered` first.

`collect` returns (groups, metrics), or None when the data ran out with nothing left to train. The collector
talks to engines only through a `RolloutFeeder` (any engine handle, see `rlvr.orchestration.rollouts`), to the
verifiers through `score`, to health checks through `on_idle` and to engine replacement through
`on_engine_failure`: a fake engine drives it in-process (tests/orchestration/test_collector.py).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import ray

from rlvr.algorithms.filtering import filter_groups
from rlvr.algorithms.shaping import ShapingConfig, shape_group
from rlvr.orchestration.accounting import PromptLedger
from rlvr.orchestration.actors import replace_verifiers
from rlvr.orchestration.episodes import is_episode, sample_episode_reward
from rlvr.orchestration.health import EngineFailure, describe
from rlvr.orchestration.rollouts import RolloutFeeder, is_stale
from rlvr.orchestration.stats import rollout_metrics
from rlvr.telemetry.episodes import episode_metrics
from rlvr.telemetry.logs import get_logger
from rlvr.types import Group

logger = get_logger(__name__)

NO_SIGNAL_ROUNDS = 20
"""Collection rounds in a row without one informative group after which a step trains on zero-advantage groups.
Large enough that a noisy task finds signal again (each round is a fresh B prompts), small enough that a solved
task costs only that many rounds of generation per step."""


class RolloutCollector:
    """Owns the prompts between the stream and the learner (module docstring)."""

    def __init__(
        self,
        feeder: RolloutFeeder,
        ledger: PromptLedger,
        rollout: Any,
        shaping: ShapingConfig,
        score: Callable[[list[Group]], float],
        on_idle: Callable[[], None] | None = None,
        on_engine_failure: Callable[[EngineFailure], None] | None = None,
        no_signal_rounds: int = NO_SIGNAL_ROUNDS,
    ) -> None:
        self.feeder, self.ledger, self.cfg, self.shaping = feeder, ledger, rollout, shaping
        self.score, self.on_idle, self.no_signal_rounds = score, on_idle, no_signal_rounds
        self.on_engine_failure = on_engine_failure or _reraise
        self.batch = rollout.prompts_per_step
        self.window = (rollout.async_steps + 1) * self.batch
        self.budget = self.window
        self.pending: list[Group] = []  # scored groups collected ahead of their step

    def advance(self) -> None:
        """A step was trained: the next step's worth may be generated."""
        self.budget += self.batch

    def hold(self, groups: list[Group]) -> None:
        """Score groups that arrived while the driver waited for something else (an eval): the next step's."""
        if groups:
            self.score(groups)
            self.pending.extend(groups)

    def finish(self, prompt_id: str, state: str) -> None:
        self.ledger.finish(prompt_id, state)
        self.feeder.forget(prompt_id)

    def collect(self, step: int) -> tuple[list[Group], dict[str, float]] | None:
        """The groups of step `step + 1` in submission order, and their metrics; None when the data ran out."""
        for round_ in range(1, self.no_signal_rounds + 1):
            groups, metrics, uninformative = self._round(step)
            if groups:
                self._finish_all(uninformative, "filtered")
                break
            if self.feeder.exhausted and not self.feeder.busy and not self.pending:
                self._finish_all(uninformative, "filtered")
                return None
            self.budget += self.batch  # another round of this step's worth
            if round_ < self.no_signal_rounds:
                self._finish_all(uninformative, "filtered")
                logger.warning("step %d: no informative group among the resolved prompts; collecting again", step + 1)
        else:
            logger.warning(
                "%d collection rounds without an informative group (all-correct %d, all-wrong %d): "
                "training on zero-advantage groups",
                self.no_signal_rounds,
                metrics.get("data/groups_all_correct", 0),
                metrics.get("data/groups_all_wrong", 0),
            )
            groups = uninformative
        groups.sort(key=lambda g: self.feeder.order(g.prompt_id))  # deterministic batch order
        return groups, metrics

    def _finish_all(self, groups: list[Group], state: str) -> None:
        for g in groups:
            self.finish(g.prompt_id, state)

    def _round(self, step: int) -> tuple[list[Group], dict[str, float], list[Group]]:
        """Resolve prompts until B informative groups (active sampling) or B resolved prompts; returns those, the
        metrics, and the resolved groups filtered out (zero variance; not yet finished in the ledger)."""
        r, B = self.cfg, self.batch
        m: dict[str, float] = defaultdict(float)
        kept: list[Group] = []
        uninformative: list[Group] = []
        resolved_groups: list[Group] = []
        resolved = pulls = 0
        max_pulls = int(r.max_pull_factor * B)
        deadline = time.time() + r.timeout_s
        t0 = time.perf_counter()

        def full() -> bool:
            return len(kept) >= B if r.active_sampling else resolved >= B

        episodes = getattr(self.feeder, "episodes", None)
        if episodes is not None:
            episodes.note_version(step)  # episodes started now are admitted under the learner's version
        while not full():
            try:
                n = self.feeder.top_up(
                    min(self.budget, max(0, max_pulls - pulls)), limit=self.window - len(self.pending) - len(kept)
                )
            except EngineFailure as e:
                self.on_engine_failure(e)
                continue
            self.budget -= n
            pulls += n
            if not self.pending and not self.feeder.busy:
                if self.feeder.exhausted or pulls >= max_pulls or self.budget <= 0:
                    break
            groups, self.pending = self.pending, []
            if not groups:
                t_wait = time.perf_counter()
                try:
                    groups = self.feeder.wait_groups(1, deadline, on_idle=self.on_idle)
                except EngineFailure as e:
                    self.on_engine_failure(e)
                    continue
                m["time/wait_generation"] += time.perf_counter() - t_wait
                m["time/reward"] += self.score(groups)
            groups.sort(key=lambda g: min(s.version_start for s in g.samples))  # oldest first: fewer stale drops
            for g in groups:
                if is_stale(g, step, r.async_steps):
                    logger.debug(
                        "dropping stale group %s: version_start %s at learner version %d",
                        g.prompt_id,
                        sorted({smp.version_start for smp in g.samples}),
                        step,
                    )
                    self.finish(g.prompt_id, "dropped_stale")
                    self.budget += 1  # regenerate it with fresh weights
                    m["rollout/dropped_stale"] += 1
                    continue
                if full():
                    self.pending.append(g)  # early arrivals for the next step
                    continue
                for k, v in shape_group(g, self.shaping).items():
                    m[k] += v
                resolved += 1
                resolved_groups.append(g)
                if not r.filter_zero_variance:
                    kept.append(g)
                    continue
                keep, fm = filter_groups([g])
                for k, v in fm.items():
                    m[k] += v
                (kept if keep else uninformative).append(g)
                if not keep and r.active_sampling:
                    self.budget += 1  # top the step up with another prompt
        m["time/generation"] = time.perf_counter() - t0 - m.get("time/reward", 0.0)
        m["data/real_batch_size_ratio"] = len(kept) / max(resolved, 1)
        m.update(rollout_metrics(resolved_groups, step))
        m.update(episode_metrics(resolved_groups))
        if episodes is not None:
            m.update(episodes.metrics())  # env/restarts, env/lost_jobs (only once episodes have run)
        return kept, dict(m), uninformative


def _reraise(failure: EngineFailure) -> None:
    raise failure


class VerifierScorer:
    """Scores groups in place on the verifier actors (`actors.verifiers`); returns the seconds it took. A dead
    verifier actor is replaced once (`replace_verifiers`) and the batch scored again."""

    def __init__(self, actors: Any, timeout_s: float) -> None:
        self.actors, self.timeout = actors, timeout_s

    def __call__(self, groups: list[Group]) -> float:
        t0 = time.perf_counter()
        scored = [s for g in groups for s in g.samples if not is_episode(s)]  # episodes carry their reward terms
        items = [
            (s.completion_text, {**s.metadata, "finish_reason": s.finish_reason}, s.completion_token_ids)
            for s in scored
        ]
        results: list = [None] * len(items)
        if items:
            outs = self._score_items(items)
            for i, out in enumerate(outs):
                results[i :: len(outs)] = out
        by_sample = {id(s): r for s, r in zip(scored, results)}
        for g in groups:
            g.rewards = [by_sample[id(s)] if id(s) in by_sample else sample_episode_reward(s) for s in g.samples]
        return time.perf_counter() - t0

    def _score_items(self, items: list) -> list:
        for attempt in (1, 2):
            verifiers = self.actors.verifiers
            chunks = [items[i :: len(verifiers)] for i in range(len(verifiers))]
            try:
                return ray.get(
                    [v.score.remote(c, self.timeout) for v, c in zip(verifiers, chunks)], timeout=self.timeout
                )
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                if attempt == 2:
                    raise
                replace_verifiers(self.actors, e)
        raise AssertionError("unreachable")

    def metrics(self) -> dict[str, float]:
        """The verifier actors' counters, summed over those that answer (a dead one is skipped: scoring or the
        episodes' tool runner replaces it; its counters since the last step are lost)."""
        m: dict[str, float] = {}
        for ref in [v.metrics.remote() for v in self.actors.verifiers]:
            try:
                counters = ray.get(ref, timeout=self.timeout)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                logger.warning("a verifier actor did not report its metrics (%s)", describe(e))
                continue
            for k, val in counters.items():
                m[k] = m.get(k, 0.0) + val
        return m
