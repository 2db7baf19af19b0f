"""The trainer's in-training eval: submitted beside the next step's rollouts (overlapped) or blocking.

An overlapped eval generates with the weights of the step that started it: the next weight sync first waits for
it (`finish`). Its metrics are those of `rlvr eval` (`rlvr.eval.runner.summarize_groups`, the one eval-metrics
implementation), written to eval.jsonl at the step whose weights were measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rlvr.faults import NoFaults
from rlvr.orchestration.actors import engine_get
from rlvr.orchestration.health import EngineFailure
from rlvr.orchestration.stats import sample_records
from rlvr.telemetry.logs import get_logger
from rlvr.types import Group, Sample

logger = get_logger(__name__)


def eval_metrics(groups: list[Group], num_samples: int) -> dict[str, float]:
    """`rlvr eval`'s summary under `eval/` (pass@k for k = 1, 2, 4, ... num_samples), plus `eval/reward_mean`
    (`eval/reward/total_mean`, 0 when nothing was scored), the key the console, summaries and tools read."""
    from rlvr.eval.cli import default_ks
    from rlvr.eval.runner import summarize_groups

    metrics = summarize_groups(groups, ks=default_ks(num_samples))[0]
    metrics["eval/reward_mean"] = metrics.get("eval/reward/total_mean", 0.0)
    return metrics


def _eval_turns(episodes: Any, request: Any, engine: int) -> list:
    """The request itself (single-turn), or the first turns of its episodes (a row routed to an environment)."""
    env = episodes.route(request)
    return [request] if env is None else episodes.start(request, env, engine)


class Evaluator:
    """Start, finish and run evals on the trainer's engines.

    `collector` keeps the training groups that arrive while an eval is awaited; `on_engine_failure` replaces a
    failed engine (and calls `drop`: the eval in flight is lost, the run goes on)."""

    def __init__(
        self,
        cfg: Any,
        actors: Any,
        requests: list,
        feeder: Any,
        collector: Any,
        score: Callable[[list[Group]], float],
        log: Any,
        on_engine_failure: Callable[[EngineFailure], None],
        faults: NoFaults | None = None,
    ) -> None:
        self.cfg, self.actors, self.requests, self.feeder, self.collector = cfg, actors, requests, feeder, collector
        self.score, self.log, self.on_engine_failure = score, log, on_engine_failure
        self.faults = faults or NoFaults()
        self.timeout = cfg.cluster.actor_timeout_s
        self.inflight: dict[str, Any] | None = None
        self.evaluated_step = -1  # the step of the last eval written to eval.jsonl

    def unmeasured(self, step: int) -> bool:
        """Periodic evals are on and the weights of `step` have none yet (the run ends early: give them one)."""
        return bool(self.requests and self.cfg.eval.every_n_steps and self.evaluated_step != step)

    def drop(self) -> None:
        """An engine failed: the eval in flight cannot complete."""
        if self.inflight is not None:
            logger.warning("dropping the eval of step %d in flight (its engine failed)", self.inflight["step"])
            self.inflight = None

    def start(self, step: int, overlapped: bool = True) -> None:
        """Submit the eval prompts without waiting: they generate beside the next step's rollouts, still with this
        step's weights, because the next weight sync first waits for them (`finish`)."""
        if not self.requests:
            return
        self.feeder.eval_samples = []
        logger.info("eval of step %d started (%d prompts)", step, len(self.requests))
        self.inflight = {
            "step": step,
            "t0": time.perf_counter(),
            "overlapped": overlapped,
            "expected": {(r.prompt_id, j) for r in self.requests for j in range(r.num_samples)},
        }
        n = len(self.actors.engines)
        episodes = getattr(self.feeder, "episodes", None)
        if episodes is not None:
            episodes.drop_eval()  # episodes of an eval dropped earlier never finish: forget them
            episodes.note_version(step)  # an episode without a turn is stamped with the eval's version
        try:
            for i, (e, part) in enumerate(zip(self.actors.engines, [self.requests[i::n] for i in range(n)])):
                if episodes is not None:  # env rows run episodes; their finished samples join eval_samples
                    part = [t for r in part for t in _eval_turns(episodes, r, i)]
                if part:
                    engine_get(e.submit.remote(part), i, self.timeout)
        except EngineFailure as e:
            self.on_engine_failure(e)  # drops this eval; the run goes on
        self.faults.after_eval_submit(step, self.actors)

    def finish(self) -> dict[str, float]:
        """Wait for the eval in flight, score it, write eval.jsonl (at the step whose weights it used)."""
        ev = self.inflight
        if ev is None:
            return {}
        ours = self._wait(ev)
        if ours is None:
            return {}
        self.inflight = None
        groups: dict[str, Group] = {}
        for smp in ours.values():
            groups.setdefault(smp.prompt_id, Group(prompt_id=smp.prompt_id, samples=[])).samples.append(smp)
        glist = sorted(groups.values(), key=lambda g: g.prompt_id)
        for g in glist:
            g.samples.sort(key=lambda smp: smp.sample_index)
        self.score(glist)
        metrics = eval_metrics(glist, self.cfg.eval.num_samples)
        metrics["time/eval"] = time.perf_counter() - ev["t0"]
        self.evaluated_step = ev["step"]
        # a blocking eval's metrics go to wandb with its step's
        self.log.eval(
            ev["step"],
            metrics,
            sample_records(glist, ev["step"], self.cfg.logging.num_logged_samples),
            to_wandb=ev["overlapped"],
        )
        return metrics

    def _wait(self, ev: dict[str, Any]) -> dict[tuple[str, int], Sample] | None:
        """One sample per (prompt, sample index) of this eval; None when an engine failed meanwhile.

        An eval dropped when its engine failed leaves samples behind on the living engines: those of an earlier
        step differ in version_start and are ignored; those of the same step (the blocking eval's retry) are
        equivalent, and counted once."""
        deadline = time.time() + self.cfg.rollout.timeout_s
        ours: dict[tuple[str, int], Sample] = {}
        seen = 0
        while True:
            for smp in self.feeder.eval_samples[seen:]:
                key = (smp.prompt_id, smp.sample_index)
                if smp.version_start == ev["step"] and key in ev["expected"]:
                    ours.setdefault(key, smp)
            seen = len(self.feeder.eval_samples)
            if len(ours) == len(ev["expected"]):
                return ours
            try:
                groups = self.feeder.poll()  # training groups arriving meanwhile are kept for the next step
            except EngineFailure as e:
                self.on_engine_failure(e)  # drops this eval; the run goes on
                return None
            self.collector.hold(groups)
            if time.time() > deadline:
                raise TimeoutError(f"eval of step {ev['step']} incomplete after --rollout.timeout-s")
            time.sleep(0.005)

    def evaluate(self, step: int) -> dict[str, float]:
        """Blocking eval with the current weights (run again on the replacement if an engine fails during it)."""
        for _attempt in range(2):
            self.start(step, overlapped=False)
            metrics = self.finish()
            if metrics or not self.requests:
                return metrics
        return {}
