"""`rlvr submit --output FILE`: the location is checked before the spec is built (exit 2, the path named); a run's
files, other files and symlinks are never overwritten; an earlier spec is replaced, atomically."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlvr.launch import submit


def _refused(out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    def no_work(args: object) -> None:
        raise AssertionError("the spec was built before the output location was checked")

    with monkeypatch.context() as m:
        m.setattr(submit, "build_request", no_work)
        assert submit.main(["slurm", "--dry-run", "--output", str(out)]) == 2
    captured = capsys.readouterr()
    assert f"--output {out}" in captured.err and captured.out == ""
    return captured.err


def test_missing_directory_and_non_files_exit_2_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "does not exist" in _refused(tmp_path / "nodir" / "spec.sbatch", monkeypatch, capsys)
    afile = tmp_path / "afile"
    afile.write_text("x")
    _refused(afile / "spec.sbatch", monkeypatch, capsys)
    _refused(tmp_path, monkeypatch, capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_run_files_other_files_and_symlinks_are_not_overwritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "config.yaml").write_text("seed: 1\n")
    assert "run directory" in _refused(run / "config.yaml", monkeypatch, capsys)
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    _refused(notes, monkeypatch, capsys)
    victim = tmp_path / "victim.sbatch"
    victim.write_text("VICTIM")
    link = tmp_path / "job.sbatch"
    link.symlink_to(victim)
    assert "symlink" in _refused(link, monkeypatch, capsys)
    assert (run / "config.yaml").read_text() == "seed: 1\n" and notes.read_text() == "mine"
    assert victim.read_text() == "VICTIM" and link.is_symlink()


def test_new_and_earlier_spec_are_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "job.sbatch"
    assert submit.main(["slurm", "--dry-run", "--output", str(out)]) == 0
    spec = capsys.readouterr().out
    assert out.read_text() == spec and spec.startswith("#!")
    out.write_text("stale")
    assert submit.main(["slurm", "--dry-run", "--output", str(out)]) == 0
    assert out.read_text() == spec
    assert [p.name for p in tmp_path.iterdir()] == ["job.sbatch"]  # no temporary file left
