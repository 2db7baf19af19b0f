"""Weights & Biases logging for a run: metrics on a `train/step` axis, the config, sample tables, resume.

`WandbLogger(run_dir, mode=...)` with mode `off` (the default in the config and in tests) does nothing and
never imports wandb. With `online` or `offline`:
- The wandb run id is persisted in `<run_dir>/wandb_run_id` on first start; a resumed training run reads it
  back and calls `wandb.init(id=..., resume="allow")`, so its points continue the same wandb run.
- Every metric is plotted against `train/step` (`define_metric("*", step_metric="train/step")`), which
  `log` adds to each record; wandb's own step counter is never set, so a resume cannot collide with it.
  Keys keep rlvr's namespaces (docs/design.md, Metrics: reward/, eval/, rollout/, loss/, perf/, time/ ...), which
  wandb shows as one panel section each.
- `log_samples` logs a table of completions (prompt, completion, reward per function, total, advantage)
  every `samples_every_n_steps` steps (the config's `logging.wandb_table_every_n_steps`: a table a step is
  large and slow to browse), under `samples/completions`.
Offline mode needs no network: runs are written under `dir` (default: the run directory) for `wandb sync`.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from rlvr.telemetry.logs import get_logger

WandbMode = Literal["off", "online", "offline"]
RUN_ID_FILE = "wandb_run_id"
"""File in the run directory holding the wandb run id (resume continues the same wandb run)."""
STEP_KEY = "train/step"
SAMPLE_COLUMNS = ["step", "prompt_id", "prompt", "completion", "total", "advantage", "correct", "turns"]

log = get_logger(__name__)


def turns_text(sample: Mapping[str, Any]) -> str:
    """A multi-turn sample's transcript for the table, one `[policy]` / `[tool]` block per turn and the end reason;
    "" for a single-turn sample (its completion is the whole answer)."""
    turns = sample.get("turns") or []
    if not turns:
        return ""
    blocks = [f"[{'tool' if t.get('role') == 'tool' else 'policy'}] {t.get('text', '')}" for t in turns]
    if sample.get("end_reason"):
        blocks.append(f"(ended: {sample['end_reason']})")
    return "\n".join(blocks)


def persisted_run_id(run_dir: str | os.PathLike[str]) -> str:
    """The wandb run id of this run directory, created (and written) on first use."""
    path = Path(run_dir) / RUN_ID_FILE
    if path.exists():
        run_id = path.read_text().strip()
        if run_id:
            return run_id
    run_id = uuid.uuid4().hex[:12]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id + "\n")
    return run_id


def _plain(config: Any) -> Any:
    """A dataclass config (or anything) as plain dicts/lists for wandb's config."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    return config


class WandbLogger:
    """The run's wandb connection (module docstring); every method is a no-op with mode `off`."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        mode: WandbMode = "off",
        project: str = "rlvr",
        entity: str | None = None,
        run_name: str | None = None,
        config: Any = None,
        samples_every_n_steps: int = 1,
        wandb_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if mode not in ("off", "online", "offline"):
            raise ValueError(f"wandb mode must be off, online or offline, got {mode!r}")
        self.mode = mode
        self.samples_every_n_steps = samples_every_n_steps
        self.run: Any = None
        if mode == "off":
            return
        import wandb  # heavy: only when wandb logging is on

        self._wandb = wandb
        self.run_id = persisted_run_id(run_dir)
        directory = Path(wandb_dir or os.environ.get("WANDB_DIR") or run_dir)
        directory.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=project,
            entity=entity,
            name=run_name or Path(run_dir).name,
            id=self.run_id,
            resume="allow",
            mode=mode,
            dir=str(directory),
            config=_plain(config),
            settings=wandb.Settings(console="off"),
        )
        self.run.define_metric(STEP_KEY)
        self.run.define_metric("*", step_metric=STEP_KEY)
        log.info("wandb %s run %s (project %s)", mode, self.run_id, project)

    @classmethod
    def from_config(cls, cfg: Any, run_dir: str | os.PathLike[str]) -> WandbLogger:
        """From an `ExperimentConfig` (its `logging` section), logging the whole resolved config."""
        lc = cfg.logging
        return cls(
            run_dir,
            mode=lc.wandb_mode,
            project=lc.wandb_project,
            entity=lc.wandb_entity,
            run_name=lc.run_name,
            config=cfg,
            samples_every_n_steps=lc.wandb_table_every_n_steps,
        )

    @property
    def enabled(self) -> bool:
        return self.run is not None

    def log_config(self, config: Any) -> None:
        """Record the resolved config (a dataclass or mapping) in the run's config."""
        if self.run is not None:
            self.run.config.update(_plain(config), allow_val_change=True)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log one record of metrics at training step `step` (the x axis of every panel)."""
        if self.run is not None:
            self.run.log({**metrics, STEP_KEY: step})

    def should_log_samples(self, step: int) -> bool:
        return self.run is not None and self.samples_every_n_steps > 0 and step % self.samples_every_n_steps == 0

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> bool:
        """Log a completions table at `step` if due; rows as in samples.jsonl (scores dict per row).

        Returns whether a table was logged."""
        if not samples or not self.should_log_samples(step):
            return False
        functions = sorted({name for s in samples for name in (s.get("scores") or {})})
        table = self._wandb.Table(columns=SAMPLE_COLUMNS + [f"reward/{f}" for f in functions])
        for s in samples:
            scores = s.get("scores") or {}
            table.add_data(
                s.get("step", step),
                s.get("prompt_id"),
                s.get("prompt"),
                s.get("completion"),
                s.get("total"),
                s.get("advantage"),
                s.get("correct"),
                turns_text(s),
                *[scores.get(f) for f in functions],
            )
        self.run.log({"samples/completions": table, STEP_KEY: step})
        return True

    def finish(self) -> None:
        """Flush and close the run (idempotent)."""
        if self.run is not None:
            self.run.finish()
            self.run = None
