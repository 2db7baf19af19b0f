"""`rlvr dashboard --export PATH` never replaces what is not an earlier report: a run's records, a directory, a
non-HTML file, a report inside a run directory, a symlink (or what it points to), a missing directory; it writes
atomically and a re-export of a report outside the run directories replaces it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlvr.cli import main as rlvr_main
from rlvr.telemetry import dashboard

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run_tiny"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "r"
    shutil.copytree(FIXTURE, run)
    (run / "run.json").write_text('{"status": "finished"}\n')
    return run


def _snapshot(root: Path) -> dict[str, bytes | str]:
    out: dict[str, bytes | str] = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = f"-> {p.readlink()}" if p.is_symlink() else p.read_bytes() if p.is_file() else "dir"
    return out


def _refused(argv: list[str], path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    before = _snapshot(tmp_path)
    assert rlvr_main(argv) == 2
    err = capsys.readouterr().err
    assert f"--export {path}" in err
    assert _snapshot(tmp_path) == before  # nothing written, created or left behind
    return err


def test_export_refuses_the_runs_own_files(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("metrics.jsonl", "config.yaml", "run.json"):
        if (run / name).exists():
            err = _refused(["dashboard", str(run), "--export", str(run / name)], run / name, tmp_path, capsys)
            assert "refusing to overwrite" in err
    # an earlier report inside a run directory is not replaced either (run directories are the run's)
    (run / "report.html").write_text("<html>old</html>")
    _refused(["dashboard", str(run), "--export", str(run / "report.html")], run / "report.html", tmp_path, capsys)


def test_export_refuses_non_report_files_dirs_symlinks_and_missing_dirs(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("mine")
    _refused(["dashboard", str(run), "--export", str(other)], other, tmp_path, capsys)
    _refused(["dashboard", str(run), "--export", str(run)], run, tmp_path, capsys)
    victim = tmp_path / "victim.html"
    victim.write_text("VICTIM")
    link = tmp_path / "link.html"
    link.symlink_to(victim)
    assert "symlink" in _refused(["dashboard", str(run), "--export", str(link)], link, tmp_path, capsys)
    dangling = tmp_path / "dangling.html"
    dangling.symlink_to(tmp_path / "nowhere.html")
    _refused(["dashboard", str(run), "--export", str(dangling)], dangling, tmp_path, capsys)
    missing = tmp_path / "nodir" / "r.html"
    assert "does not exist" in _refused(["dashboard", str(run), "--export", str(missing)], missing, tmp_path, capsys)
    under_file = other / "r.html"
    _refused(["dashboard", str(run), "--export", str(under_file)], under_file, tmp_path, capsys)
    assert victim.read_text() == "VICTIM" and not (tmp_path / "nowhere.html").exists()


def test_export_writes_new_and_replaces_an_earlier_report(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.html"
    assert rlvr_main(["dashboard", str(run), "--export", str(out)]) == 0
    first = out.read_text()
    assert "/*__RLVR_DATA__*/null" not in first
    out.write_text("<html>stale</html>")
    assert rlvr_main(["dashboard", str(run), "--export", str(out)]) == 0
    assert out.read_text() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "runs"]  # no temporary file left


def test_a_failed_write_keeps_the_old_report(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "report.html"
    out.write_text("<html>old</html>")

    def broken(data: object, refresh_s: float = 2.0) -> str:
        return "<html>" + "x" * 100_000 + "\ud800"  # fails to encode part way through the write

    monkeypatch.setattr(dashboard, "render_page", broken)
    assert rlvr_main(["dashboard", str(run), "--export", str(out)]) == 2
    assert out.read_text() == "<html>old</html>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html", "runs"]
