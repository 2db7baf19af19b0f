"""`rlvr train`: prepare inputs (before any actor or GPU is claimed), start Ray and the actors, run, shut down.

Order matters for failing fast: config -> run dir (which one, checkpoint usable and safe, model compatible: all
read-only) -> run dir created (writable, disk space), config.yaml -> model/tokenizer -> every dataset row
checked -> reward names -> only then Ray, placement and actors. A start that fails before Ray removes the run
directory it created; an existing directory is only used when it is an rlvr run directory (has config.yaml).

Which run (`run_dirs`): `--logging.run-name` names it; without one, `--checkpoint.resume auto` continues the
newest unfinished run in the output directory with the same config, so the same command resumes after a
preemption; a finished run is never continued. A run directory is locked while a driver uses it.

Signals: SIGINT/SIGTERM only set a flag from the moment `train` starts (a signal during start-up exits with
`EXIT_PREEMPTED` once start-up is done, nothing lost); the Ray head rlvr starts runs in its own session so a
signal to the whole process group (Ctrl-C, Slurm) reaches the driver only, and the driver decides: checkpoint,
shut the actors down, exit `EXIT_PREEMPTED`. A learner failure restarts the run from its last complete
checkpoint (up to `cluster.max_restarts`); every actor is shut down by handle on the way out.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.config import ExperimentConfig, to_yaml
from rlvr.orchestration.actor_factory import Actors, create_actors, device_of, shutdown_actors
from rlvr.orchestration.checkpoint import RunDir
from rlvr.orchestration.health import (
    EXIT_PREEMPTED,
    PREEMPTED_MESSAGE,
    LearnerFailure,
    StopSignals,
    handlers_kept,
)
from rlvr.orchestration.run_dirs import (
    RunLock,
    check_compatible,
    check_no_symlinks,
    create_run_dir,
    read_run_state,
    remove_created,
    select_run_dir,
    tiny_model_corpus,
    write_run_state,
)
from rlvr.telemetry.logs import CONSOLE, EVENTS_LOG_ENV, get_logger, setup_logging
from rlvr.telemetry.summary import print_summary

logger = get_logger(__name__)


def prepare_model(cfg: ExperimentConfig, run_dir: RunDir) -> str:
    """The HF directory every actor loads: the user's path, a fetched pretrained model (`builtin:<name>`, see
    `rlvr models list`), or a built-in random-weight model written once."""
    from rlvr.models import is_pretrained, resolve_model_path

    if is_pretrained(cfg.model.path):
        return resolve_model_path(cfg.model.path)
    if cfg.model.path.startswith("builtin:") and cfg.model.path != "builtin:tiny":
        from rlvr.data import builtin_corpus
        from rlvr.models.shaped import build_shaped_model_dir

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
    from rlvr.models.tiny import build_tiny_model_dir

    corpus = tiny_model_corpus(cfg)  # the same text check_compatible derives the vocabulary size from
    if not corpus:
        from rlvr.data.sources import load_dataset_rows

        for spec in cfg.data.datasets:  # a local file with no usable row: its own error names the rows
            if not spec.startswith("builtin:") and Path(spec).exists():
                load_dataset_rows(spec, cfg, cfg.data.split)
        raise ValueError(
            "--model.path builtin:tiny trains its tokenizer on the datasets' text, and hub datasets "
            "are not read for it: give a local dataset file, a `builtin:<task>`, or a real model path"
        )
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
        raise ValueError(
            f"--checkpoint.output-dir {cfg.checkpoint.output_dir}: only {free_gb:.2f} GB free, "
            f"--checkpoint.min-free-gb is {cfg.checkpoint.min_free_gb:g}"
        )


def _start_ray(cfg: ExperimentConfig, signals: StopSignals | None = None) -> tuple[bool, Any]:
    """Connect to the configured cluster, or start a local head in its own session and connect to it. Returns
    (whether this call initialised Ray, the local head or None). With `signals`, its handlers stay in place
    through ray.init."""
    import ray

    if ray.is_initialized():
        return False, None
    address = cfg.cluster.address or os.environ.get("RAY_ADDRESS")
    head = None
    if not address:
        from rlvr.launch.local_cluster import LocalRayHead

        need = (cfg.cluster.num_learners + cfg.cluster.num_engines) * cfg.cluster.cpus_per_actor
        head = LocalRayHead(
            num_cpus=max(os.cpu_count() or 1, int(need) + 1), include_dashboard=False, own_session=True
        ).start()
        address = head.address
    try:
        with handlers_kept(signals):
            ray.init(
                address=address,
                log_to_driver=True,  # Ray's own INFO lines only at DEBUG
                logging_level="DEBUG" if cfg.logging.level == "DEBUG" else "WARNING",
            )
    except BaseException:
        if head is not None:
            head.stop()
        raise
    return True, head


@dataclass
class Prepared:
    """Everything checked and built before Ray starts."""

    run_dir: RunDir
    model_dir: str
    tokenizer: Any
    stream: Any
    eval_requests: list
    lock: RunLock | None = None
    created: bool = False
    """This start created the run directory (it is removed again if the start fails before any step)."""
    created_parents: list = field(default_factory=list)
    """Parent directories this start created, deepest first (removed after a failed start only when empty)."""

    @property
    def pad_token_id(self) -> int:
        t = self.tokenizer
        return t.pad_token_id if t.pad_token_id is not None else t.eos_token_id


def prepare(
    cfg: ExperimentConfig, run_dir: RunDir | None = None, resume: str | None = None, lock: RunLock | None = None
) -> Prepared:
    """Run dir (chosen, checkpoint usable, model compatible, writable, disk space), config.yaml, model directory,
    tokenizer, every dataset row, eval prompts. On failure nothing of an existing run is changed; only what this
    start created goes (its run directory; parents it made, while empty). A restart passes `run_dir`, `resume`
    and the run's held `lock`, kept throughout (no other driver can take the run) and the caller's to release."""
    new_name = run_dir is None and not cfg.logging.run_name  # a generated name: must be a new directory
    run_dir = run_dir or select_run_dir(cfg)
    new_name = new_name and not run_dir.root.exists()
    check_no_symlinks(run_dir)  # before anything is written there
    if run_dir.root.is_dir():  # an rlvr run: what resume finds is logged with the run's events
        setup_logging("driver", None, cfg.logging.level, str(run_dir.path("events.log")))
    ckpt = run_dir.find_resume(resume or cfg.checkpoint.resume)
    if ckpt is not None:
        check_compatible(cfg, ckpt)
    try:
        run_dir, created, parents = create_run_dir(run_dir, new_name)
    except OSError as e:
        raise ValueError(
            f"--checkpoint.output-dir {cfg.checkpoint.output_dir}: cannot create {run_dir.root} ({e.strerror or e})"
        ) from e
    held, lock = lock, None  # `lock`: taken here, released here on failure
    try:
        if held is None:
            lock = RunLock(run_dir.root)
            if not lock.acquire():
                lock, created = None, False  # another driver holds it: its directory now, whoever made it
                raise ValueError(f"run directory {run_dir.root} is in use by another rlvr process")
        _check_output_dir(cfg, run_dir)
        setup_logging("driver", None, cfg.logging.level, str(run_dir.path("events.log")))
        logger.info("run directory %s%s", run_dir.root, f", resuming from {ckpt.name}" if ckpt else "", extra=CONSOLE)
        model_dir = prepare_model(cfg, run_dir)
        from transformers import AutoTokenizer

        from rlvr.data import PromptStream, eval_requests

        tok_path = cfg.model.tokenizer_path or model_dir
        try:
            tokenizer = AutoTokenizer.from_pretrained(tok_path)
        except (OSError, ValueError) as e:
            raise ValueError(f"tokenizer at {tok_path} could not be loaded: {e}") from e
        if cfg.data.apply_chat_template and not (tokenizer.chat_template or cfg.model.chat_template):
            raise ValueError(
                f"tokenizer at {tok_path} has no chat template: set --model.chat-template or "
                "--data.apply-chat-template False"
            )
        known = _known_verifiers(cfg)
        from rlvr.rewards.scorer import RewardScorer

        RewardScorer(cfg.rewards)  # unknown reward names and bad params fail here, before any actor starts
        stream = PromptStream(cfg, tokenizer, known)  # every row checked here, before Ray starts
        evals = eval_requests(cfg, tokenizer, known) if (cfg.eval.every_n_steps or cfg.eval.at_step_0) else []
        from rlvr.orchestration.episodes import check_env_at_start

        check_env_at_start(cfg, model_dir, stream, evals)  # environments known, episode limits fit the model
        # only now, every check passed: a start that fails leaves an existing run's config and state as they were
        run_dir.path("config.yaml").write_text(to_yaml(cfg))
        write_run_state(run_dir, cfg, "running")
    except BaseException:
        # a failed start leaves no stub run directory behind; removed while still locked, so no other driver
        # can have entered it
        remove_created(run_dir.root if created else None, parents)
        if lock is not None:
            lock.release()
        raise
    return Prepared(run_dir, model_dir, tokenizer, stream, evals, held or lock, created, parents)


def build_trainer(cfg: ExperimentConfig, prep: Prepared, actors: Actors, resume: str | None = None) -> Any:
    """A Trainer over created actors, restored from the checkpoint `resume` (default: config) selects."""
    from rlvr.orchestration.driver import Trainer
    from rlvr.telemetry.metrics import truncate_after_step
    from rlvr.telemetry.run_log import RECORD_FILES

    ckpt = prep.run_dir.find_resume(resume or cfg.checkpoint.resume)
    if ckpt is None:  # a fresh start: records of an earlier attempt of this run name are void
        for name in RECORD_FILES:
            truncate_after_step(prep.run_dir.path(name), -1)
    trainer = Trainer(
        cfg,
        prep.run_dir,
        actors,
        prep.stream,
        prep.eval_requests,
        prep.model_dir,
        prep.pad_token_id,
        wandb=_wandb(cfg, prep.run_dir),
    )
    if ckpt is not None:
        trainer.restore(ckpt)
    elif cfg.learner.lora_rank > 0:  # engines serve the learner's own adapter from the first request on
        trainer.weights.sync(trainer.step)
    return trainer


def train(cfg: ExperimentConfig, signals: StopSignals | None = None) -> int:
    """Run training; returns the exit status (0 done, EXIT_PREEMPTED after a signal). `signals`: handlers the
    caller installed earlier (the CLI does, before parsing), else they are installed here, first thing."""
    if signals is None:
        with StopSignals() as own:
            return train(cfg, own)
    if not (cfg.cluster.address or os.environ.get("RAY_ADDRESS")):
        from rlvr.launch.local_cluster import token_auth_env

        # rlvr starts the head: it and this process's client must agree on token authentication, and Ray's
        # client reads the mode when it is first imported, so it is set before anything imports ray
        os.environ.update(token_auth_env())
        if cfg.cluster.device == "cpu":  # DeepSpeed's import otherwise warns that it found no accelerator
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return _train_prepared(cfg, prepare(cfg), signals)


def _preempted(cfg: ExperimentConfig, prep: Prepared, step: int, saved: bool) -> int:
    write_run_state(prep.run_dir, cfg, "preempted", step)
    if saved:
        logger.warning("%s (step %d, run %s)", PREEMPTED_MESSAGE, step, prep.run_dir.root)
    else:
        logger.warning(
            "preempted, resumable: stopped at step %d before anything new was trained, nothing to save; "
            "start the same command again to go on (run %s)",
            step,
            prep.run_dir.root,
        )
    return EXIT_PREEMPTED


def _train_prepared(cfg: ExperimentConfig, prep: Prepared, signals: StopSignals) -> int:
    import ray

    started, head, t0 = False, None, time.time()
    restarts, resume = 0, cfg.checkpoint.resume
    os.environ[EVENTS_LOG_ENV] = str(prep.run_dir.path("events.log"))  # actors of a head started here log there
    try:
        if signals.requested:  # during start-up: nothing trained yet, nothing to save
            return _preempted(cfg, prep, read_run_state(prep.run_dir.root).get("step", 0), saved=False)
        started, head = _start_ray(cfg, signals)
        device = device_of(cfg)
        while True:
            actors, trainer = Actors(), None
            try:
                if signals.requested:  # came while Ray or the actors started: nothing new to save
                    return _preempted(cfg, prep, read_run_state(prep.run_dir.root).get("step", 0), saved=False)
                actors = create_actors(cfg, prep.model_dir, device)
                trainer = build_trainer(cfg, prep, actors, resume)
                trainer.signals = signals
                final = trainer.run()
                if trainer.stopped:
                    return _preempted(cfg, prep, trainer.step, saved=trainer.saved_step == trainer.step)
                write_run_state(prep.run_dir, cfg, "finished", trainer.step)
                logger.info(
                    "done at step %d: %s",
                    trainer.step,
                    {k: round(v, 4) for k, v in final.items() if k.startswith(("eval/reward", "reward/total"))},
                )
                print_summary(prep.run_dir.root, trainer.step, time.time() - t0, final)
                return 0
            except LearnerFailure as e:
                if restarts >= cfg.cluster.max_restarts:
                    raise RuntimeError(f"{e}; --cluster.max-restarts {cfg.cluster.max_restarts} used up") from e
                restarts += 1
                logger.error(
                    "%s: restarting the run from its last complete checkpoint (%d of %d)",
                    e,
                    restarts,
                    cfg.cluster.max_restarts,
                )
                resume = "auto"
            finally:
                if trainer is not None:
                    trainer.close()
                shutdown_actors(actors)
            # a fresh prompt stream (the checkpoint restores its position); the run stays locked throughout
            prep = prepare(cfg, prep.run_dir, resume, prep.lock)
    except BaseException:
        _remove_if_stub(prep)
        raise
    finally:
        os.environ.pop(EVENTS_LOG_ENV, None)
        if started:
            ray.shutdown()
        if head is not None:
            head.stop()
        if prep.lock is not None:
            prep.lock.release()


def _remove_if_stub(prep: Prepared) -> None:
    """A start that failed before its first step leaves no run directory behind (the error was printed)."""
    metrics = prep.run_dir.path("metrics.jsonl")
    if prep.created and not prep.run_dir.complete_checkpoints() and not (metrics.is_file() and metrics.stat().st_size):
        logger.warning("removing %s: the run failed before its first step", prep.run_dir.root)
        remove_created(prep.run_dir.root, prep.created_parents)


def _wandb(cfg: ExperimentConfig, run_dir: RunDir) -> Any:
    if cfg.logging.wandb_mode == "off":
        return None
    from rlvr.telemetry.wandb_logger import WandbLogger

    return WandbLogger.from_config(cfg, run_dir.root)
