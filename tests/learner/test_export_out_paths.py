"""`rlvr export --merge CKPT OUT`: OUT must be new (or an empty directory) and outside CKPT; anything else exits 2
naming OUT before anything is loaded, leaving the checkpoint and any model directory byte-identical. The merged
model goes to a temporary directory beside OUT, renamed at the end: a failure leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.cli import main
from rlvr.learner import export
from rlvr.rollout import lora


def _snapshot(root: Path) -> dict[str, bytes | str]:
    return {
        str(p.relative_to(root)): (f"-> {p.readlink()}" if p.is_symlink() else p.read_bytes() if p.is_file() else "d")
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def fake_ckpt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkpoint-shaped directory whose base model is another directory; the merge itself must never start."""
    base = tmp_path / "base_model"
    base.mkdir()
    (base / "model.safetensors").write_bytes(b"BASE WEIGHTS")
    ckpt = tmp_path / "run" / "checkpoints" / "step_1"
    ckpt.mkdir(parents=True)
    (ckpt / lora.CONFIG_FILE).write_text(json.dumps({"r": 4, "base_model_name_or_path": str(base)}))
    (ckpt / "config.json").write_text("{}")

    def no_merge(*a: object, **k: object) -> None:
        raise AssertionError("the checkpoint was read before OUT was checked")

    monkeypatch.setattr(lora, "read_adapter_dir", no_merge)
    return ckpt


@pytest.mark.parametrize(
    "out_of",
    [
        lambda ckpt: ckpt,  # the checkpoint itself
        lambda ckpt: ckpt / "merged",  # inside it
        lambda ckpt: ckpt / "trainer_state" / "m",  # deeper inside it (missing parent too)
        lambda ckpt: ckpt.parents[2] / "base_model",  # the base model directory
        lambda ckpt: ckpt.parents[2] / "nodir" / "merged",  # a missing parent
        lambda ckpt: ckpt / "config.json",  # a file
        lambda ckpt: ckpt.parents[1],  # a non-empty directory (the run's checkpoints)
    ],
)
def test_export_refuses_an_out_it_must_not_write(
    fake_ckpt: Path, out_of, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = out_of(fake_ckpt)
    before = _snapshot(tmp_path)
    assert main(["export", "--merge", str(fake_ckpt), str(out)]) == 2
    assert f"OUT {out}" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before


def test_export_refuses_symlinked_out_and_out_inside_ckpt_through_a_symlink(
    fake_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    link = tmp_path / "link"
    link.symlink_to(empty)
    alias = tmp_path / "alias"
    alias.symlink_to(fake_ckpt)
    before = _snapshot(tmp_path)
    for out in (link, alias / "merged"):
        assert main(["export", "--merge", str(fake_ckpt), str(out)]) == 2
        assert f"OUT {out}" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before


@pytest.fixture(scope="module")
def adapter_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlvr.config import default_config, from_dict
    from rlvr.data import builtin_corpus
    from rlvr.learner.worker import LearnerWorker
    from rlvr.models.tiny import build_tiny_model_dir

    cfg = from_dict(
        {
            "learner": {"lora_rank": 4, "lora_alpha": 8, "backend": "torch", "lr": 1e-2, "warmup_steps": 0},
            "data": {"datasets": ["builtin:copy"]},
        },
        base=default_config(),
    )
    model_dir = str(build_tiny_model_dir(cfg.model, builtin_corpus("copy"), tmp_path_factory.mktemp("m"), cfg.seed))
    w = LearnerWorker(cfg, model_dir, 0, 1, "127.0.0.1", 0, "cpu", num_threads=1)
    ckpt = tmp_path_factory.mktemp("ck") / "step_1"
    w.save(str(ckpt / "trainer_state"), str(ckpt), model_dir)
    return ckpt


def test_export_into_an_empty_dir_and_a_failure_leaves_nothing(
    adapter_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _snapshot(adapter_ckpt)
    out = tmp_path / "merged"
    out.mkdir()  # an empty directory is fine (e.g. made by a job script)
    assert main(["export", "--merge", str(adapter_ckpt), str(out)]) == 0
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]  # no temporary directory left
    capsys.readouterr()

    def broken_copy(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(export.shutil, "copyfile", broken_copy)  # fails after the weights are written
    out2 = tmp_path / "merged2"
    assert main(["export", "--merge", str(adapter_ckpt), str(out2)]) == 2
    assert "disk full" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged"]  # neither out2 nor a temporary directory
    assert _snapshot(adapter_ckpt) == before
