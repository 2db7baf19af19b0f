"""WandbLogger in offline mode (no network) with a tmp WANDB_DIR: step axis, config, sample tables, resume id."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from rlvr.telemetry.wandb_logger import RUN_ID_FILE, STEP_KEY, WandbLogger, persisted_run_id


@dataclass
class _Cfg:
    lr: float = 1e-6
    num_steps: int = 3


def test_off_mode_is_a_no_op(tmp_path: Path) -> None:
    logger = WandbLogger(tmp_path / "run", mode="off")
    assert not logger.enabled and not logger.log_samples(1, [{"prompt": "p"}])
    logger.log(1, {"loss/kl": 0.1})
    logger.finish()
    assert not (tmp_path / "run" / RUN_ID_FILE).exists()
    with pytest.raises(ValueError, match="wandb mode"):
        WandbLogger(tmp_path, mode="disabled")  # type: ignore[arg-type]


def test_offline_run_logs_and_resumes_same_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    run_dir = tmp_path / "runs" / "tiny"
    logger = WandbLogger(run_dir, mode="offline", project="rlvr-test", config=_Cfg(), samples_every_n_steps=2)
    run_id = logger.run_id
    assert (run_dir / RUN_ID_FILE).read_text().strip() == run_id == logger.run.id
    assert logger.run.config["lr"] == 1e-6
    logger.log_config({"num_steps": 5})
    assert logger.run.config["num_steps"] == 5
    for step in (1, 2):
        logger.log(step, {"reward/total_mean": 0.1 * step, "loss/kl": 0.01})
    samples = [
        {
            "step": 2,
            "prompt_id": "copy:0:0",
            "prompt": "p",
            "completion": "c",
            "scores": {"copy": 1.0},
            "total": 1.0,
            "advantage": 0.5,
            "correct": True,
        }
    ]
    assert not logger.log_samples(1, samples)  # not due (every 2 steps)
    assert logger.log_samples(2, samples)
    assert logger.run.summary[STEP_KEY] == 2 and logger.run.summary["loss/kl"] == 0.01
    logger.finish()
    offline = list((tmp_path / "wandb" / "wandb").glob(f"offline-run-*-{run_id}"))
    assert offline and any(p.suffix == ".wandb" for p in offline[0].iterdir())

    # A resumed training run (same run dir) continues the same wandb run id.
    assert persisted_run_id(run_dir) == run_id
    from rlvr.config import default_config

    cfg = default_config()
    cfg.logging.wandb_mode, cfg.logging.wandb_project = "offline", "rlvr-test"
    resumed = WandbLogger.from_config(cfg, run_dir)
    assert resumed.run.config["logging"]["wandb_mode"] == "offline"
    assert resumed.run.id == run_id
    resumed.log(3, {"loss/kl": 0.02})
    resumed.finish()


def test_the_table_shows_an_episodes_turns_by_role() -> None:
    from rlvr.telemetry.wandb_logger import SAMPLE_COLUMNS, turns_text

    assert "turns" in SAMPLE_COLUMNS
    assert turns_text({"completion": "c"}) == ""  # single-turn: the completion column says it all
    episode = {
        "turns": [
            {"role": "assistant", "text": "?B"},
            {"role": "tool", "text": "=dbe"},
            {"role": "assistant", "text": "dbe"},
        ],
        "end_reason": "done",
    }
    assert turns_text(episode) == "[policy] ?B\n[tool] =dbe\n[policy] dbe\n(ended: done)"
