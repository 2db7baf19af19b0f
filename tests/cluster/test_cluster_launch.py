"""`rlvr launch`: argument splitting, the resource check's arithmetic (exit 2), dry run, and (slow) a real
run: a local head started and stopped by rlvr, training submitted as a Ray job, its exit status returned."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rlvr.config import default_config, from_dict, read_yaml
from rlvr.launch import ray_job as launch

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "--num-steps",
    "2",
    "--rollout.prompts-per-step",
    "4",
    "--generation.num-samples",
    "4",
    "--eval.every-n-steps",
    "0",
    "--eval.at-step-0",
    "False",
    "--logging.console-progress",
    "False",
]


@pytest.fixture(autouse=True)
def _restore_auth_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """`launch.main` sets RAY_AUTH_MODE in its process when it is unset; Ray reads the mode once per process, so
    pin it to what this test process already uses (conftest: disabled) and restore it after each test."""
    monkeypatch.setenv("RAY_AUTH_MODE", os.environ.get("RAY_AUTH_MODE") or "disabled")


def test_cluster_launch_splits_launch_and_train_flags() -> None:
    args, rest = launch._split_argv(
        ["--address", "10.0.0.1:6379", "--config", "configs/gpu-2x.yaml", "--learner.lr", "2e-6", "--no-wait"]
    )
    assert args.address == "10.0.0.1:6379" and args.no_wait
    assert rest == ["--config", "configs/gpu-2x.yaml", "--learner.lr", "2e-6"]


def test_cluster_resource_error_shows_arithmetic() -> None:
    cfg = default_config()
    cfg.cluster.num_engines = 3
    msg = launch.resource_error(cfg, num_gpus=0, num_cpus=2)
    assert msg == (
        "CPU actors do not fit: (num_learners 1 + num_engines 3) * cpus_per_actor 1.0 = 4.0 CPUs, but Ray reports 2"
    )
    assert launch.resource_error(cfg, num_gpus=0, num_cpus=4) is None
    gpu = from_dict(read_yaml(str(ROOT / "configs" / "gpu-8x.yaml")))
    assert launch.resource_error(gpu, num_gpus=4, num_cpus=64) == (
        "GPU split does not fit: num_learners 6 + num_engines 2 * engine_tp 1 = 8 GPUs, but Ray reports 4"
    )


def test_cluster_launch_exits_2_when_cluster_too_small(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No Ray here: the cluster's report is stubbed; nothing is submitted when the check fails."""
    monkeypatch.setattr(launch, "cluster_resources", lambda address: (4.0, 64.0, "http://x:8265"))
    monkeypatch.setattr(launch, "run_job", lambda *a, **k: pytest.fail("submitted despite the failed check"))
    monkeypatch.chdir(ROOT)
    code = launch.main(["--address", "10.0.0.1:6379", "--config", "configs/gpu-8x.yaml"])
    err = capsys.readouterr().err
    assert code == 2
    assert "the cluster at 10.0.0.1:6379 is too small" in err
    assert "num_learners 6 + num_engines 2 * engine_tp 1 = 8 GPUs, but Ray reports 4" in err


def test_cluster_launch_dry_run_and_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert launch.main(["--dry-run", "--num-steps", "3"]) == 0
    out = capsys.readouterr().out
    assert f"output_dir: {tmp_path}/runs" in out and "num_steps: 3" in out  # relative paths made absolute
    assert "# job entrypoint: rlvr train --config config.yaml" in out
    assert launch.main(["--generation.num-samples", "1"]) == 2
    assert "config error" in capsys.readouterr().err


@pytest.mark.slow
def test_cluster_launch_runs_training_job(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one-command path for real: local head (its own ports and temp dir), Ray job, logs, exit 0."""
    pytest.importorskip("rlvr.orchestration.run")
    for var in ("RAY_ADDRESS",):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    started: list = []
    real_head = launch_head_class()

    class RecordingHead(real_head):  # type: ignore[misc, valid-type]
        def start(self):
            started.append(self)
            return super().start()

    monkeypatch.setattr("rlvr.launch.local_cluster.LocalRayHead", RecordingHead)
    code = launch.main(["--num-cpus", "2", "--job-id", "rlvr-test-launch", "--logging.run-name", "launched", *TINY])
    out = capsys.readouterr()
    assert code == 0, out.out[-3000:] + out.err[-3000:]
    assert "job rlvr-test-launch SUCCEEDED" in out.err
    metrics = (tmp_path / "runs" / "launched" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(m)["step"] for m in metrics][-1] == 2
    (head,) = started
    assert head.proc is not None and head.proc.poll() is not None  # the head rlvr started is gone
    assert not os.path.exists(head.temp_dir)


def launch_head_class() -> type:
    from rlvr.launch.local_cluster import LocalRayHead

    return LocalRayHead
