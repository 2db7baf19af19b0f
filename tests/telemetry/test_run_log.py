"""RunLog: the run's record files, eval completions next to training samples, and what reaches wandb (the step-0
eval, a completions table every N steps, a finished run on close)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlvr.config import default_config
from rlvr.telemetry.run_log import RECORD_FILES, RunLog
from rlvr.telemetry.wandb_logger import WandbLogger


class Recorder:
    """Records what RunLog sends to a wandb logger (the interface of WandbLogger), due every 2 steps."""

    def __init__(self) -> None:
        self.logged: list[tuple[int, dict]] = []
        self.tables: list[int] = []
        self.finished = False

    def log(self, step: int, metrics: dict) -> None:
        self.logged.append((step, dict(metrics)))

    def log_samples(self, step: int, samples: list) -> bool:
        if step % 2 == 0 and samples:
            self.tables.append(step)
            return True
        return False

    def finish(self) -> None:
        self.finished = True


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_run_log_files_and_wandb_calls(tmp_path: Path) -> None:
    cfg = default_config().logging
    cfg.samples_every_n_steps, cfg.console_progress = 3, False
    rec = Recorder()
    log = RunLog(tmp_path, 6, cfg, rec)
    log.baseline({"eval/reward_mean": 0.1})
    log.eval(0, {"eval/reward_mean": 0.1}, [{"step": 0, "prompt": "p", "completion": "c"}], to_wandb=False)
    for step in range(1, 7):
        log.step(step, {"reward/total_mean": step / 10}, [{"step": step, "prompt": "p", "completion": str(step)}])
    log.eval(6, {"eval/reward_mean": 0.9}, [{"step": 6, "prompt": "p", "completion": "e"}], to_wandb=True)
    log.close()
    assert rec.logged[0] == (0, {"eval/reward_mean": 0.1})  # the step-0 eval reaches wandb
    assert [s for s, _ in rec.logged] == [0, 1, 2, 3, 4, 5, 6, 6] and rec.tables == [2, 4, 6] and rec.finished
    assert [r["step"] for r in _lines(tmp_path / "samples.jsonl")] == [3, 6]  # every samples_every_n_steps
    assert [r["completion"] for r in _lines(tmp_path / "eval_samples.jsonl")] == ["c", "e"]
    assert [r["step"] for r in _lines(tmp_path / "metrics.jsonl")] == list(range(7))
    RunLog(tmp_path, 6, cfg).truncate_after(3)
    assert [r["step"] for r in _lines(tmp_path / "eval_samples.jsonl")] == [0]
    assert max(r["step"] for name in RECORD_FILES for r in _lines(tmp_path / name)) == 3


def test_wandb_offline_table_interval_and_clean_exit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = default_config()
    cfg.logging.wandb_mode, cfg.logging.wandb_project, cfg.logging.wandb_table_every_n_steps = "offline", "t", 3
    cfg.logging.console_progress = False
    wb = WandbLogger.from_config(cfg, tmp_path / "run")
    log = RunLog(tmp_path / "run", 6, cfg.logging, wb)
    log.baseline({"eval/reward_mean": 0.25})
    assert wb.run.summary["eval/reward_mean"] == 0.25 and wb.run.summary["train/step"] == 0
    sample = {
        "step": 1,
        "prompt_id": "p0",
        "prompt": "p",
        "completion": "c",
        "scores": {"copy": 1.0},
        "total": 1.0,
        "advantage": 0.0,
        "correct": True,
    }
    due = [wb.log_samples(step, [dict(sample, step=step)]) for step in range(1, 7)]
    assert due == [False, False, True, False, False, True]
    assert default_config().logging.wandb_table_every_n_steps > 1  # not a table every step by default
    log.close()
    assert wb.run is None
    (debug,) = (tmp_path / "wandb" / "wandb").glob("offline-run-*/logs/debug.log")
    text = debug.read_text()
    assert "HandleAbandonedError" not in text and "Traceback" not in text
