"""Checkpoints are data: a code-running pickle in any checkpoint file is refused, before and during loading, and
never runs; corrupt checkpoints never cause a silent fresh start; pruning keeps the last verified checkpoint.

Fast: RunDir, the pre-load scan and the learner's loads are exercised directly (a real torch learner in this
process, a real DeepSpeed learner in a subprocess); `rlvr train` is run only up to its refusal, before Ray.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlvr.config import default_config, from_dict
from rlvr.orchestration.checkpoint import CheckpointError, RunDir, unsafe_content, write_driver_state, write_manifest
from rlvr.weight_sync.gloo import decode_meta, encode_meta


class Payload:
    """Unpickling this creates `marker`: the proof that loading ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple:
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def _fake_checkpoint(run: RunDir, step: int, hidden: int = 64, model_config: dict | None = None) -> Path:
    """A checkpoint as rlvr writes one (model config, weights-only torch state, driver JSON), committed."""
    tmp = run.tmp_checkpoint(step)
    (tmp / "config.json").write_text(json.dumps(model_config or {"model_type": "qwen2", "hidden_size": hidden}))
    (tmp / "model.safetensors").write_bytes(os.urandom(256))
    state = tmp / "trainer_state"
    state.mkdir()
    torch.save(
        {"optimizer": {"state": {}, "param_groups": []}, "scheduler": {"last_epoch": step}}, state / "optimizer.pt"
    )
    torch.save(
        {"torch": torch.get_rng_state(), "python": [3, [1, 2, 3], None], "version": step, "skipped": 0},
        state / "rng_rank0.pt",
    )
    from rlvr.orchestration.accounting import PromptLedger

    stream = {
        "version": 1,
        "num_pulled": 0,
        "cursors": [[0, 0]],
        "datasets": [["ds", 10]],
        "shuffle_seed": 0,
        "counters": {"pulled": 0, "dropped_too_long": 0, "skipped_bad_row": 0},
    }
    driver = {"step": step, "ledger": PromptLedger().state_dict(), "feeder": {"requeue": [], "stream": stream}}
    write_driver_state(state, driver)
    return run.commit_checkpoint(tmp, step, keep_last=100)


def _corrupt(ckpt: Path) -> None:
    f = ckpt / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[0] ^= 0xFF
    f.write_bytes(bytes(data))


# ----------------------------------------------------------------------------------------- scan before load
@pytest.mark.parametrize("target", ["driver_pkl", "optimizer", "rng", "not_a_torch_file", "driver_json_pickled"])
def test_code_in_any_checkpoint_file_is_refused_and_never_runs(tmp_path, target):
    run = RunDir(tmp_path / "run")
    run.create()
    ckpt = _fake_checkpoint(run, 2)
    marker = tmp_path / "marker"
    state = ckpt / "trainer_state"
    if target == "driver_pkl":  # the old format, or an attacker's: a pickled driver state
        (state / "driver.pkl").write_bytes(pickle.dumps(Payload(marker)))
    elif target == "optimizer":
        torch.save({"optimizer": Payload(marker)}, state / "optimizer.pt")
    elif target == "rng":
        torch.save({"torch": torch.get_rng_state(), "python": Payload(marker)}, state / "rng_rank0.pt")
    elif target == "not_a_torch_file":
        (state / "optimizer.pt").write_bytes(pickle.dumps(Payload(marker)))
    else:
        (state / "driver.json").write_bytes(pickle.dumps(Payload(marker)))
    write_manifest(ckpt, 2)  # the attacker regenerates the manifest: it verifies
    with pytest.raises(CheckpointError, match="refused") as err:
        RunDir(tmp_path / "run").find_resume("auto")
    assert str(ckpt) in str(err.value) and "--checkpoint.resume never" in str(err.value)
    with pytest.raises(CheckpointError, match="refused"):
        RunDir(tmp_path / "run").find_resume(str(ckpt))  # an explicit path is scanned too
    assert not marker.exists()


def test_checkpoint_of_plain_data_passes_the_scan(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    ckpt = _fake_checkpoint(run, 2)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    torch.save(
        {"optimizer": opt.state_dict(), "scheduler": sched.state_dict()}, ckpt / "trainer_state" / "optimizer.pt"
    )
    write_manifest(ckpt, 2)
    assert unsafe_content(ckpt) is None
    assert RunDir(tmp_path / "run").find_resume("auto") == ckpt


# ----------------------------------------------------------------------------------- the learner's own loads
def test_torch_learner_loads_weights_only(tmp_path):
    """A real learner saves and loads (weights-only); the same load refuses a crafted optimizer or RNG file."""
    from rlvr.data import builtin_corpus
    from rlvr.learner.worker import LearnerWorker
    from rlvr.models.tiny import build_tiny_model_dir

    cfg = from_dict({"data": {"datasets": ["builtin:copy"]}}, base=default_config())
    model_dir = build_tiny_model_dir(cfg.model, builtin_corpus("copy"), tmp_path / "model", 0)
    w = LearnerWorker(cfg, str(model_dir), 0, 1, "127.0.0.1", 0, "cpu")
    state, hf = tmp_path / "state", tmp_path / "hf"
    w.version = 7
    w.save(str(state), str(hf), str(model_dir))
    w.version = 0
    w.load(str(state), str(hf))
    assert w.version == 7
    marker = tmp_path / "marker"
    good = (state / "optimizer.pt").read_bytes()
    torch.save({"optimizer": Payload(marker), "scheduler": {}}, state / "optimizer.pt")
    with pytest.raises(ValueError, match="refused"):
        w.load(str(state), str(hf))
    (state / "optimizer.pt").write_bytes(good)
    torch.save(
        {"torch": torch.get_rng_state(), "python": Payload(marker), "version": 1, "skipped": 0}, state / "rng_rank0.pt"
    )
    with pytest.raises(ValueError, match="refused"):
        w.load(str(state), str(hf))
    assert not marker.exists()


DEEPSPEED_SCRIPT = textwrap.dedent("""
    import sys, torch
    from pathlib import Path
    from rlvr.config import default_config, from_dict
    from rlvr.data import builtin_corpus
    from rlvr.models.tiny import build_tiny_model_dir
    from rlvr.learner.worker import LearnerWorker

    out, port, stage, marker = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    cfg = from_dict({"learner": {"backend": "deepspeed", "zero_stage": stage},
                     "data": {"datasets": ["builtin:copy"]}}, base=default_config())
    model_dir = build_tiny_model_dir(cfg.model, builtin_corpus("copy"), out / "model", 0)
    w = LearnerWorker(cfg, str(model_dir), 0, 1, "127.0.0.1", port, "cpu")
    w.save(str(out / "state"), str(out / "hf"), str(model_dir))
    w.load(str(out / "state"), str(out / "hf"))  # DeepSpeed's own files load weights-only
    print("LOADED", flush=True)

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({marker!r}, 'w').write('pwned')",))

    optim = next((out / "state" / "deepspeed" / "state").glob("*optim_states.pt"))
    sd = torch.load(optim, weights_only=False)
    sd["evil"] = Payload()
    torch.save(sd, optim)
    try:
        w.load(str(out / "state"), str(out / "hf"))
        print("NOT REFUSED", flush=True)
    except ValueError as e:
        print("REFUSED", e, flush=True)
    torch.distributed.destroy_process_group()
""")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_learner_loads_weights_only(tmp_path, stage):
    """DeepSpeed 0.19.8 reads its checkpoint files with torch.load(weights_only=False); rlvr swaps in the
    weights-only loader (plus DeepSpeed's three record classes): its own ZeRO-2/3 files load, a crafted one is
    refused and runs nothing."""
    from rlvr.launch.local_cluster import free_port

    marker = tmp_path / "marker"
    p = subprocess.run(
        [sys.executable, "-c", DEEPSPEED_SCRIPT, str(tmp_path), str(free_port()), str(stage), str(marker)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert "LOADED" in p.stdout, p.stderr[-3000:]
    assert "REFUSED" in p.stdout and "optim_states.pt" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    assert not marker.exists()


def test_gloo_metadata_is_json_and_a_pickle_is_refused(tmp_path):
    meta = [
        ("model.embed.weight", torch.bfloat16, (13, 64)),
        ("model.norm.weight", torch.float32, (64,)),
        ("scalar", torch.int64, ()),
    ]
    assert decode_meta(encode_meta(meta)) == meta
    marker = tmp_path / "marker"
    for bad in (pickle.dumps(Payload(marker)), b'[["x", "object", [1]]]', b'[["x", "float32", [-1]]]', b"{}"):
        with pytest.raises(ValueError, match="metadata"):
            decode_meta(bad)
    assert not marker.exists()


# ---------------------------------------------------------------------------------- corrupt checkpoints
def test_all_checkpoints_corrupt_is_an_error_naming_them(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    for step in (2, 4):
        _corrupt(_fake_checkpoint(run, step))
    with pytest.raises(CheckpointError) as err:
        RunDir(tmp_path / "run").find_resume("auto")
    msg = str(err.value)
    assert "none is usable" in msg and "step_2" in msg and "step_4" in msg and "checksum mismatch" in msg
    assert "--checkpoint.resume never" in msg and "--logging.run-name" in msg
    assert RunDir(tmp_path / "run").find_resume("never") is None


def test_newest_corrupt_falls_back_to_the_previous(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    _fake_checkpoint(run, 2)
    _corrupt(_fake_checkpoint(run, 4))
    assert RunDir(tmp_path / "run").find_resume("auto").name == "step_2"


def test_pruning_never_deletes_the_last_verified_checkpoint(tmp_path):
    """The reported loss: resume from step_2 (step_4 corrupt), save step_6 with keep_last 2: step_4 must not
    count as kept, step_2 must survive; only once 2 newer verified checkpoints exist do the older ones go."""
    run = RunDir(tmp_path / "run")
    run.create()
    _fake_checkpoint(run, 2)
    _corrupt(_fake_checkpoint(run, 4))
    resumed = RunDir(tmp_path / "run")
    assert resumed.find_resume("auto").name == "step_2"
    tmp = resumed.tmp_checkpoint(6)
    (tmp / "x").write_text("6")
    resumed.commit_checkpoint(tmp, 6, keep_last=2)
    assert [p.name for p in resumed.complete_checkpoints()] == ["step_2", "step_4", "step_6"]
    tmp = resumed.tmp_checkpoint(8)
    (tmp / "x").write_text("8")
    resumed.commit_checkpoint(tmp, 8, keep_last=2)
    assert [p.name for p in resumed.complete_checkpoints()] == ["step_6", "step_8"]
    tmp = resumed.tmp_checkpoint(10)
    (tmp / "x").write_text("10")
    resumed.commit_checkpoint(tmp, 10, keep_last=1)
    assert [p.name for p in resumed.complete_checkpoints()] == ["step_10"]


def test_pruning_after_a_resume_does_not_hash_old_checkpoints(tmp_path, monkeypatch):
    """Hashing every kept multi-GB checkpoint stalled the driver for minutes: after a resume, pruning trusts the
    checkpoint resume verified and checks the others' manifests by file sizes only."""
    from rlvr.orchestration import checkpoint

    run = RunDir(tmp_path / "run")
    run.create()
    for step in (2, 4, 6):
        _fake_checkpoint(run, step)
    (run.ckpts / "step_4" / "model.safetensors").write_bytes(b"short")  # truncated: fails the cheap check
    resumed = RunDir(tmp_path / "run")
    assert resumed.find_resume("auto").name == "step_6"
    hashed: list[Path] = []
    real = checkpoint._sha256
    monkeypatch.setattr(checkpoint, "_sha256", lambda p: hashed.append(Path(p)) or real(p))
    tmp = resumed.tmp_checkpoint(8)
    (tmp / "x").write_text("8")
    resumed.commit_checkpoint(tmp, 8, keep_last=3)
    assert {p.relative_to(run.ckpts).parts[0] for p in hashed} == {".tmp_step_8"}  # only the new one's manifest
    assert [p.name for p in resumed.complete_checkpoints()] == ["step_2", "step_4", "step_6", "step_8"]
    tmp = resumed.tmp_checkpoint(10)
    (tmp / "x").write_text("10")
    resumed.commit_checkpoint(tmp, 10, keep_last=3)
    assert [p.name for p in resumed.complete_checkpoints()] == ["step_6", "step_8", "step_10"]


def test_pruning_never_deletes_the_newest_checkpoint_this_process_verified(tmp_path):
    """Newer checkpoints that pass the cheap size check but were never verified (bytes flipped in place) do not
    push out the newest one this process verified."""
    run = RunDir(tmp_path / "run")
    run.create()
    for step in (2, 4, 6):
        ckpt = _fake_checkpoint(run, step)
        if step > 2:
            _corrupt(ckpt)
    other = RunDir(tmp_path / "run")
    assert other.verified(run.ckpts / "step_2") is None  # this process verified only step_2
    other._prune(keep_last=1)
    assert [p.name for p in other.complete_checkpoints()] == ["step_2", "step_4", "step_6"]


# ------------------------------------------------------------------------------------ through `rlvr train`
def _train(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "rlvr.cli",
        "train",
        "--checkpoint.output-dir",
        str(tmp_path / "runs"),
        "--logging.run-name",
        "r",
        "--num-steps",
        "2",
        "--logging.console-progress",
        "False",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "events.log"
    }


def test_train_refuses_a_malicious_checkpoint_before_anything_runs(tmp_path):
    run = RunDir(tmp_path / "runs" / "r")
    run.create()
    (run.root / "config.yaml").write_text("num_steps: 2\n")
    (run.root / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    ckpt = _fake_checkpoint(run, 2)
    marker = tmp_path / "marker"
    torch.save({"optimizer": Payload(marker)}, ckpt / "trainer_state" / "optimizer.pt")
    write_manifest(ckpt, 2)
    before = _snapshot(run.root)
    p = _train(tmp_path)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "refused" in p.stderr and "optimizer.pt" in p.stderr and "builtins.exec" in p.stderr
    assert "Traceback" not in p.stderr
    assert not marker.exists()
    assert _snapshot(run.root) == before


def test_train_stops_when_every_checkpoint_is_corrupt_and_changes_nothing(tmp_path):
    run = RunDir(tmp_path / "runs" / "r")
    run.create()
    (run.root / "config.yaml").write_text("num_steps: 2\n")
    (run.root / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4}\n')
    for step in (2, 4):
        _corrupt(_fake_checkpoint(run, step))
    before = _snapshot(run.root)
    p = _train(tmp_path)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "none is usable" in p.stderr and "step_2" in p.stderr and "step_4" in p.stderr
    assert "--checkpoint.resume never" in p.stderr
    assert _snapshot(run.root) == before


def test_train_refuses_a_checkpoint_of_another_model_shape_before_writing(tmp_path):
    run = RunDir(tmp_path / "runs" / "r")
    run.create()
    (run.root / "config.yaml").write_text("original\n")
    _fake_checkpoint(run, 2, hidden=64)
    before = _snapshot(run.root)
    p = _train(tmp_path, "--model.tiny-hidden-size", "32")
    assert p.returncode == 2, p.stderr[-2000:]
    assert "hidden_size 64 in the checkpoint, 32 in the config" in p.stderr and "Traceback" not in p.stderr
    assert _snapshot(run.root) == before  # config.yaml not overwritten


def test_train_refuses_a_checkpoint_of_another_tiny_vocabulary_before_writing(tmp_path):
    """`builtin:tiny` with another --model.tiny-vocab-size has the same shape but another vocabulary: refused
    before anything starts (it used to pass and fail in load_state_dict after Ray started, exit 1)."""
    from rlvr.models.tiny import build_tiny_model_dir
    from rlvr.orchestration.run_dirs import check_compatible, tiny_model_corpus

    cfg = from_dict({"logging": {"run_name": "r"}}, base=default_config())
    model = build_tiny_model_dir(cfg.model, tiny_model_corpus(cfg), tmp_path / "model", cfg.seed)
    saved = json.loads((model / "config.json").read_text())
    run = RunDir(tmp_path / "runs" / "r")
    run.create()
    (run.root / "config.yaml").write_text("original\n")
    ckpt = _fake_checkpoint(run, 2, model_config=saved)
    check_compatible(cfg, ckpt)  # the vocabulary it was built with passes
    other = from_dict({"model": {"tiny_vocab_size": 64}}, base=cfg)
    with pytest.raises(CheckpointError, match="vocab_size") as err:
        check_compatible(other, ckpt)
    assert f"vocab_size {saved['vocab_size']} in the checkpoint" in str(err.value)
    before = _snapshot(run.root)
    p = _train(tmp_path, "--model.tiny-vocab-size", "64")
    assert p.returncode == 2, p.stderr[-2000:]
    assert "vocab_size" in p.stderr and "Traceback" not in p.stderr
    assert _snapshot(run.root) == before


def test_restore_maps_a_load_time_size_mismatch_to_a_checkpoint_error(tmp_path, monkeypatch):
    """Second line of defence: a learner's load_state_dict size mismatch (RuntimeError) is a CheckpointError
    (exit 2, a message naming the checkpoint), not a traceback. ray.get is stubbed: no Ray is started."""
    from types import SimpleNamespace

    import ray

    from rlvr.orchestration import driver

    run = RunDir(tmp_path / "run")
    run.create()
    ckpt = _fake_checkpoint(run, 2)
    mismatch = RuntimeError(
        "Error(s) in loading state_dict for Qwen2ForCausalLM:\n\tsize mismatch for "
        "model.embed_tokens.weight: copying a param with shape torch.Size([14, 64]) from "
        "checkpoint, the shape in current model is torch.Size([64, 64])."
    )

    def fail(*args, **kwargs):
        raise ray.exceptions.RayTaskError("load", "Traceback (remote)", mismatch)

    monkeypatch.setattr(driver.ray, "get", fail)
    learner = SimpleNamespace(load=SimpleNamespace(remote=lambda *a: None))
    trainer = SimpleNamespace(actors=SimpleNamespace(learners=[learner]), timeout=1.0)
    with pytest.raises(CheckpointError, match="size mismatch") as err:
        driver.Trainer.restore(trainer, ckpt)
    assert str(ckpt) in str(err.value) and "--checkpoint.resume never" in str(err.value)
    other = RuntimeError("NCCL error")  # anything else stays a failure with its traceback
    monkeypatch.setattr(
        driver.ray, "get", lambda *a, **k: (_ for _ in ()).throw(ray.exceptions.RayTaskError("load", "tb", other))
    )
    with pytest.raises(ray.exceptions.RayTaskError):
        driver.Trainer.restore(trainer, ckpt)
