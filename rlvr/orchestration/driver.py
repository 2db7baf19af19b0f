"""The training loop: generate -> score -> advantages -> filter -> pack -> train -> sync -> log -> eval -> checkpoint.

Reads like the algorithm; the policies live in small components: `RolloutFeeder` (in-flight prompts and
staleness), `PromptLedger` (accounting), `WeightUpdater` (learners -> engines), `rlvr.algorithms` (math),
`RunDir` (checkpoints). Every `ray.get` has a timeout; an actor that dies raises here with its traceback and
fails the run.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import ray

from rlvr.algorithms.advantages import AdvantageConfig, assign_group_advantages
from rlvr.algorithms.filtering import filter_groups
from rlvr.algorithms.packing import PackInput, build_packed_batches
from rlvr.algorithms.shaping import ShapingConfig, shape_group
from rlvr.config import ExperimentConfig
from rlvr import faults
from rlvr.orchestration.accounting import PromptLedger, source_drops
from rlvr.orchestration.health import EngineFailure, EngineWatch, StopRequested, describe
from rlvr.orchestration.checkpoint import (FRESH_START_HINT, CheckpointError, RunDir, read_driver_state,
                                           write_driver_state)
from rlvr.orchestration.request_codec import request_from_json, request_to_json
from rlvr.orchestration.rollouts import RolloutFeeder, engine_get, is_stale
from rlvr.orchestration.stats import eval_metrics, rollout_metrics, sample_records
from rlvr.orchestration.weight_updates import WeightUpdater, learner_get
from rlvr.telemetry.logs import CONSOLE, get_logger
from rlvr.telemetry.run_log import RunLog
from rlvr.types import Group, PackedBatch, Sample

logger = get_logger(__name__)


class Trainer:
    """Drives already-created actors (see `rlvr.orchestration.run`)."""

    def __init__(self, cfg: ExperimentConfig, run_dir: RunDir, actors: Any, stream: Any, eval_requests: list,
                 model_dir: str, pad_token_id: int, wandb: Any = None) -> None:
        self.cfg, self.run_dir, self.actors = cfg, run_dir, actors
        self.model_dir, self.pad_token_id = model_dir, pad_token_id
        self.eval_requests = eval_requests
        self.timeout = cfg.cluster.actor_timeout_s
        self.ledger = PromptLedger()
        self.feeder = RolloutFeeder(actors.engines, stream, self.ledger, cfg.rollout.prompts_per_step,
                                    cfg.rollout.async_steps, cfg.rollout.timeout_s)
        self.step = 0  # completed training steps == learner policy version
        self.pending: list[Group] = []  # scored groups collected ahead of their step
        self.log = RunLog(run_dir.root, cfg.num_steps, cfg.logging, wandb)
        self.adv_cfg = AdvantageConfig(cfg.algorithm.advantage_scale, cfg.algorithm.advantage_std,
                                       cfg.algorithm.advantage_eps)
        a = cfg.algorithm
        self.failures: list[dict[str, Any]] = []
        self.weights = WeightUpdater(actors, self.timeout)
        self.eval_inflight: dict[str, Any] | None = None
        # submissions still allowed: (async_steps + 1) * B to start, B more per trained step, one more per stale
        # drop (and per filtered group under active sampling): the bound that keeps staleness <= async_steps
        self.budget = (cfg.rollout.async_steps + 1) * cfg.rollout.prompts_per_step
        self.signals: Any = None  # StopSignals of the process, set by run.train
        self.stopped = False
        self.saved_step = -1  # the step of the last checkpoint written or restored
        self.evaluated_step = -1  # the step of the last eval written to eval.jsonl
        self.engine_restarts = 0
        self.watch = EngineWatch(len(actors.engines), cfg.cluster.heartbeat_timeout_s)
        self.shaping = ShapingConfig(cfg.generation.max_new_tokens, a.overlong_buffer, a.overlong_penalty,
                                     a.non_stop_penalty, a.mask_truncated)

    # ------------------------------------------------------------------ phases
    def _score(self, groups: list[Group]) -> float:
        t0 = time.perf_counter()
        items = [(s.completion_text, {**s.metadata, "finish_reason": s.finish_reason}, s.completion_token_ids)
                 for g in groups for s in g.samples]
        if not items:
            return 0.0
        outs = self._score_items(items)
        results = [None] * len(items)
        for i, out in enumerate(outs):
            results[i::len(outs)] = out
        k = 0
        for g in groups:
            g.rewards = results[k:k + g.num_samples]
            k += g.num_samples
        return time.perf_counter() - t0

    def _score_items(self, items: list) -> list:
        """Score on the verifier actors; a dead verifier actor is replaced once and the batch re-scored."""
        for attempt in (1, 2):
            verifiers = self.actors.verifiers
            chunks = [items[i::len(verifiers)] for i in range(len(verifiers))]
            try:
                return ray.get([v.score.remote(c, self.timeout) for v, c in zip(verifiers, chunks)],
                               timeout=self.timeout)
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                if attempt == 2:
                    raise
                logger.error("verifier actor failed (%s): replacing it", describe(e))
                for v in verifiers:
                    ray.kill(v)
                self.actors.verifiers = self.actors.factory.verifiers()
        raise AssertionError("unreachable")

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
            raise RuntimeError(f"{failure}; --cluster.max-engine-restarts {self.cfg.cluster.max_engine_restarts} "
                               "used up") from failure
        logger.error("%s: replacing it (restart %d of %d)", failure, self.engine_restarts,
                     self.cfg.cluster.max_engine_restarts)
        ray.kill(self.actors.engines[i])
        if self.eval_inflight is not None:
            logger.warning("dropping the eval of step %d in flight (its engine failed)", self.eval_inflight["step"])
            self.eval_inflight = None
        requeued = self.feeder.requeue_from(i)
        self.actors.engines[i] = self.actors.factory.engine(i, version=self.step)
        self.feeder.engines = self.actors.engines
        self.watch.reset(i)
        self.actors.factory.connect_weight_sync(self.actors)
        self.weights.sync(self.step)
        self.failures.append({"step": self.step, "actor": f"engine {i}", "reason": failure.reason,
                              "requeued_prompts": len(requeued)})
        logger.info("engine %d replaced at version %d; %d prompts re-queued", i, self.step, len(requeued))

    def _collect(self) -> tuple[list[Group], dict[str, float]]:
        """Resolve prompts until the step has B informative groups (active sampling) or B resolved prompts."""
        r, B = self.cfg.rollout, self.cfg.rollout.prompts_per_step
        m: dict[str, float] = defaultdict(float)
        kept: list[Group] = []
        resolved = 0
        pulls = 0
        max_pulls = int(r.max_pull_factor * B)
        deadline = time.time() + r.timeout_s
        t0 = time.perf_counter()
        all_groups: list[Group] = []
        while (len(kept) < B) if r.active_sampling else (resolved < B):
            try:
                n = self.feeder.top_up(min(self.budget, max(0, max_pulls - pulls)),
                                       held=len(self.pending) + len(kept))
                self.budget -= n
                pulls += n
            except EngineFailure as e:
                self._replace_engine(e)
                continue
            if not self.pending and not self.feeder.busy:
                if self.feeder.exhausted or pulls >= max_pulls or self.budget <= 0:
                    break
            groups, self.pending = self.pending, []
            if not groups:
                t_wait = time.perf_counter()
                try:
                    groups = self.feeder.wait_groups(1, deadline, on_idle=self._health)
                except EngineFailure as e:
                    self._replace_engine(e)
                    continue
                m["time/wait_generation"] += time.perf_counter() - t_wait
                m["time/reward"] += self._score(groups)
            groups.sort(key=lambda g: min(s.version_start for s in g.samples))  # oldest first: fewer stale drops
            for g in groups:
                if is_stale(g, self.step, r.async_steps):
                    logger.debug("dropping stale group %s: version_start %s at learner version %d", g.prompt_id,
                                 sorted({smp.version_start for smp in g.samples}), self.step)
                    self._finish(g.prompt_id, "dropped_stale")
                    self.budget += 1  # regenerate it with fresh weights
                    m["rollout/dropped_stale"] += 1
                    continue
                step_full = len(kept) >= B if r.active_sampling else resolved >= B
                if step_full:
                    self.pending.append(g)  # early arrivals for the next step
                    continue
                for k, v in shape_group(g, self.shaping).items():
                    m[k] += v
                resolved += 1
                all_groups.append(g)
                if r.filter_zero_variance:
                    keep, fm = filter_groups([g])
                    for k, v in fm.items():
                        m[k] += v
                    if keep:
                        kept.append(g)
                    else:
                        self._finish(g.prompt_id, "filtered")
                        if r.active_sampling:
                            self.budget += 1  # top the step up with another prompt
                else:
                    kept.append(g)
        kept_ids = {id(g) for g in kept}
        self._last_resolved = [g for g in all_groups if id(g) not in kept_ids]
        m["time/generation"] = time.perf_counter() - t0 - m.get("time/reward", 0.0)
        m["data/real_batch_size_ratio"] = len(kept) / max(resolved, 1)
        m.update(rollout_metrics(all_groups, self.step))
        return kept, dict(m)

    def _pack(self, groups: list[Group]) -> tuple[list[list[PackedBatch]], dict[str, float]]:
        """One PackedBatch per (rank, mini-batch); mini-batches split the groups evenly."""
        num_mb = min(self.cfg.algorithm.num_mini_batches, max(1, len(groups)))
        per_rank: list[list[PackedBatch]] = [[] for _ in self.actors.learners]
        metrics: dict[str, float] = {}
        sid = 0
        for j in range(num_mb):
            inputs = []
            for g in groups[j::num_mb]:
                for s, adv, in_loss in zip(g.samples, g.advantages, g.loss_masks or [True] * g.num_samples):
                    inputs.append(PackInput(sid, s.prompt_token_ids, s.completion_token_ids, s.logprobs, adv, in_loss))
                    sid += 1
            batches = build_packed_batches(inputs, pack_length=self.cfg.learner.pack_length,
                                           num_ranks=len(self.actors.learners),
                                           micro_batch_rows=self.cfg.learner.micro_batch_rows,
                                           pad_token_id=self.pad_token_id)
            for rank, pb in enumerate(batches):
                per_rank[rank].append(pb)
            metrics = batches[0].metrics
        return per_rank, metrics

    def _train_and_sync(self, per_rank: list[list[PackedBatch]]) -> dict[str, float]:
        t0 = time.perf_counter()
        if self.weights.colocated and self.cfg.rollout.colocate_sleep:  # give the learner the GPU memory
            self.finish_eval()  # asleep, the engines could not finish an overlapped eval
            self.weights.sleep_engines()
        if faults.due("kill_learner", self.step + 1):
            ray.kill(self.actors.learners[0])
        outs = learner_get([lrn.train_batch.remote(b) for lrn, b in zip(self.actors.learners, per_rank)],
                           "train_batch", self.timeout)
        t1 = time.perf_counter()
        self.step += 1
        self.budget += self.cfg.rollout.prompts_per_step  # the next step's worth may now be generated
        self.finish_eval()  # an overlapped eval must see the previous weights only
        if faults.due("kill_engine_sync", self.step):
            ray.kill(self.actors.engines[0])
        try:
            sync = self.weights.sync(self.step)
        except EngineFailure as e:  # the group is broken for everyone: rebuilt with the replacement
            self._replace_engine(e)
            sync = {}
        out = dict(outs[0])
        out.update(sync)
        out["time/train"] = t1 - t0
        out["time/sync"] = time.perf_counter() - t1
        return out

    def _finish(self, prompt_id: str, state: str) -> None:
        self.ledger.finish(prompt_id, state)
        self.feeder.forget(prompt_id)

    # ------------------------------------------------------------------ eval, logging, checkpoints
    def start_eval(self, overlapped: bool = True) -> None:
        """Submit the eval prompts without waiting: they generate beside the next step's rollouts, still with this
        step's weights, because the next weight sync first waits for them (`finish_eval`)."""
        if not self.eval_requests:
            return
        self.feeder.eval_samples = []
        logger.info("eval of step %d started (%d prompts)", self.step, len(self.eval_requests))
        self.eval_inflight = {"step": self.step, "t0": time.perf_counter(), "overlapped": overlapped,
                              "expected": {(r.prompt_id, j) for r in self.eval_requests for j in range(r.num_samples)}}
        n = len(self.actors.engines)
        try:
            for i, (e, part) in enumerate(zip(self.actors.engines, [self.eval_requests[i::n] for i in range(n)])):
                if part:
                    engine_get(e.submit.remote(part), i, self.timeout)
        except EngineFailure as e:
            self._replace_engine(e)  # drops this eval; the run goes on
        if faults.due("kill_engine_eval", self.step):
            ray.kill(self.actors.engines[0])

    def finish_eval(self) -> dict[str, float]:
        """Wait for the eval in flight, score it, write eval.jsonl (at the step whose weights it used)."""
        ev = self.eval_inflight
        if ev is None:
            return {}
        deadline = time.time() + self.cfg.rollout.timeout_s
        # One sample per (prompt, sample index) of this eval. An eval dropped when its engine failed leaves
        # samples behind on the living engines: those of an earlier step differ in version_start and are
        # ignored; those of the same step (the blocking eval's retry) are equivalent, and counted once.
        ours: dict[tuple[str, int], Sample] = {}
        seen = 0
        while True:
            for smp in self.feeder.eval_samples[seen:]:
                key = (smp.prompt_id, smp.sample_index)
                if smp.version_start == ev["step"] and key in ev["expected"]:
                    ours.setdefault(key, smp)
            seen = len(self.feeder.eval_samples)
            if len(ours) == len(ev["expected"]):
                break
            try:
                groups = self.feeder.poll()  # training groups arriving meanwhile are kept for the next step
            except EngineFailure as e:
                self._replace_engine(e)  # drops this eval; the run goes on
                return {}
            if groups:
                self._score(groups)
                self.pending.extend(groups)
            if time.time() > deadline:
                raise TimeoutError(f"eval of step {ev['step']} incomplete after --rollout.timeout-s")
            time.sleep(0.005)
        self.eval_inflight = None
        groups: dict[str, Group] = {}
        for smp in ours.values():
            groups.setdefault(smp.prompt_id, Group(prompt_id=smp.prompt_id, samples=[])).samples.append(smp)
        glist = sorted(groups.values(), key=lambda g: g.prompt_id)
        for g in glist:
            g.samples.sort(key=lambda smp: smp.sample_index)
        self._score(glist)
        metrics = eval_metrics(glist)  # basic keys (eval/reward_mean, eval/pass@1) kept stable for tools
        from rlvr.eval.cli import default_ks
        from rlvr.eval.runner import summarize_groups

        metrics.update(summarize_groups(glist, ks=default_ks(self.cfg.eval.num_samples))[0])  # same code as `rlvr eval`
        metrics["time/eval"] = time.perf_counter() - ev["t0"]
        self.evaluated_step = ev["step"]
        # a blocking eval's metrics go to wandb with its step's
        self.log.eval(ev["step"], metrics, sample_records(glist, ev["step"], self.cfg.logging.num_logged_samples),
                      to_wandb=ev["overlapped"])
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Blocking eval with the current weights (run again on the replacement if an engine fails during it)."""
        for _attempt in range(2):
            self.start_eval(overlapped=False)
            metrics = self.finish_eval()
            if metrics or not self.eval_requests:
                return metrics
        return {}

    def save_checkpoint(self) -> Path:
        tmp = self.run_dir.tmp_checkpoint(self.step)
        state = tmp / "trainer_state"
        learner_get([lrn.save.remote(str(state), str(tmp), self.model_dir) for lrn in self.actors.learners], "save",
                    self.timeout)
        if faults.due("slow_checkpoint", self.step):
            time.sleep(5.0)  # fault injection: a signal or kill lands in the middle of the write
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
        state = ckpt / "trainer_state"
        try:
            ray.get([lrn.load.remote(str(state), str(ckpt)) for lrn in self.actors.learners], timeout=self.timeout)
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, ValueError):  # the learner refused the checkpoint's contents
                raise CheckpointError(f"checkpoint {ckpt}: {e.cause}") from None
            if isinstance(e.cause, RuntimeError) and "size mismatch" in str(e.cause):
                # torch's load_state_dict on tensors of other shapes (e.g. another vocabulary): check_compatible
                # refuses the known cases before start-up; this catches the rest without a traceback
                raise CheckpointError(f"checkpoint {ckpt}: its weights do not fit the configured model "
                                      f"({str(e.cause).strip()[:2000]}). Resume with the model settings it was "
                                      f"trained with, or {FRESH_START_HINT}.") from None
            raise
        self.step = self.saved_step = d["step"]
        self.ledger.load_state_dict(d["ledger"])
        self.feeder.load_state_dict(d["feeder"])
        self.pending = []  # groups collected ahead of the checkpoint are regenerated (their ids are in flight)
        self.log.truncate_after(self.step)
        self.weights.sync(self.step)
        logger.info("resumed from %s at step %d", ckpt, self.step, extra=CONSOLE)

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, float]:
        """Train until `num_steps` (or the data runs out); returns the last step's metrics."""
        last: dict[str, float] = {}
        if self.cfg.eval.at_step_0 and self.step == 0:
            last.update(self.evaluate())
            self.log.baseline(last)
        while self.step < self.cfg.num_steps:
            if self.signals is not None and self.signals.requested:
                return self._stop(last)
            if faults.due("kill_engine", self.step + 1):
                ray.kill(self.actors.engines[0])
            try:
                m = self.train_step()
            except StopRequested:
                return self._stop(last)
            if m is None:
                return self._end_of_data(last)
            last = m
            if m.get("learner/consecutive_skips", 0) >= self.cfg.learner.max_consecutive_skips:
                raise RuntimeError(f"{int(m['learner/consecutive_skips'])} optimizer steps in a row were skipped "
                                   "for a non-finite loss or gradient (--learner.max-consecutive-skips "
                                   f"{self.cfg.learner.max_consecutive_skips}): lower --learner.lr, check the "
                                   "rewards and the data")
        return last

    def _end_of_data(self, last: dict[str, float]) -> dict[str, float]:
        """The data ran out before num_steps: end as at num_steps, losing nothing trained: the eval in flight is
        written, the last weights get their eval if none measured them, and the final checkpoint is saved."""
        last.update(self.finish_eval())
        if self.step > 0 and self.eval_requests and self.cfg.eval.every_n_steps and self.evaluated_step != self.step:
            last.update(self.evaluate())
        if self.step > 0 and self.cfg.checkpoint.save_final and self.saved_step != self.step:
            self.save_checkpoint()
        return last

    def _stop(self, last: dict[str, float]) -> dict[str, float]:
        """A stop signal: checkpoint (prompts in flight are re-queued on resume) and report preemption."""
        if self.step == 0:  # nothing trained: a fresh start later loses nothing
            logger.warning("stop requested (%s) before the first step: no checkpoint needed", self.signals.requested)
        elif self.saved_step == self.step:
            logger.warning("stop requested (%s) at step %d: its checkpoint is already written", self.signals.requested,
                           self.step)
        else:
            logger.warning("stop requested (%s) at step %d: writing a checkpoint", self.signals.requested, self.step)
            self.save_checkpoint()
        self.stopped = True
        return last

    def train_step(self) -> dict[str, float] | None:
        """One step: collect -> advantages -> pack -> train -> sync -> log -> eval -> checkpoint (None: no data)."""
        cfg = self.cfg
        t_step = time.perf_counter()
        for _round in range(20):
            groups, m = self._collect()
            if groups:
                break
            if self.feeder.exhausted and not self.feeder.busy and not self.pending:
                logger.warning("training data exhausted at step %d (%s)", self.step, source_drops(self.feeder.stream))
                return None
            logger.warning("step %d: no informative group among the resolved prompts; collecting again", self.step + 1)
            self.budget += self.cfg.rollout.prompts_per_step  # another round of this step's worth
        else:
            # e.g. a solved task (every group all-correct): train on the zero-variance groups, whose advantages
            # are 0, so that the step and policy version still advance instead of stalling the run
            logger.warning("20 collection rounds without an informative group (all-correct %d, all-wrong %d): "
                           "training on zero-advantage groups", m.get("data/groups_all_correct", 0),
                           m.get("data/groups_all_wrong", 0))
            groups = self._last_resolved
            for g in groups:
                self.ledger.reopen(g.prompt_id)
        groups.sort(key=lambda g: self.feeder.order(g.prompt_id))  # deterministic batch order
        m.update(assign_group_advantages(groups, self.adv_cfg))
        per_rank, pack_m = self._pack(groups)
        m.update(pack_m)
        m.update(self._train_and_sync(per_rank))
        for g in groups:
            self._finish(g.prompt_id, "trained")
        self.ledger.count_source_drops(**source_drops(self.feeder.stream))
        self.ledger.check()
        m.update(self.ledger.metrics())
        for v in ray.get([v.metrics.remote() for v in self.actors.verifiers], timeout=self.timeout):
            for k, val in v.items():
                m[k] = m.get(k, 0.0) + val
        wall = time.perf_counter() - t_step
        num_tokens = sum(s.num_tokens for g in groups for s in g.samples)
        num_workers = len(self.actors.learners) + len(self.actors.engines)
        m.update({"time/step": wall, "perf/tokens_per_s": num_tokens / wall,
                  "perf/tokens_per_s_per_worker": num_tokens / wall / num_workers})
        if self.step == cfg.num_steps:
            m.update(self.evaluate())
        elif cfg.eval.every_n_steps and self.step % cfg.eval.every_n_steps == 0:
            if cfg.eval.overlap:
                self.start_eval()  # logged to eval.jsonl when done, before the next weight sync
            else:
                m.update(self.evaluate())
        m["health/engine_restarts"] = float(self.engine_restarts)  # after the eval, which may replace one
        self.log.step(self.step, m, sample_records(groups, self.step, cfg.logging.num_logged_samples))
        every = cfg.checkpoint.every_n_steps
        if (every and self.step % every == 0) or (self.step == cfg.num_steps and cfg.checkpoint.save_final):
            self.save_checkpoint()
        return m

    def close(self) -> None:
        self.log.close()

