"""Which run directory `rlvr train` uses, and what it refuses: bad output dirs, unrelated directories, stub run
dirs after a failed start, and the same command continuing the unfinished run with the same config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlvr.config import default_config, from_dict
from rlvr.orchestration.run_dirs import RUN_STATE, RunLock, config_fingerprint, select_run_dir


def _train(out: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "rlvr.cli",
        "train",
        "--checkpoint.output-dir",
        str(out),
        "--num-steps",
        "2",
        "--logging.console-progress",
        "False",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_output_dir_that_is_a_file_is_an_error(tmp_path):
    out = tmp_path / "runs"
    out.write_text("not a directory")
    p = _train(out)
    assert p.returncode == 2 and "--checkpoint.output-dir" in p.stderr and "is a file" in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_output_dir_not_writable_is_an_error(tmp_path):
    out = tmp_path / "runs"
    out.mkdir()
    out.chmod(0o555)
    try:
        p = _train(out)
    finally:
        out.chmod(0o755)
    assert p.returncode == 2 and "not writable" in p.stderr and "Traceback" not in p.stderr


def test_failed_start_leaves_no_run_directory(tmp_path):
    out = tmp_path / "runs"
    p = _train(out, "--data.datasets", "builtin:copy", str(tmp_path / "missing.jsonl"))
    assert p.returncode == 2 and "missing.jsonl" in p.stderr
    assert not out.exists() or not any(out.iterdir())


def test_unrelated_directory_is_refused_and_untouched(tmp_path):
    other = tmp_path / "runs" / "mine"
    other.mkdir(parents=True)
    (other / "metrics.jsonl").write_text("precious\n")
    p = _train(tmp_path / "runs", "--logging.run-name", "mine")
    assert p.returncode == 2 and "not an rlvr run directory" in p.stderr and "config.yaml" in p.stderr
    assert sorted(x.name for x in other.iterdir()) == ["metrics.jsonl"]
    assert (other / "metrics.jsonl").read_text() == "precious\n"


def test_failed_start_leaves_an_existing_run_as_it_was(tmp_path):
    """A start that fails its checks (here a missing dataset) on an existing run's name exits 2 and changes
    neither its config.yaml nor its run state: they are written only once every check has passed."""
    out = tmp_path / "runs"
    d = _run(out, "done", "f" * 16, "finished", time.time() - 100)
    before = {n: (d / n).read_bytes() for n in ("config.yaml", RUN_STATE)}
    p = _train(out, "--logging.run-name", "done", "--data.datasets", "builtin:copy", str(tmp_path / "missing.jsonl"))
    assert p.returncode == 2 and "missing.jsonl" in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert {n: (d / n).read_bytes() for n in before} == before


@pytest.mark.parametrize("link", ["metrics.jsonl", "config.yaml", "checkpoints/step_1"])
def test_a_run_directory_with_a_symlink_is_refused_before_any_write(tmp_path, link):
    """rlvr writes run files by name: a link planted in the run directory (or in its checkpoints/) would carry
    those writes outside it. The start exits 2 naming the link, and the file it points to is untouched."""
    out = tmp_path / "runs"
    d = _run(out, "planted", "f" * 16, "preempted", time.time() - 100)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    target = d / link
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        target.unlink()
    target.symlink_to(victim)
    p = _train(out, "--logging.run-name", "planted")
    assert p.returncode == 2 and "symbolic links" in p.stderr and link in p.stderr, p.stderr[-2000:]
    assert victim.read_text() == "precious\n" and "Traceback" not in p.stderr


def _run(out: Path, name: str, fingerprint: str, status: str, started: float) -> Path:
    d = out / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("x: 1\n")
    (d / RUN_STATE).write_text(json.dumps({"config": fingerprint, "status": status, "step": 3, "started": started}))
    return d


def test_same_command_continues_the_newest_unfinished_run_with_the_same_config(tmp_path):
    cfg = from_dict({"checkpoint": {"output_dir": str(tmp_path)}}, base=default_config())
    fp, now = config_fingerprint(cfg), time.time()
    _run(tmp_path, "old-preempted", fp, "preempted", now - 100)
    newest = _run(tmp_path, "new-preempted", fp, "preempted", now - 50)
    _run(tmp_path, "finished", fp, "finished", now - 10)
    _run(tmp_path, "other-config", "0" * 16, "running", now - 5)
    assert select_run_dir(cfg).root == newest
    lock = RunLock(newest)  # in use by another driver: not taken
    assert lock.acquire()
    try:
        assert select_run_dir(cfg).root.name == "old-preempted"
    finally:
        lock.release()
    fresh = from_dict({"checkpoint": {"resume": "never"}}, base=cfg)
    assert select_run_dir(fresh).root.name.startswith("rlvr-")
    named = from_dict({"logging": {"run_name": "finished"}}, base=cfg)
    assert select_run_dir(named).root.name == "finished"


def test_unreadable_or_malformed_sibling_runs_are_skipped(tmp_path, monkeypatch):
    """A sibling run that cannot be read (another user's: PermissionError) or whose run.json is hand-edited
    (`started` not a number) is skipped with a warning, not a traceback; the same command still continues its
    own unfinished run."""
    from rlvr.orchestration import run_dirs

    cfg = from_dict({"checkpoint": {"output_dir": str(tmp_path)}}, base=default_config())
    fp, now = config_fingerprint(cfg), time.time()
    mine = _run(tmp_path, "mine", fp, "preempted", now - 100)
    bad = _run(tmp_path, "bad-started", fp, "preempted", now)
    (bad / RUN_STATE).write_text(json.dumps({"config": fp, "status": "preempted", "started": "yesterday"}))
    theirs = _run(tmp_path, "theirs", fp, "preempted", now)
    real_in_use = run_dirs._in_use

    def in_use(root):
        if root == theirs:  # its .lock belongs to another user (root reads everything: simulated)
            raise PermissionError(13, "Permission denied", str(root / ".lock"))
        return real_in_use(root)

    monkeypatch.setattr(run_dirs, "_in_use", in_use)
    assert select_run_dir(cfg).root == mine


def test_a_finished_run_is_not_continued(tmp_path):
    cfg = from_dict({"checkpoint": {"output_dir": str(tmp_path)}}, base=default_config())
    _run(tmp_path, "done", config_fingerprint(cfg), "finished", time.time())
    chosen = select_run_dir(cfg).root
    assert chosen.name.startswith("rlvr-") and not chosen.exists()


def test_fingerprint_ignores_logging_and_resume_only():
    base = default_config()
    same = from_dict(
        {"logging": {"run_name": "x", "level": "DEBUG", "console_progress": False}, "checkpoint": {"resume": "never"}},
        base=base,
    )
    assert config_fingerprint(same) == config_fingerprint(base)
    assert config_fingerprint(from_dict({"learner": {"lr": 1e-2}}, base=base)) != config_fingerprint(base)


# ------------------------------------------------------------------ a failed start removes only what it owns
def _cfg(out: Path, **sections):
    return from_dict(
        {"checkpoint": {"output_dir": str(out)}, "data": {"datasets": ["builtin:copy"]}, **sections},
        base=default_config(),
    )


def _other_run(root: Path) -> RunLock:
    """Another `rlvr train`'s live run at `root`: an rlvr run directory whose lock that driver holds."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text("theirs\n")
    lock = RunLock(root)
    assert lock.acquire()
    return lock


def test_failed_start_keeps_a_run_created_meanwhile_in_the_output_dir_it_made(tmp_path, monkeypatch):
    """--checkpoint.output-dir did not exist: this start made it; a second command made its run in it; this
    start then fails. Only this start's run directory goes; the output dir and the other run stay."""
    from rlvr.orchestration import run

    out = tmp_path / "new" / "runs"
    locks = []

    def fail_after_other_run_appears(cfg, run_dir):
        locks.append(_other_run(out / "theirs"))
        raise ValueError("disk full (simulated)")

    monkeypatch.setattr(run, "_check_output_dir", fail_after_other_run_appears)
    try:
        with pytest.raises(ValueError, match="simulated"):
            run.prepare(_cfg(out))
        assert sorted(p.name for p in out.iterdir()) == ["theirs"]
        assert (out / "theirs" / "config.yaml").read_text() == "theirs\n"
    finally:
        for lock in locks:
            lock.release()
    monkeypatch.setattr(run, "_check_output_dir", lambda cfg, run_dir: (_ for _ in ()).throw(ValueError("x")))
    out2 = tmp_path / "fresh" / "runs"
    with pytest.raises(ValueError):
        run.prepare(_cfg(out2))
    assert not (tmp_path / "fresh").exists()  # what it made and nobody else used is removed, parents too


def test_same_second_starts_get_separate_runs_and_a_failure_keeps_the_winners(tmp_path, monkeypatch):
    """Two commands pick the same `rlvr-<time>` name; the other one creates it first, just before this one
    does: this one takes `<name>-2`, and when its start fails the other's run is untouched."""
    from rlvr.orchestration import run

    out = tmp_path / "runs"
    out.mkdir()
    real_mkdir, locks = Path.mkdir, []

    def mkdir_after_the_winner(self, *args, **kwargs):
        if not locks and self.parent == out:  # the first directory made in `out`: the other command is faster
            locks.append(None)  # fired (and _other_run's own mkdir does not fire again)
            locks.append(_other_run(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir_after_the_winner)
    cfg = _cfg(out, checkpoint={"output_dir": str(out), "min_free_gb": 1e12})  # fails after the lock is taken
    try:
        with pytest.raises(ValueError, match="min-free-gb"):
            run.prepare(cfg)
        (winner,) = [p for p in out.iterdir()]
        assert winner.name.startswith("rlvr-") and (winner / "config.yaml").read_text() == "theirs\n"
    finally:
        for lock in filter(None, locks):
            lock.release()


def test_generated_run_name_takes_the_next_free_suffix(tmp_path):
    from rlvr.orchestration.checkpoint import RunDir
    from rlvr.orchestration.run_dirs import create_run_dir

    (tmp_path / "rlvr-20260101-000000").mkdir()
    (tmp_path / "rlvr-20260101-000000-2").mkdir()
    run, created, parents = create_run_dir(RunDir(tmp_path / "rlvr-20260101-000000"), new_name=True)
    assert run.root.name == "rlvr-20260101-000000-3" and created and parents == [] and run.ckpts.is_dir()
    named, created, _ = create_run_dir(RunDir(tmp_path / "rlvr-20260101-000000"), new_name=False)
    assert named.root.name == "rlvr-20260101-000000" and not created  # a named run is used as it is


def test_learner_failure_restart_keeps_the_run_locked(tmp_path, monkeypatch):
    """A learner failure restarts the run (prepare again): another driver of the same command must not be able
    to take the run in between. Ray and the actors are stubbed out; prepare is the real one."""
    from types import SimpleNamespace

    from rlvr.orchestration import run
    from rlvr.orchestration.health import LearnerFailure

    cfg = _cfg(tmp_path / "runs", cluster={"device": "cpu", "max_restarts": 1})
    prep = run.prepare(cfg)
    root, real_prepare, taken = prep.run_dir.root, run.prepare, []

    def prepare_while_another_driver_tries(*args, **kwargs):
        other = RunLock(root)  # the same command started again, right in the restart's handoff
        taken.append(other.acquire())
        other.release()
        return real_prepare(*args, **kwargs)

    attempts = []

    def build_trainer(cfg, prep, actors, resume=None):
        attempts.append(resume)
        if len(attempts) == 1:
            raise LearnerFailure(0, "died (simulated)")
        return SimpleNamespace(run=dict, stopped=False, step=cfg.num_steps, close=lambda: None)

    monkeypatch.setattr(run, "prepare", prepare_while_another_driver_tries)
    monkeypatch.setattr(run, "_start_ray", lambda cfg, signals=None: (False, None))
    monkeypatch.setattr(run, "create_actors", lambda cfg, model_dir, device: run.Actors())
    monkeypatch.setattr(run, "shutdown_actors", lambda actors: None)
    monkeypatch.setattr(run, "build_trainer", build_trainer)
    assert run._train_prepared(cfg, prep, SimpleNamespace(requested=False)) == 0
    assert attempts == ["auto", "auto"] and taken == [False]
    lock = RunLock(root)  # released once the run is over
    assert lock.acquire()
    lock.release()


def test_tiny_model_on_a_file_without_a_usable_row_names_the_rows(tmp_path):
    """builtin:tiny learns its tokenizer from the datasets' text; a local file whose only row is bad used to get
    the message for hub datasets. Its own rows are named instead."""
    data = tmp_path / "u.json"
    data.write_bytes(b'[{"prompt": "\xff", "ground_truth": "2"}]\n')
    p = _train(tmp_path / "runs", "--data.datasets", str(data))
    assert p.returncode == 2 and f"{data}:1 (row 0)" in p.stderr and "not UTF-8" in p.stderr, p.stderr[-2000:]
    assert "hub datasets" not in p.stderr
