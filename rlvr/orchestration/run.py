"""`rlvr train`: prepare inputs (before any actor or GPU is claimed), start Ray and the actors, run, shut down.

Order matters for failing fast: config -> run dir -> model/tokenizer -> every dataset row checked -> only
then Ray, placement and actors. Ctrl-C stops the loop, shuts every actor down by handle and exits 130.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.config import ExperimentConfig, check_resources, to_yaml
from rlvr.orchestration.checkpoint import RunDir
from rlvr.telemetry.logs import get_logger, setup_logging

logger = get_logger(__name__)


@dataclass
class Actors:
    learners: list = field(default_factory=list)
    engines: list = field(default_factory=list)
    verifiers: list = field(default_factory=list)

    def all(self) -> list:
        return self.learners + self.engines + self.verifiers


def prepare_model(cfg: ExperimentConfig, run_dir: RunDir) -> str:
    """The HF directory every actor loads: the user's path, or the built-in tiny model written once."""
    if cfg.model.path != "builtin:tiny":
        path = Path(cfg.model.path)
        if path.exists() and not (path / "config.json").is_file():
            raise ValueError(f"--model.path {cfg.model.path}: no config.json there (not an HF model directory)")
        return cfg.model.path
    from rlvr.data import builtin_corpus, build_tiny_model_dir

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


def create_actors(cfg: ExperimentConfig, model_dir: str, device: str) -> Actors:
    import ray

    from rlvr.orchestration.actors import EngineActor, LearnerActor, VerifierActor

    c, timeout = cfg.cluster, cfg.cluster.actor_timeout_s
    res = ray.cluster_resources()
    check_resources(cfg, res.get("GPU", 0), res.get("CPU", 0))
    gpu = device.startswith("cuda")
    lopts: dict[str, Any] = {"num_cpus": c.cpus_per_actor, "num_gpus": 1 if gpu else 0}
    eopts: dict[str, Any] = {"num_cpus": c.cpus_per_actor, "num_gpus": c.engine_tp if gpu else 0}
    if gpu and c.colocate:
        lopts["num_gpus"], eopts["num_gpus"] = 0.5, 0.5
    actors = Actors()
    # rank 0's node hosts the data-parallel rendezvous
    actors.learners = [LearnerActor.options(**lopts).remote() for _ in range(c.num_learners)]
    addr, port = ray.get(actors.learners[0].address.remote(), timeout=timeout)
    ray.get([a.setup.remote(cfg, model_dir, r, c.num_learners, addr, port, device)
             for r, a in enumerate(actors.learners)], timeout=timeout)
    actors.engines = [EngineActor.options(**eopts).remote(cfg, model_dir, i, device) for i in range(c.num_engines)]
    actors.verifiers = [VerifierActor.options(num_cpus=0).remote(cfg) for _ in range(c.num_verifier_actors)]
    ray.get([a.ping.remote() for a in actors.all()], timeout=timeout)
    waddr, wport = ray.get(actors.learners[0].address.remote(), timeout=timeout)
    world = 1 + c.num_engines
    refs = [actors.learners[0].init_weight_sync.remote(waddr, wport, world, timeout)]
    refs += [e.init_weight_sync.remote(waddr, wport, 1 + i, world, timeout) for i, e in enumerate(actors.engines)]
    ray.get(refs, timeout=timeout)
    return actors


def shutdown_actors(actors: Actors) -> None:
    import ray

    refs = [a.shutdown.remote() for a in actors.all()]
    try:
        ray.get(refs, timeout=30)
    except Exception as e:  # shutting down: report and kill regardless
        logger.warning("actor shutdown: %s", e)
    for a in actors.all():
        ray.kill(a)


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
    """Run dir, config.yaml, model directory, tokenizer, every dataset row checked, eval prompts."""
    run_dir = run_dir_for(cfg)
    setup_logging("driver", None, cfg.logging.level, str(run_dir.path("events.log")))
    run_dir.path("config.yaml").write_text(to_yaml(cfg))
    logger.info("run directory %s", run_dir.root)
    model_dir = prepare_model(cfg, run_dir)
    from transformers import AutoTokenizer

    from rlvr.data import PromptStream, eval_requests

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or model_dir)
    known = _known_verifiers(cfg)
    from rlvr.rewards.scorer import RewardScorer

    RewardScorer(cfg.rewards)  # unknown reward names and bad params fail here, before any actor starts
    stream = PromptStream(cfg, tokenizer, known)  # every row checked here, before Ray starts
    evals = eval_requests(cfg, tokenizer, known) if (cfg.eval.every_n_steps or cfg.eval.at_step_0) else []
    return Prepared(run_dir, model_dir, tokenizer, stream, evals)


def build_trainer(cfg: ExperimentConfig, prep: Prepared, actors: Actors) -> Any:
    """A Trainer over created actors, restored from the checkpoint `checkpoint.resume` selects."""
    from rlvr.orchestration.driver import Trainer

    trainer = Trainer(cfg, prep.run_dir, actors, prep.stream, prep.eval_requests, prep.model_dir,
                      prep.pad_token_id, wandb=_wandb(cfg, prep.run_dir))
    ckpt = prep.run_dir.find_resume(cfg.checkpoint.resume)
    if ckpt is not None:
        trainer.restore(ckpt)
    return trainer


def train(cfg: ExperimentConfig) -> int:
    """Run training; returns the exit status (0 ok, 130 interrupted)."""
    prep = prepare(cfg)
    import ray

    started = _start_ray(cfg)
    actors = Actors()
    trainer = None
    try:
        actors = create_actors(cfg, prep.model_dir, _device(cfg))
        trainer = build_trainer(cfg, prep, actors)
        final = trainer.run()
        logger.info("done at step %d: %s", trainer.step,
                    {k: round(v, 4) for k, v in final.items() if k.startswith(("eval/reward", "reward/total"))})
        return 0
    except KeyboardInterrupt:
        logger.warning("interrupted: shutting down")
        return 130
    finally:
        if trainer is not None:
            trainer.close()
        shutdown_actors(actors)
        if started:
            ray.shutdown()


def _wandb(cfg: ExperimentConfig, run_dir: RunDir) -> Any:
    if cfg.logging.wandb_mode == "off":
        return None
    from rlvr.telemetry.wandb_logger import WandbLogger

    return WandbLogger.from_config(cfg, run_dir.root)
