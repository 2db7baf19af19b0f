"""`rlvr train`: prepare inputs (before any actor or GPU is claimed), start Ray and the actors, run, shut down.

Order matters for failing fast: config -> run dir (writable, disk space) -> model/tokenizer -> every dataset
row checked -> reward names -> only then Ray, placement and actors. A learner failure restarts the run from
its last complete checkpoint (up to `cluster.max_restarts`); SIGINT/SIGTERM checkpoint and exit with
`EXIT_PREEMPTED`; every actor is shut down by handle on the way out.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.config import ExperimentConfig, check_resources, to_yaml
from rlvr.orchestration.checkpoint import RunDir
from rlvr.orchestration.health import EXIT_PREEMPTED, PREEMPTED_MESSAGE, LearnerFailure, StopSignals, describe
from rlvr.telemetry.logs import get_logger, setup_logging

logger = get_logger(__name__)


@dataclass
class Actors:
    learners: list = field(default_factory=list)
    engines: list = field(default_factory=list)
    verifiers: list = field(default_factory=list)
    factory: Any = None

    def all(self) -> list:
        return self.learners + self.engines + self.verifiers


def prepare_model(cfg: ExperimentConfig, run_dir: RunDir) -> str:
    """The HF directory every actor loads: the user's path, or the built-in tiny model written once."""
    if cfg.model.path.startswith("builtin:") and cfg.model.path != "builtin:tiny":
        from rlvr.data import builtin_corpus
        from rlvr.data.shaped_models import build_shaped_model_dir

        tasks = [d.split(":", 1)[1] for d in cfg.data.datasets if d.startswith("builtin:")] or ["copy"]
        corpus = [line for t in dict.fromkeys(tasks) for line in builtin_corpus(t)]
        shape = cfg.model.path.split(":", 1)[1]
        return str(build_shaped_model_dir(shape, corpus, run_dir.path(f"builtin_{shape}"), cfg.seed))
    if cfg.model.path != "builtin:tiny":
        path = Path(cfg.model.path)
        if path.exists() and not (path / "config.json").is_file():
            raise ValueError(f"--model.path {cfg.model.path}: no config.json there (not an HF model directory)")
        if path.exists() and not os.access(path / "config.json", os.R_OK):
            raise ValueError(f"--model.path {cfg.model.path}: config.json is not readable")
        return cfg.model.path
    from rlvr.data import build_tiny_model_dir, builtin_corpus

    tasks = [d.split(":", 1)[1] for d in cfg.data.datasets + cfg.eval.datasets if d.startswith("builtin:")]
    if not tasks:
        raise ValueError("--model.path builtin:tiny trains its tokenizer on a built-in task's text: add a "
                         "`builtin:<task>` dataset or give a real model path")
    corpus = [line for t in dict.fromkeys(tasks) for line in builtin_corpus(t)]
    return str(build_tiny_model_dir(cfg.model, corpus, run_dir.path("builtin_model"), cfg.seed))


def _known_verifiers(cfg: ExperimentConfig) -> set[str]:
    from rlvr.rewards.registry import import_custom, known_rewards

    for path in cfg.rewards.custom:
        import_custom(path)
    return set(known_rewards())


def _check_output_dir(cfg: ExperimentConfig, run_dir: RunDir) -> None:
    probe = run_dir.root / ".write_probe"
    try:
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"--checkpoint.output-dir {cfg.checkpoint.output_dir}: not writable ({e})") from e
    free_gb = shutil.disk_usage(run_dir.root).free / 1e9
    if free_gb < cfg.checkpoint.min_free_gb:
        raise ValueError(f"--checkpoint.output-dir {cfg.checkpoint.output_dir}: only {free_gb:.2f} GB free, "
                         f"--checkpoint.min-free-gb is {cfg.checkpoint.min_free_gb:g}")


def _start_ray(cfg: ExperimentConfig) -> bool:
    import ray

    address = cfg.cluster.address or os.environ.get("RAY_ADDRESS")
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, log_to_driver=True)
        return False
    need = (cfg.cluster.num_learners + cfg.cluster.num_engines) * cfg.cluster.cpus_per_actor
    ray.init(num_cpus=max(os.cpu_count() or 1, int(need) + 1), include_dashboard=False, log_to_driver=True)
    return True


def _device(cfg: ExperimentConfig) -> str:
    import ray

    if cfg.cluster.device != "auto":
        return cfg.cluster.device
    return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"


class ActorFactory:
    """Creates (and re-creates) the actors of a run with their placement options."""

    def __init__(self, cfg: ExperimentConfig, model_dir: str, device: str) -> None:
        from rlvr import faults

        self.cfg, self.model_dir, self.device = cfg, model_dir, device
        self.sync_info: dict | None = None
        self.placement_groups: dict[int, Any] = {}
        c, gpu = cfg.cluster, device.startswith("cuda")
        env = faults.env_vars()
        base: dict[str, Any] = {"runtime_env": {"env_vars": env}} if env else {}
        self.learner_opts = {**base, "num_cpus": c.cpus_per_actor, "num_gpus": 1 if gpu else 0}
        self.engine_opts = {**base, "num_cpus": c.cpus_per_actor, "num_gpus": c.engine_tp if gpu else 0}
        if gpu and c.colocate:
            self.learner_opts["num_gpus"], self.engine_opts["num_gpus"] = 0.5, 0.5
        self.colocate_pg: Any = None

    def colocated_options(self, opts: dict[str, Any], index: int) -> dict[str, Any]:
        """Colocated on GPUs: learner i and engine i share bundle i ({GPU: 1}) of one placement group, so each
        GPU hosts one learner rank and one engine. Without it Ray may pack two 0.5-GPU learners onto one GPU,
        and NCCL refuses two ranks on one device."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        c = self.cfg.cluster
        if not (self.device.startswith("cuda") and c.colocate):
            return opts
        if self.colocate_pg is None:
            bundles = [{"GPU": 1, "CPU": 2 * c.cpus_per_actor} for _ in range(max(c.num_learners, c.num_engines))]
            self.colocate_pg = ray.util.placement_group(bundles, strategy="PACK", name="rlvr-colocated")
            ray.get(self.colocate_pg.ready(), timeout=c.actor_timeout_s)
        return {**opts, "scheduling_strategy": PlacementGroupSchedulingStrategy(
            self.colocate_pg, placement_group_bundle_index=index)}

    def learners(self) -> list:
        import ray

        from rlvr.orchestration.actors import LearnerActor

        c, timeout = self.cfg.cluster, self.cfg.cluster.actor_timeout_s
        learners = [LearnerActor.options(**self.colocated_options(self.learner_opts, r)).remote()
                    for r in range(c.num_learners)]
        addr, port = ray.get(learners[0].address.remote(), timeout=timeout)  # rank 0 hosts the rendezvous
        ray.get([a.setup.remote(self.cfg, self.model_dir, r, c.num_learners, addr, port, self.device)
                 for r, a in enumerate(learners)], timeout=timeout)
        return learners

    def engine(self, index: int, version: int = 0) -> Any:
        """Engine `index`; a tensor-parallel engine gets its own STRICT_PACK placement group (one node, engine_tp
        GPUs) and vLLM's multiprocessing executor starts its TP workers on those GPUs."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from rlvr.orchestration.actors import EngineActor

        opts = dict(self.engine_opts)
        tp = self.cfg.cluster.engine_tp
        if self.device.startswith("cuda") and tp > 1 and not self.cfg.cluster.colocate:
            old = self.placement_groups.pop(index, None)
            if old is not None:
                ray.util.remove_placement_group(old)
            pg = ray.util.placement_group([{"GPU": tp, "CPU": max(1.0, self.cfg.cluster.cpus_per_actor)}],
                                          strategy="STRICT_PACK", name=f"rlvr-engine-{index}")
            ray.get(pg.ready(), timeout=self.cfg.cluster.actor_timeout_s)
            self.placement_groups[index] = pg
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
        opts = self.colocated_options(opts, index)
        return EngineActor.options(**opts).remote(self.cfg, self.model_dir, index, self.device, version)

    def release(self) -> None:
        import ray

        for pg in self.placement_groups.values():
            ray.util.remove_placement_group(pg)
        self.placement_groups.clear()
        if self.colocate_pg is not None:
            ray.util.remove_placement_group(self.colocate_pg)
            self.colocate_pg = None

    def verifiers(self) -> list:
        from rlvr.orchestration.actors import VerifierActor

        return [VerifierActor.options(num_cpus=0).remote(self.cfg) for _ in range(self.cfg.cluster.num_verifier_actors)]

    @property
    def transport(self) -> str:
        """gloo on CPU; CUDA IPC when learners and engines share GPUs; else NCCL through vLLM's API."""
        if not self.device.startswith("cuda") or self.cfg.rollout.backend != "vllm":
            return "gloo"
        return "ipc" if self.cfg.cluster.colocate else "nccl"

    def connect_weight_sync(self, actors: Actors) -> None:
        """(Re)build the learner rank 0 -> engines group (after any engine was replaced).

        Every learner rank takes part in the metadata pass (ZeRO-3 gathers are collective); engine i's
        ranks start at 1 + i * engine_tp (one per tensor-parallel worker)."""
        import ray

        timeout, t = self.cfg.cluster.actor_timeout_s, self.transport
        tp = self.cfg.cluster.engine_tp if t == "nccl" else 1
        waddr, wport = ray.get(actors.learners[0].address.remote(), timeout=timeout)
        world = 1 + len(actors.engines) * tp
        refs = [lrn.init_weight_sync.remote(waddr, wport, world, timeout, t) for lrn in actors.learners]
        refs += [e.init_weight_sync.remote(waddr, wport, 1 + i * tp, world, timeout, t)
                 for i, e in enumerate(actors.engines)]
        self.sync_info = ray.get(refs, timeout=timeout)[0]


def create_actors(cfg: ExperimentConfig, model_dir: str, device: str) -> Actors:
    import ray

    res = ray.cluster_resources()
    check_resources(cfg, res.get("GPU", 0), res.get("CPU", 0))
    factory = ActorFactory(cfg, model_dir, device)
    actors = Actors(factory=factory)
    actors.learners = factory.learners()
    actors.engines = [factory.engine(i) for i in range(cfg.cluster.num_engines)]
    actors.verifiers = factory.verifiers()
    ray.get([a.ping.remote() for a in actors.all()], timeout=cfg.cluster.actor_timeout_s)
    factory.connect_weight_sync(actors)
    return actors


def shutdown_actors(actors: Actors) -> None:
    import ray

    refs = [a.shutdown.remote() for a in actors.all()]
    try:
        ray.get(refs, timeout=30)
    except Exception as e:  # shutting down: report and kill regardless (an actor may already be dead)
        logger.warning("actor shutdown: %s", describe(e))
    for a in actors.all():
        ray.kill(a)
    if actors.factory is not None:
        actors.factory.release()


def run_dir_for(cfg: ExperimentConfig) -> RunDir:
    name = cfg.logging.run_name or time.strftime("rlvr-%Y%m%d-%H%M%S")
    return RunDir(Path(cfg.checkpoint.output_dir) / name)


@dataclass
class Prepared:
    """Everything checked and built before Ray starts."""

    run_dir: RunDir
    model_dir: str
    tokenizer: Any
    stream: Any
    eval_requests: list

    @property
    def pad_token_id(self) -> int:
        t = self.tokenizer
        return t.pad_token_id if t.pad_token_id is not None else t.eos_token_id


def prepare(cfg: ExperimentConfig) -> Prepared:
    """Run dir (writable, disk space), config.yaml, model directory, tokenizer, every dataset row, eval prompts."""
    run_dir = run_dir_for(cfg)
    _check_output_dir(cfg, run_dir)
    setup_logging("driver", None, cfg.logging.level, str(run_dir.path("events.log")))
    run_dir.path("config.yaml").write_text(to_yaml(cfg))
    logger.info("run directory %s", run_dir.root)
    model_dir = prepare_model(cfg, run_dir)
    from transformers import AutoTokenizer

    from rlvr.data import PromptStream, eval_requests

    tok_path = cfg.model.tokenizer_path or model_dir
    try:
        tokenizer = AutoTokenizer.from_pretrained(tok_path)
    except (OSError, ValueError) as e:
        raise ValueError(f"tokenizer at {tok_path} could not be loaded: {e}") from e
    if cfg.data.apply_chat_template and not (tokenizer.chat_template or cfg.model.chat_template):
        raise ValueError(f"tokenizer at {tok_path} has no chat template: set --model.chat-template or "
                         "--data.apply-chat-template False")
    known = _known_verifiers(cfg)
    from rlvr.rewards.scorer import RewardScorer

    RewardScorer(cfg.rewards)  # unknown reward names and bad params fail here, before any actor starts
    stream = PromptStream(cfg, tokenizer, known)  # every row checked here, before Ray starts
    evals = eval_requests(cfg, tokenizer, known) if (cfg.eval.every_n_steps or cfg.eval.at_step_0) else []
    return Prepared(run_dir, model_dir, tokenizer, stream, evals)


def build_trainer(cfg: ExperimentConfig, prep: Prepared, actors: Actors, resume: str | None = None) -> Any:
    """A Trainer over created actors, restored from the checkpoint `resume` (default: config) selects."""
    from rlvr.orchestration.driver import Trainer
    from rlvr.telemetry.metrics import truncate_after_step

    ckpt = prep.run_dir.find_resume(resume or cfg.checkpoint.resume)
    if ckpt is None:  # a fresh start: records of an earlier attempt of this run name are void
        for name in ("metrics.jsonl", "eval.jsonl", "samples.jsonl"):
            truncate_after_step(prep.run_dir.path(name), -1)
    trainer = Trainer(cfg, prep.run_dir, actors, prep.stream, prep.eval_requests, prep.model_dir,
                      prep.pad_token_id, wandb=_wandb(cfg, prep.run_dir))
    if ckpt is not None:
        trainer.restore(ckpt)
    return trainer


def train(cfg: ExperimentConfig) -> int:
    """Run training; returns the exit status (0 ok, EXIT_PREEMPTED after a signal, 130 on KeyboardInterrupt)."""
    prep = prepare(cfg)
    import ray

    started = _start_ray(cfg)
    device = _device(cfg)
    restarts, resume = 0, cfg.checkpoint.resume
    try:
        with StopSignals() as signals:
            while True:
                actors, trainer = Actors(), None
                try:
                    actors = create_actors(cfg, prep.model_dir, device)
                    trainer = build_trainer(cfg, prep, actors, resume)
                    trainer.signals = signals
                    final = trainer.run()
                    if trainer.stopped:
                        logger.warning("%s (step %d)", PREEMPTED_MESSAGE, trainer.step)
                        return EXIT_PREEMPTED
                    logger.info("done at step %d: %s", trainer.step, {k: round(v, 4) for k, v in final.items()
                                                                      if k.startswith(("eval/reward", "reward/total"))})
                    return 0
                except LearnerFailure as e:
                    if restarts >= cfg.cluster.max_restarts:
                        raise RuntimeError(f"{e}; --cluster.max-restarts {cfg.cluster.max_restarts} used up") from e
                    restarts += 1
                    logger.error("%s: restarting the run from its last complete checkpoint (%d of %d)",
                                 e, restarts, cfg.cluster.max_restarts)
                    resume = "auto"
                finally:
                    if trainer is not None:
                        trainer.close()
                    shutdown_actors(actors)
                prep = prepare(cfg)  # a fresh prompt stream; the checkpoint restores its position
    except KeyboardInterrupt:
        logger.warning("interrupted: shut down")
        return 130
    finally:
        if started:
            ray.shutdown()


def _wandb(cfg: ExperimentConfig, run_dir: RunDir) -> Any:
    if cfg.logging.wandb_mode == "off":
        return None
    from rlvr.telemetry.wandb_logger import WandbLogger

    return WandbLogger.from_config(cfg, run_dir.root)
