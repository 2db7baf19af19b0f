"""The training loop: collect -> advantages -> pack -> train -> sync -> eval -> log -> checkpoint.

Reads like the algorithm; the policies live in small components: `RolloutCollector` (in-flight budget,
staleness, shaping, filtering), `PromptLedger` (accounting), `WeightUpdater` (learners -> engines), `Evaluator`
(in-training evals), `rlvr.algorithms` (math), `RunDir` (checkpoints), `rlvr.faults` (fault injection, nothing by
default). Every `ray.get` has a timeout; an actor that dies raises here with its traceback and fails the run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import ray

from rlvr import faults
from rlvr.algorithms.advantages import AdvantageConfig, assign_group_advantages
from rlvr.algorithms.packing import pack_step
from rlvr.algorithms.shaping import ShapingConfig, episode_length_cap
from rlvr.config import ExperimentConfig
from rlvr.orchestration.accounting import PromptLedger, source_drops
from rlvr.orchestration.actors import call_failed, engine_get
from rlvr.orchestration.checkpoint import CheckpointError, RunDir, load_learners, read_driver_state, write_driver_state
from rlvr.orchestration.collector import RolloutCollector, VerifierScorer
from rlvr.orchestration.episodes import build_episode_runner
from rlvr.orchestration.evaluation import Evaluator
from rlvr.orchestration.health import (
    EngineFailure,
    EngineWatch,
    LearnerFailure,
    StopRequested,
    describe,
    skipped_steps_message,
)
from rlvr.orchestration.request_codec import request_from_json, request_to_json
from rlvr.orchestration.rollouts import RolloutFeeder
from rlvr.orchestration.stats import sample_records
from rlvr.orchestration.weight_updates import WeightUpdater, learner_get
from rlvr.telemetry.logs import CONSOLE, get_logger
from rlvr.telemetry.reduce import reduce_all
from rlvr.telemetry.run_log import RunLog
from rlvr.types import Group, PackedBatch

logger = get_logger(__name__)


class Trainer:
    """Drives already-created actors (see `rlvr.orchestration.run`)."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        run_dir: RunDir,
        actors: Any,
        stream: Any,
        eval_requests: list,
        model_dir: str,
        pad_token_id: int,
        wandb: Any = None,
        fault_hooks: faults.NoFaults | None = None,
    ) -> None:
        self.cfg, self.run_dir, self.actors = cfg, run_dir, actors
        self.model_dir, self.pad_token_id = model_dir, pad_token_id
        self.eval_requests = eval_requests
        self.timeout = cfg.cluster.actor_timeout_s
        self.faults = fault_hooks or faults.injector()
        self.ledger = PromptLedger()
        episodes = build_episode_runner(cfg, model_dir, actors)  # rows routed to an environment (docs/multi-turn.md)
        self.feeder = RolloutFeeder(actors.engines, stream, self.ledger, cfg.rollout.timeout_s, episodes)
        self.step = 0  # completed training steps == learner policy version
        self.log = RunLog(run_dir.root, cfg.num_steps, cfg.logging, wandb)
        a = cfg.algorithm
        self.adv_cfg = AdvantageConfig(a.advantage_scale, a.advantage_std, a.advantage_eps)
        self.pack_args = {
            "num_mini_batches": a.num_mini_batches,
            "num_ranks": len(actors.learners),
            "pack_length": cfg.learner.pack_length,
            "micro_batch_rows": cfg.learner.micro_batch_rows,
            "pad_token_id": pad_token_id,
        }
        self.failures: list[dict[str, Any]] = []
        self.weights = WeightUpdater(actors, self.timeout)
        self.score = VerifierScorer(actors, self.timeout)
        shaping = ShapingConfig.from_config(a, cfg.generation.max_new_tokens, episode_length_cap(cfg.env))
        self.collector = RolloutCollector(
            self.feeder,
            self.ledger,
            cfg.rollout,
            shaping,
            self.score,
            on_idle=self._health,
            on_engine_failure=self._replace_engine,
        )
        self.evals = Evaluator(
            cfg,
            actors,
            eval_requests,
            self.feeder,
            self.collector,
            self.score,
            self.log,
            self._replace_engine,
            self.faults,
        )
        self.signals: Any = None  # StopSignals of the process, set by run.train
        self.stopped = False
        self.saved_step = -1  # the step of the last checkpoint written or restored
        self.engine_restarts = 0
        self.watch = EngineWatch(len(actors.engines), cfg.cluster.heartbeat_timeout_s)
        self._busy_snaps: dict[int, tuple[float, float]] = {}  # engine -> (busy_s, uptime_s) at the last step

    # ------------------------------------------------------------------ the step
    def train_step(self) -> dict[str, float] | None:
        """One step: collect -> advantages -> pack -> train -> sync -> eval -> log -> checkpoint (None: no data)."""
        t_step = time.perf_counter()
        collected = self.collector.collect(self.step)
        if collected is None:
            logger.warning("training data exhausted at step %d (%s)", self.step, source_drops(self.feeder.stream))
            return None
        groups, m = collected
        m.update(assign_group_advantages(groups, self.adv_cfg))
        per_rank, pack_metrics = pack_step(groups, **self.pack_args)
        m.update(pack_metrics)
        m.update(self._train(per_rank))
        self.evals.finish()  # an overlapped eval must see the previous weights only (logged to eval.jsonl)
        m.update(self._sync())
        m.update(self._account(groups))
        m.update(self._throughput(groups, time.perf_counter() - t_step))
        m.update(self._eval_after_step())
        m["health/engine_restarts"] = float(self.engine_restarts)  # after the eval, which may replace one
        self.log.step(self.step, m, sample_records(groups, self.step, self.cfg.logging.num_logged_samples))
        every = self.cfg.checkpoint.every_n_steps
        if (every and self.step % every == 0) or (self.step == self.cfg.num_steps and self.cfg.checkpoint.save_final):
            self.save_checkpoint()
        return m

    def _train(self, per_rank: list[list[PackedBatch]]) -> dict[str, float]:
        """Every rank trains on its batches: one policy version; metrics of all ranks, each reduced by its type."""
        t0 = time.perf_counter()
        slept: dict[str, float] = {}
        if self.weights.colocated and self.cfg.rollout.colocate_sleep:  # give the learner the GPU memory
            self.evals.finish()  # asleep, the engines could not finish an overlapped eval
            t_sleep = time.perf_counter()
            self.weights.sleep_engines()
            slept["time/engine_sleep"] = time.perf_counter() - t_sleep  # inside time/train
        self.faults.before_train(self.step + 1, self.actors)
        refs = [lrn.train_batch.remote(b) for lrn, b in zip(self.actors.learners, per_rank)]
        deadline = time.time() + self.timeout  # one actor timeout for the learners, pump included
        turns, failure = self._advance_episodes_until(refs, deadline)
        outs = learner_get(refs, "train_batch", max(1.0, deadline - time.time()))
        self.step += 1
        self.collector.advance()
        if failure is not None:  # met while the learners trained: replaced now, synced to the new weights
            self._replace_engine(failure)
        return {**reduce_all(outs), "time/train": time.perf_counter() - t0, **slept, **turns}

    def _advance_episodes_until(self, refs: list[Any], deadline: float) -> tuple[dict[str, float], Any]:
        """While the learners train: episodes take their next turns (tool answers in, next turns submitted, finished
        groups scored and held for the next step), so multi-turn rollouts do not wait for the train step.

        Only with episodes, awake engines and `async_steps` >= 1 (on-policy, whatever is generated now is stale by
        the next step). Submits no new prompts, so the in-flight window is unchanged. Stops when every learner has
        answered, one has failed, or at `deadline`. An engine failure stops it and is returned, to be handled (the
        engine replaced, its prompts re-queued) once the learners are done. Returns (`env/turns_during_train`, the
        failure or None)."""
        episodes = self.feeder.episodes
        asleep = self.weights.colocated and self.cfg.rollout.colocate_sleep
        if episodes is None or not episodes.groups or asleep or self.cfg.rollout.async_steps < 1:
            return {}, None
        before, pending, failure = self.feeder.turns_submitted, list(refs), None
        while pending and time.time() < deadline:
            try:
                self.collector.hold(self.feeder.poll())
            except EngineFailure as e:
                logger.warning("%s while the learners train: replacing it after the train step", e)
                failure = e
                break
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.01)
            if any(call_failed(r) for r in ready):
                break  # learner_get raises it
        return {"env/turns_during_train": float(self.feeder.turns_submitted - before)}, failure

    def _sync(self) -> dict[str, float]:
        """The new weights to the engines; a failed engine is replaced (and synced) instead."""
        t0 = time.perf_counter()
        self.faults.before_sync(self.step, self.actors)
        try:
            sync = self.weights.sync(self.step)
        except EngineFailure as e:  # the group is broken for everyone: rebuilt with the replacement
            self._replace_engine(e)
            sync = {}
        return {**sync, "time/sync": time.perf_counter() - t0}

    def _account(self, groups: list[Group]) -> dict[str, float]:
        for g in groups:
            self.collector.finish(g.prompt_id, "trained")
        self.ledger.count_source_drops(**source_drops(self.feeder.stream))
        self.ledger.check()
        return {**self.ledger.metrics(), **self.score.metrics()}

    def _throughput(self, groups: list[Group], wall: float) -> dict[str, float]:
        per_s = sum(s.num_tokens for g in groups for s in g.samples) / wall
        workers = len(self.actors.learners) + len(self.actors.engines)
        out = {"time/step": wall, "perf/tokens_per_s": per_s, "perf/tokens_per_s_per_worker": per_s / workers}
        return {**out, **self._engine_busy()}

    def _engine_busy(self) -> dict[str, float]:
        """`perf/engine_busy_frac`: the share of its time since the previous step that each engine had requests in
        flight (generating, or paused for a weight update with requests held), mean over engines. From each engine's
        own `busy_s` and `uptime_s` counters; an engine that was replaced (its uptime went back) or does not answer
        within the heartbeat timeout is left out until the next step (its failure is the health check's to handle)."""
        snaps: dict[int, tuple[float, float]] = {}
        fracs = []
        refs = [e.stats.remote() for e in self.actors.engines]
        real = [r for r in refs if isinstance(r, ray.ObjectRef)]  # one wait for all: a hung engine costs one timeout
        if real:
            ray.wait(real, num_returns=len(real), timeout=self.cfg.cluster.heartbeat_timeout_s)
        for i, ref in enumerate(refs):
            try:
                st = engine_get(ref, i, 0.01)
            except Exception as e:  # the next collect's health check replaces a failed or hung engine
                logger.debug("engine %d stats for perf/engine_busy_frac: %s", i, e)
                continue
            now = (float(st.get("busy_s", 0.0)), float(st.get("uptime_s", 0.0)))
            snaps[i] = now
            prev = self._busy_snaps.get(i)
            if prev is not None and now[1] > prev[1] and now[0] >= prev[0]:
                fracs.append(min(1.0, (now[0] - prev[0]) / (now[1] - prev[1])))
        self._busy_snaps = snaps
        return {"perf/engine_busy_frac": sum(fracs) / len(fracs)} if fracs else {}

    def _eval_after_step(self) -> dict[str, float]:
        cfg = self.cfg.eval
        if self.step == self.cfg.num_steps:
            return self.evals.evaluate(self.step)
        if cfg.every_n_steps and self.step % cfg.every_n_steps == 0:
            if not cfg.overlap:
                return self.evals.evaluate(self.step)
            self.evals.start(self.step)  # logged to eval.jsonl when done, before the next weight sync
        return {}

    # ------------------------------------------------------------------ engines
    def _health(self) -> None:
        """Between polls: stop signals, and engines with work but no progress (stuck)."""
        if self.signals is not None and self.signals.requested:
            raise StopRequested(self.signals.requested)
        load = self.feeder.outstanding_per_engine()
        refs = [e.stats.remote() for e in self.actors.engines]
        for i, ref in enumerate(refs):
            stats = engine_get(ref, i, self.cfg.cluster.heartbeat_timeout_s)  # dead/unresponsive -> EngineFailure
            reason = self.watch.update(i, float(stats.get("generated_tokens", 0.0)), load[i])
            if reason:
                raise EngineFailure(i, reason)

    def _replace_engine(self, failure: EngineFailure) -> None:
        """Kill, re-create, re-sync to the current weights, and re-queue the engine's prompts."""
        i = failure.index
        self.engine_restarts += 1
        if self.engine_restarts > self.cfg.cluster.max_engine_restarts:
            raise RuntimeError(
                f"{failure}; --cluster.max-engine-restarts {self.cfg.cluster.max_engine_restarts} used up"
            ) from failure
        logger.error(
            "%s: replacing it (restart %d of %d)", failure, self.engine_restarts, self.cfg.cluster.max_engine_restarts
        )
        ray.kill(self.actors.engines[i])
        self._busy_snaps.pop(i, None)  # the new engine's counters start from zero
        self.evals.drop()
        requeued = self.feeder.requeue_from(i)
        self.actors.engines[i] = self.actors.factory.engine(i, version=self.step)
        self.feeder.engines = self.actors.engines
        self.watch.reset(i)
        self._reconnect_weight_sync()
        self.failures.append(
            {"step": self.step, "actor": f"engine {i}", "reason": failure.reason, "requeued_prompts": len(requeued)}
        )
        logger.info("engine %d replaced at version %d; %d prompts re-queued", i, self.step, len(requeued))

    def _reconnect_weight_sync(self, attempts: int = 3) -> None:
        """Rebuild the weight-sync group with the replacement engine and sync it. A learner call may meet Ray's
        `ActorUnavailableError` once: the failed sync cancelled the learners' send, and a cancelled call that never
        reached the actor leaves a gap in its call order, which Ray waits out, fails the calls queued behind it, and
        then skips. Those calls are made again (up to `attempts` times), also when `learner_get`/`engine_get` wrapped
        that error; any other failure propagates."""
        for attempt in range(1, attempts + 1):
            try:
                self.actors.factory.connect_weight_sync(self.actors)
                self.weights.sync(self.step)
                return
            except (ray.exceptions.ActorUnavailableError, LearnerFailure, EngineFailure) as e:
                unavailable = isinstance(e, ray.exceptions.ActorUnavailableError) or isinstance(
                    e.__cause__, ray.exceptions.ActorUnavailableError
                )
                if not unavailable or attempt == attempts:
                    raise
                logger.warning("weight-sync reconnect, attempt %d of %d: %s", attempt, attempts, describe(e))

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> Path:
        tmp = self.run_dir.tmp_checkpoint(self.step)
        state = tmp / "trainer_state"
        learner_get(
            [lrn.save.remote(str(state), str(tmp), self.model_dir) for lrn in self.actors.learners],
            "save",
            self.timeout,
        )
        self.faults.during_checkpoint(self.step)
        feeder = self.feeder.state_dict(self.ledger.in_flight)
        feeder["requeue"] = [request_to_json(r) for r in feeder["requeue"]]
        write_driver_state(state, {"step": self.step, "ledger": self.ledger.state_dict(), "feeder": feeder})
        final = self.run_dir.commit_checkpoint(tmp, self.step, self.cfg.checkpoint.keep_last)
        self.saved_step = self.step
        return final

    def restore(self, ckpt: Path) -> None:
        """Load a checkpoint that `RunDir.find_resume` verified and scanned: the driver's JSON state first, then
        every learner's weights and weights-only optimizer/RNG state."""
        d = read_driver_state(ckpt)
        try:
            d["feeder"]["requeue"] = [request_from_json(r) for r in d["feeder"]["requeue"]]
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"checkpoint {ckpt}: driver state holds a malformed prompt request: {e}") from e
        load_learners(self.actors.learners, ckpt, self.timeout)
        self.step = self.saved_step = d["step"]
        self.ledger.load_state_dict(d["ledger"])
        try:
            self.feeder.load_state_dict(d["feeder"])
        except ValueError as e:  # the prompt stream refuses a position over other datasets
            raise CheckpointError(f"checkpoint {ckpt}: {e}") from None
        self.collector.pending = []  # groups collected ahead of the checkpoint are regenerated (ids in flight)
        self.log.truncate_after(self.step)
        self.weights.sync(self.step)
        logger.info("resumed from %s at step %d", ckpt, self.step, extra=CONSOLE)

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, float]:
        """Train until `num_steps` (or the data runs out); returns the last step's metrics."""
        last: dict[str, float] = {}
        if self.cfg.eval.at_step_0 and self.step == 0:
            last.update(self.evals.evaluate(self.step))
            self.log.baseline(last)
        while self.step < self.cfg.num_steps:
            if self.signals is not None and self.signals.requested:
                return self._stop(last)
            self.faults.before_collect(self.step + 1, self.actors)
            try:
                m = self.train_step()
            except StopRequested:
                return self._stop(last)
            if m is None:
                return self._end_of_data(last)
            last = m
            if m.get("learner/consecutive_skips", 0) >= self.cfg.learner.max_consecutive_skips:
                raise RuntimeError(skipped_steps_message(m, self.cfg.learner.max_consecutive_skips))
        return last

    def _end_of_data(self, last: dict[str, float]) -> dict[str, float]:
        """The data ran out before num_steps: end as at num_steps, losing nothing trained: the eval in flight is
        written, the last weights get their eval if none measured them, and the final checkpoint is saved."""
        last.update(self.evals.finish())
        if self.step > 0 and self.evals.unmeasured(self.step):
            last.update(self.evals.evaluate(self.step))
        if self.step > 0 and self.cfg.checkpoint.save_final and self.saved_step != self.step:
            self.save_checkpoint()
        return last

    def _stop(self, last: dict[str, float]) -> dict[str, float]:
        """A stop signal: checkpoint (prompts in flight are re-queued on resume) and report preemption."""
        if self.step == 0:  # nothing trained: a fresh start later loses nothing
            logger.warning("stop requested (%s) before the first step: no checkpoint needed", self.signals.requested)
        elif self.saved_step == self.step:
            logger.warning(
                "stop requested (%s) at step %d: its checkpoint is already written", self.signals.requested, self.step
            )
        else:
            logger.warning("stop requested (%s) at step %d: writing a checkpoint", self.signals.requested, self.step)
            self.save_checkpoint()
        self.stopped = True
        return last

    def close(self) -> None:
        self.log.close()
