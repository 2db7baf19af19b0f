"""`rlvr reward --output PATH`: the location is checked before any scoring (exit 2, the path named), the --input file
and a run's records are never overwritten, symlinks are not written through, and the output is written atomically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.rewards import cli
from rlvr.rewards.cli import RewardArgs, run_reward

ROW = {"completion": r"\boxed{4}", "ground_truth": "4"}


@pytest.fixture
def rows(tmp_path: Path) -> Path:
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps(ROW) + "\n")
    return src


def _args(src: Path, out: Path) -> RewardArgs:
    return RewardArgs(fn=["math"], input=str(src), output=str(out), num_workers=0)


def _refused_before_scoring(
    src: Path, out: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> str:
    def no_scoring(*a: object, **k: object) -> None:
        raise AssertionError("scored before the output location was checked")

    monkeypatch.setattr(cli, "_score", no_scoring)
    assert run_reward(_args(src, out)) == 2
    err = capsys.readouterr().err
    assert f"--output {out}" in err
    return err


def test_missing_or_bad_output_directory_exits_2_before_scoring(
    rows: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nodir" / "out.jsonl"
    assert "does not exist" in _refused_before_scoring(rows, missing, monkeypatch, capsys)
    assert not missing.parent.exists()
    _refused_before_scoring(rows, rows / "out.jsonl", monkeypatch, capsys)  # under a file
    _refused_before_scoring(rows, tmp_path, monkeypatch, capsys)  # a directory


def test_input_run_records_other_files_and_symlinks_are_not_overwritten(
    rows: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    original = rows.read_bytes()
    assert "input" in _refused_before_scoring(rows, rows, monkeypatch, capsys)
    alias = tmp_path / "alias.jsonl"
    alias.hardlink_to(rows)
    _refused_before_scoring(rows, alias, monkeypatch, capsys)
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    ckpt_file = run / "checkpoints" / "step_1" / "trainer_state" / "x.jsonl"
    ckpt_file.parent.mkdir(parents=True)
    ckpt_file.write_text("keep\n")
    for target in (run / "metrics.jsonl", ckpt_file):
        assert "run directory" in _refused_before_scoring(rows, target, monkeypatch, capsys)
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    _refused_before_scoring(rows, notes, monkeypatch, capsys)
    victim = tmp_path / "victim.jsonl"
    victim.write_text("VICTIM")
    link = tmp_path / "link.jsonl"
    link.symlink_to(victim)
    assert "symlink" in _refused_before_scoring(rows, link, monkeypatch, capsys)
    assert rows.read_bytes() == original and (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert ckpt_file.read_text() == "keep\n" and notes.read_text() == "mine" and victim.read_text() == "VICTIM"


def test_new_output_and_an_earlier_output_are_written(
    rows: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "scored.jsonl"
    assert run_reward(_args(rows, out)) == 0
    assert json.loads(out.read_text())["total"] == 1.0
    out.write_text("stale\n")
    assert run_reward(_args(rows, out)) == 0
    assert json.loads(out.read_text())["scores"] == {"math": 1.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl", "scored.jsonl"]  # no temporary file left


def test_a_failed_write_keeps_the_old_output(
    rows: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "scored.jsonl"
    out.write_text("old\n")
    real_dumps = json.dumps
    calls = []

    def failing_dumps(obj: object, **kw: object) -> str:
        calls.append(obj)
        if len(calls) == 2:  # the second row: the first is already written to the file
            raise OSError("disk full")
        return real_dumps(obj, **kw)  # type: ignore[arg-type]

    rows.write_text((json.dumps(ROW) + "\n") * 2)
    monkeypatch.setattr(cli.json, "dumps", failing_dumps)
    assert run_reward(_args(rows, out)) == 2
    monkeypatch.undo()
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl", "scored.jsonl"]
    assert "disk full" in capsys.readouterr().err
