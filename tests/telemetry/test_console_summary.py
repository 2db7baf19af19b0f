"""The console of `rlvr train`: a quiet stderr (progress, warnings, where the run is) and a closing summary on
stdout naming the run dir, the checkpoint on disk, the final eval and the commands to run next. Engine, Ray
and library chatter shows only with `--logging.level DEBUG`."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.telemetry.logs import CONSOLE, get_logger, setup_logging
from rlvr.telemetry.summary import summary_lines

FIXTURE_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "run_tiny"
SHORT = [
    "--num-steps",
    "3",
    "--rollout.prompts-per-step",
    "4",
    "--eval.max-prompts",
    "8",
    "--logging.run-name",
    "console",
]
CHATTER = (
    "Loading weights",
    "Writing model shards",
    "Connecting to existing Ray cluster",
    "Connected to Ray cluster",
    "Setting accelerator to CPU",
    "policy version",
    "eval of step",
)


def _train(tmp_path: Path, *extra: str, own_cluster: bool) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if own_cluster:
        env.pop("RAY_ADDRESS", None)  # rlvr starts (and stops) its own local head, as a user's first run does
    cmd = [sys.executable, "-m", "rlvr.cli", "train", "--checkpoint.output-dir", str(tmp_path / "runs"), *SHORT, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)


@pytest.mark.slow
def test_console_quiet_and_summary_names_what_exists(tmp_path: Path) -> None:
    out = _train(tmp_path, own_cluster=True)
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "runs" / "console"
    lines = out.stdout.splitlines()
    assert lines[0] == lines[0].strip() and lines[0].startswith("rlvr train: finished at step 3 in "), out.stdout
    fields = {ln.split()[0]: ln.split(None, 1)[1] for ln in lines[1:] if ln.startswith("  ") and len(ln.split()) > 1}
    ckpt = Path(fields["checkpoint"])
    assert ckpt == run / "checkpoints" / "step_3" and (ckpt / "model.safetensors").is_file()
    assert f"rlvr dashboard {run}" in out.stdout
    assert f"rlvr eval --model {ckpt} --output {run / 'eval_out'}" in out.stdout
    last_eval = json.loads((run / "eval.jsonl").read_text().splitlines()[-1])
    assert last_eval["step"] == 3
    assert (
        f"final eval   step 3: reward {last_eval['eval/reward_mean']:.3f}  pass@1 {last_eval['eval/pass@1']:.3f}"
        in out.stdout
    )
    err = out.stderr
    assert f"run directory {run}" in err
    assert [ln for ln in err.splitlines() if ln.startswith("step ")][-1].startswith("step 3/3 reward ")
    assert not [c for c in CHATTER if c in err], err[-3000:]
    assert "Traceback" not in err and "done at step" not in err
    events = (run / "events.log").read_text()  # the chatter the console left out is in the run's log
    assert "eval of step 0 started" in events and "done at step 3" in events


@pytest.mark.slow
def test_console_debug_level_shows_engine_lines(tmp_path: Path, ray_cluster: str) -> None:
    out = _train(tmp_path, "--logging.level", "DEBUG", own_cluster=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "policy version" in out.stderr and "eval of step 0 started" in out.stderr
    assert "rlvr train: finished at step 3" in out.stdout


def test_console_filter_passes_warnings_and_marked_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    log_path = tmp_path / "events.log"
    setup_logging("driver", None, "INFO", str(log_path))
    log = get_logger("rlvr.test_console")
    log.info("chatter line")
    log.info("where the run is", extra=CONSOLE)
    log.warning("a warning")
    log.debug("debug line")
    for h in logging.getLogger("rlvr").handlers:
        h.flush()
    console = stream.getvalue()
    assert "where the run is" in console and "a warning" in console and "chatter line" not in console
    file_text = log_path.read_text()
    assert "chatter line" in file_text and "where the run is" in file_text and "debug line" not in file_text
    assert os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") == "1"

    stream.truncate(0)
    setup_logging("driver", None, "DEBUG", None)
    log.info("chatter again")
    log.debug("debug again")
    assert "chatter again" in stream.getvalue() and "debug again" in stream.getvalue()
    setup_logging("driver", None, "INFO", None)


def test_actor_logs_append_to_events_log_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "events.log"
    monkeypatch.setenv("RLVR_EVENTS_LOG", str(path))
    setup_logging("engine", 0, "INFO")
    get_logger("rlvr.test_console").info("engine record")
    setup_logging("driver", None, "INFO")  # closes the file handler again
    assert "[engine:0] rlvr.test_console: engine record" in path.read_text()
    monkeypatch.setenv("RLVR_EVENTS_LOG", str(tmp_path / "missing" / "events.log"))
    setup_logging("learner", 1, "INFO")  # a path this process cannot reach: console only, no crash
    setup_logging("driver", None, "INFO")


def test_summary_without_checkpoint_or_eval(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    lines = summary_lines(run, 5, 12.4, {"reward/total_mean": 0.25})
    text = "\n".join(lines)
    assert lines[0] == "rlvr train: finished at step 5 in 12 s"
    assert "checkpoint   none written" in text
    assert "train        reward 0.250" in text and "final eval   none" in text
    assert "rlvr eval" not in text and f"rlvr dashboard {run}" in text


def test_summary_reads_the_last_eval_record() -> None:
    lines = summary_lines(FIXTURE_RUN, 6, 3.0, {})
    last = json.loads((FIXTURE_RUN / "eval.jsonl").read_text().splitlines()[-1])
    (line,) = [ln for ln in lines if ln.startswith("  final eval")]
    ks = sorted(int(k.rsplit("@", 1)[1]) for k in last if k.startswith("eval/pass@"))
    assert ks[0] == 1 and len(ks) > 1  # the fixture's eval samples k = 4: pass@1, @2, @4
    pass_at = "  ".join(f"pass@{k} {last[f'eval/pass@{k}']:.3f}" for k in ks)
    assert line == (
        f"  final eval   step {last['step']}: reward {last['eval/reward_mean']:.3f}  {pass_at} "
        f"over {int(last['eval/num_prompts'])} prompts"
    )
    assert "train        reward n/a" in "\n".join(lines)


def test_summary_of_a_lora_run_merges_before_eval(tmp_path: Path) -> None:
    run = tmp_path / "r"
    ckpt = run / "checkpoints" / "step_2"
    ckpt.mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step_2\n")
    (ckpt / "adapter_config.json").write_text("{}")
    text = "\n".join(summary_lines(run, 2, 1.0, {}))
    assert f"rlvr export --merge {ckpt} {run / 'merged'}" in text
    assert f"rlvr eval --model {run / 'merged'} --output {run / 'eval_out'}" in text


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_line_is_ended_when_a_run_stops_early() -> None:
    from rlvr.telemetry.metrics import Progress

    stream = _Tty()
    progress = Progress(10, True, stream)
    progress.update(1, {"reward/total_mean": 0.5, "perf/tokens_per_s": 8160.747})
    text = stream.getvalue()
    assert text.startswith("\rstep 1/10 reward 0.500 tok/s 8161 ETA") and not text.endswith("\n")
    progress.close()
    assert stream.getvalue().endswith("\n")
    progress.close()
    assert stream.getvalue().count("\n") == 1
