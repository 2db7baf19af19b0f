"""Where a run's records go: metrics.jsonl, eval.jsonl, samples.jsonl, eval_samples.jsonl, wandb, the console.

The driver hands over finished records (metric dicts, sample rows as `samples.jsonl` holds them); this class
decides the files, the intervals (`logging.samples_every_n_steps` for the JSONL samples, the wandb logger's own
for its table) and the console progress line. Eval completions (`eval_samples.jsonl`, the first
`logging.num_logged_samples` of every eval) sit next to the training samples in the dashboard.

Invariants: every record carries `step`; an eval is logged at the step whose weights it measured; a record
of a step after a checkpoint is dropped on resume (`truncate_after`) so that a resumed run never shows a
step twice; `close` finishes the wandb run (an unfinished one leaves a HandleAbandonedError in its debug.log).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rlvr.telemetry.metrics import JsonlWriter, Progress, truncate_after_step

RECORD_FILES = ("metrics.jsonl", "eval.jsonl", "samples.jsonl", "eval_samples.jsonl")


class RunLog:
    """The record files of one run directory, the wandb logger (or None) and the console progress line."""

    def __init__(self, root: Path, num_steps: int, logging_cfg: Any, wandb: Any = None) -> None:
        self.root, self.cfg, self.wandb = Path(root), logging_cfg, wandb
        self.files = {name: JsonlWriter(self.root / name) for name in RECORD_FILES}
        self.progress = Progress(num_steps, logging_cfg.console_progress)

    def step(self, step: int, metrics: dict[str, float], samples: list[dict[str, Any]]) -> None:
        """One training step: its metrics, its sample rows when due, wandb, the progress line."""
        self.files["metrics.jsonl"].write({"step": step, "time": time.time(), **metrics})
        every = self.cfg.samples_every_n_steps
        if every and step % every == 0:
            for rec in samples:
                self.files["samples.jsonl"].write(rec)
        if self.wandb is not None:
            self.wandb.log(step, metrics)
            self.wandb.log_samples(step, samples)  # a table only when due (--logging.wandb-table-every-n-steps)
        self.progress.update(step, metrics)

    def baseline(self, metrics: dict[str, float]) -> None:
        """The step-0 record (the eval before training), in metrics.jsonl and wandb."""
        self.files["metrics.jsonl"].write({"step": 0, "time": time.time(), **metrics})
        if self.wandb is not None and metrics:
            self.wandb.log(0, metrics)

    def eval(self, step: int, metrics: dict[str, float], samples: list[dict[str, Any]], to_wandb: bool) -> None:
        """An eval of the weights of `step`; `to_wandb` False when its metrics go out with the step's own."""
        self.files["eval.jsonl"].write({"step": step, "time": time.time(), **metrics})
        for rec in samples:
            self.files["eval_samples.jsonl"].write(rec)
        self.progress.last_eval = metrics.get("eval/reward_mean")
        if self.wandb is not None and to_wandb:
            self.wandb.log(step, metrics)

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after `step` (-1: all), e.g. on resume from a checkpoint of `step`."""
        for name in RECORD_FILES:
            truncate_after_step(self.root / name, step)

    def close(self) -> None:
        self.progress.close()
        for f in self.files.values():
            f.close()
        if self.wandb is not None:
            self.wandb.finish()
