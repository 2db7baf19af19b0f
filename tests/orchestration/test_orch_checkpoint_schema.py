"""Every JSON document read from a checkpoint is checked against its schema when it is loaded, before any field is
used: a tampered document whose manifest was regenerated (so it verifies) is refused with a message naming the file
and the field (exit 2 through `rlvr train` / `rlvr export`), never a traceback, never a wrong type taken as another
(`"step": true` as step 1). Also: a garbage safetensors file in a checkpoint and malformed weight-sync metadata.

Fast: checkpoints are made by hand (no run), `rlvr train` runs only up to its refusal, before Ray.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rlvr.orchestration.accounting import PromptLedger
from rlvr.orchestration.checkpoint import (
    CheckpointError,
    RunDir,
    read_driver_state,
    unsafe_content,
    verify_manifest,
    write_driver_state,
    write_manifest,
)
from rlvr.orchestration.request_codec import request_to_json
from rlvr.rollout import lora
from rlvr.types import PromptRequest, SamplingParams
from rlvr.weight_sync.gloo import decode_meta


def _driver_state(step: int) -> dict:
    """A driver state as `Trainer.save_checkpoint` writes one: a ledger with a prompt trained and one in flight
    (re-queued), and the prompt stream's position."""
    ledger = PromptLedger()
    for pid in ("ds:0:0", "ds:1:0"):
        ledger.pull(pid)
    ledger.finish("ds:0:0", "trained")
    req = PromptRequest("ds:1:0", [5, 6, 7], 4, SamplingParams(seed=3), {"ground_truth": "x", "row": 1}, False, "ab")
    stream = {
        "version": 1,
        "num_pulled": 2,
        "cursors": [[0, 2]],
        "counters": {"pulled": 2, "dropped_too_long": 0, "skipped_bad_row": 0},
        "datasets": [["ds", 10]],
        "shuffle_seed": 0,
    }
    return {
        "step": step,
        "ledger": ledger.state_dict(),
        "feeder": {"requeue": [request_to_json(req)], "stream": stream},
    }


def _checkpoint(run: RunDir, step: int, adapter: dict | None = None) -> Path:
    """A committed checkpoint of plain data (torch files weights-only, a complete driver state; a LoRA adapter
    config when `adapter` is given)."""
    tmp = run.tmp_checkpoint(step)
    (tmp / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 64}))
    lora.write_safetensors([("w", torch.ones(2, 2))], tmp / "model.safetensors")
    if adapter is not None:
        (tmp / lora.CONFIG_FILE).write_text(json.dumps(adapter))
    state = tmp / "trainer_state"
    state.mkdir()
    torch.save({"optimizer": {"state": {}, "param_groups": []}, "scheduler": {}}, state / "optimizer.pt")
    write_driver_state(state, _driver_state(step))
    return run.commit_checkpoint(tmp, step, keep_last=100)


def _tamper_driver(ckpt: Path, change) -> None:
    """Change driver.json as an attacker would, and regenerate the manifest so that it verifies."""
    path = ckpt / "trainer_state" / "driver.json"
    if isinstance(change, str):
        path.write_text(change)
    else:
        d = json.loads(path.read_text())
        change(d)
        path.write_text(json.dumps(d))
    write_manifest(ckpt, int(ckpt.name.split("_")[1]))


ADAPTER = {
    "peft_type": "LORA",
    "r": 4,
    "lora_alpha": 16,
    "lora_dropout": 0.0,
    "target_modules": ["q_proj", "v_proj"],
    "base_model_name_or_path": None,
    "rank_pattern": {},
    "alpha_pattern": {},
}


def test_a_complete_checkpoint_passes_and_reads_back(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    ckpt = _checkpoint(run, 2, adapter=ADAPTER)
    assert verify_manifest(ckpt) is None and unsafe_content(ckpt) is None
    assert read_driver_state(ckpt) == _driver_state(2)
    assert RunDir(tmp_path / "run").find_resume("auto") == ckpt


DRIVER_CASES = {
    # name: (change, what the message must name)
    "no_ledger": (lambda d: d.pop("ledger"), "no 'ledger'"),
    "ledger_str": (lambda d: d.__setitem__("ledger", "garbage"), "ledger must be a JSON object"),
    "ledger_state_list": (lambda d: d["ledger"].__setitem__("state", [1, 2, 3]), "ledger.state must be"),
    "ledger_bad_terminal": (lambda d: d["ledger"]["state"].__setitem__("ds:0:0", "won"), "ledger.state['ds:0:0']"),
    "ledger_in_flight_ints": (lambda d: d["ledger"].__setitem__("in_flight", [1]), "ledger.in_flight[0]"),
    "ledger_extra_float": (
        lambda d: d["ledger"]["extra_pulled"].__setitem__("skipped_bad_row", 1.5),
        "ledger.extra_pulled['skipped_bad_row']",
    ),
    "step_bool": (lambda d: d.__setitem__("step", True), "step must be an integer, got true"),
    "step_float": (lambda d: d.__setitem__("step", 2.0), "step must be an integer"),
    "step_negative": (lambda d: d.__setitem__("step", -5), "step must be >= 0"),
    "step_missing": (lambda d: d.pop("step"), "no 'step'"),
    "unknown_field": (lambda d: d.__setitem__("extra", 1), "unexpected field 'extra'"),
    "no_stream": (lambda d: d["feeder"].pop("stream"), "feeder has no 'stream'"),
    "stream_bad": (lambda d: d["feeder"].__setitem__("stream", {"nonsense": 1}), "feeder.stream has no"),
    "stream_cursor": (lambda d: d["feeder"]["stream"].__setitem__("cursors", [[0, "2"]]), "cursors[0][1]"),
    "requeue_not_list": (lambda d: d["feeder"].__setitem__("requeue", {}), "feeder.requeue must be a list"),
    "requeue_samples_bool": (
        lambda d: d["feeder"]["requeue"][0].__setitem__("num_samples", True),
        "feeder.requeue[0].num_samples",
    ),
    "requeue_token_str": (
        lambda d: d["feeder"]["requeue"][0].__setitem__("prompt_token_ids", ["5"]),
        "prompt_token_ids[0]",
    ),
    "requeue_unknown": (lambda d: d["feeder"]["requeue"][0].__setitem__("evil", 1), "unexpected field 'evil'"),
    "not_an_object": ("[1, 2]", "driver state must be a JSON object"),
    "temperature_nan": (None, "sampling.temperature must be a finite number, got NaN"),
    "nested_deep": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "not_utf8": (None, "unreadable"),
}


@pytest.mark.parametrize("case", sorted(DRIVER_CASES))
def test_a_tampered_driver_state_is_refused_naming_the_field(tmp_path, case):
    run = RunDir(tmp_path / "run")
    run.create()
    good = _checkpoint(run, 2)
    ckpt = _checkpoint(run, 4)
    change, expected = DRIVER_CASES[case]
    if case == "temperature_nan":
        text = json.dumps(_driver_state(4)).replace('"temperature": 1.0', '"temperature": NaN')
        assert "NaN" in text
        change = text
    elif case == "not_utf8":
        (ckpt / "trainer_state" / "driver.json").write_bytes(b'{"step": 4, "x": "\xff"}')
        write_manifest(ckpt, 4)
    if change is not None:
        _tamper_driver(ckpt, change)
    assert verify_manifest(ckpt) is None  # the manifest verifies: only the schema catches it
    with pytest.raises(CheckpointError) as err:
        read_driver_state(ckpt)
    assert "driver.json" in str(err.value) and expected in str(err.value), str(err.value)
    for resume in ("auto", str(ckpt)):  # the newest is refused, not skipped (the policy for unsafe content)
        with pytest.raises(CheckpointError, match="refused") as err:
            RunDir(tmp_path / "run").find_resume(resume)
        assert str(ckpt) in str(err.value) and expected in str(err.value)
    assert RunDir(tmp_path / "run").find_resume(str(good)) == good


def test_restore_checks_the_driver_state_before_the_learners_load(tmp_path):
    """The driver state is read and checked first: a bad one never reaches the learners (no ray.get)."""
    from rlvr.orchestration import driver

    run = RunDir(tmp_path / "run")
    run.create()
    ckpt = _checkpoint(run, 2)
    _tamper_driver(ckpt, lambda d: d.__setitem__("ledger", "garbage"))
    calls: list = []
    learner = SimpleNamespace(load=SimpleNamespace(remote=lambda *a: calls.append(a)))
    trainer = SimpleNamespace(actors=SimpleNamespace(learners=[learner]), timeout=1.0)
    with pytest.raises(CheckpointError, match="ledger must be a JSON object"):
        driver.Trainer.restore(trainer, ckpt)
    assert calls == []


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda m: m["files"]["config.json"].__setitem__("size", True), "MANIFEST.json unreadable"),
        (lambda m: m.__setitem__("files", []), "MANIFEST.json unreadable"),
        (lambda m: m["files"].__setitem__("a\x00b", {"size": 1, "sha256": "0"}), "unusable path"),
        (lambda m: m["files"].__setitem__("../../etc/passwd", {"size": 1, "sha256": "0"}), "outside the checkpoint"),
    ],
)
def test_a_malformed_manifest_is_a_reason_not_a_traceback(tmp_path, change, expected):
    run = RunDir(tmp_path / "run")
    run.create()
    good = _checkpoint(run, 2)
    ckpt = _checkpoint(run, 4)
    m = json.loads((ckpt / "MANIFEST.json").read_text())
    change(m)
    (ckpt / "MANIFEST.json").write_text(json.dumps(m))
    assert expected in (verify_manifest(ckpt) or "")
    assert RunDir(tmp_path / "run").find_resume("auto") == good  # auto falls back, as for other corruption


def test_a_model_config_that_is_not_an_object_is_refused(tmp_path):
    run = RunDir(tmp_path / "run")
    run.create()
    ckpt = _checkpoint(run, 2)
    for doc, expected in (("[1]", "config.json must be a JSON object"), ('{"hidden_size": "64"}', "hidden_size")):
        (ckpt / "config.json").write_text(doc)
        write_manifest(ckpt, 2)
        assert expected in (unsafe_content(ckpt) or "")


# ------------------------------------------------------------------------------------------ LoRA adapter config
ADAPTER_CASES = [
    ("r", float("inf"), "r must be a positive integer, got Infinity"),
    ("r", [4], "r must be a positive integer, got list"),
    ("r", 4.5, "r must be a positive integer, got 4.5"),
    ("r", "four", 'r must be a positive integer, got "four"'),
    ("r", True, "r must be a positive integer, got true"),
    ("r", 0, "r must be a positive integer, got 0"),
    ("lora_alpha", float("nan"), "lora_alpha must be a finite positive number"),
    ("lora_alpha", -1, "lora_alpha must be a finite positive number"),
    ("target_modules", [1], "target_modules must be a non-empty list"),
    ("target_modules", [], "target_modules must be a non-empty list"),
    ("lora_dropout", 2, "lora_dropout must be a number in [0, 1)"),
    ("base_model_name_or_path", 7, "base_model_name_or_path must be a path"),
    ("peft_type", "IA3", "peft_type must be"),
    ("rank_pattern", {"q_proj": 64}, "rank_pattern must be empty"),
]


@pytest.mark.parametrize("field, value, expected", ADAPTER_CASES, ids=[f"{c[0]}={c[1]!r}" for c in ADAPTER_CASES])
def test_a_bad_adapter_config_is_refused_naming_the_field(tmp_path, field, value, expected):
    run = RunDir(tmp_path / "run")
    run.create()
    ckpt = _checkpoint(run, 2, adapter={**ADAPTER, field: value})
    with pytest.raises(ValueError) as err:
        lora.read_adapter_config(ckpt)
    assert f"{lora.CONFIG_FILE}: {expected}" in str(err.value), str(err.value)
    with pytest.raises(ValueError, match="adapter_config.json"):
        lora.read_adapter_dir(ckpt)  # the learner's and engines' read
    with pytest.raises(CheckpointError, match="refused") as err:
        RunDir(tmp_path / "run").find_resume("auto")  # refused before any actor starts
    assert expected in str(err.value)


@pytest.mark.parametrize("r", ["Infinity", "[4]", "4.5"])
def test_export_refuses_a_bad_rank_with_exit_2(tmp_path, capsys, r):
    from rlvr.learner import export

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / lora.CONFIG_FILE).write_text(json.dumps(ADAPTER).replace('"r": 4', f'"r": {r}'))
    lora.write_safetensors([("w", torch.ones(2, 2))], ckpt / lora.WEIGHTS_FILE)
    assert export.main(["--merge", str(ckpt), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "adapter_config.json: r must be a positive integer" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------ weights, weight sync
def test_the_learner_reports_a_garbage_safetensors_file_by_name(tmp_path):
    """What the Ray learner raises (a ValueError naming the file), which `load_learners` turns into a
    CheckpointError (exit 2) instead of safetensors' own error type."""
    from rlvr.config import default_config, from_dict
    from rlvr.data import builtin_corpus
    from rlvr.learner.worker import LearnerWorker
    from rlvr.models.tiny import build_tiny_model_dir

    cfg = from_dict({"data": {"datasets": ["builtin:copy"]}}, base=default_config())
    model_dir = build_tiny_model_dir(cfg.model, builtin_corpus("copy"), tmp_path / "model", 0)
    w = LearnerWorker(cfg, str(model_dir), 0, 1, "127.0.0.1", 0, "cpu")
    state, hf = tmp_path / "state", tmp_path / "hf"
    w.save(str(state), str(hf), str(model_dir))
    (hf / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="model.safetensors: unreadable safetensors file"):
        w.load(str(state), str(hf))


def test_load_learners_maps_the_learners_refusal_to_a_checkpoint_error(tmp_path, monkeypatch):
    import ray

    from rlvr.orchestration import checkpoint

    cause = ValueError("/x/model.safetensors: unreadable safetensors file: header too large")
    monkeypatch.setattr(
        ray, "get", lambda *a, **k: (_ for _ in ()).throw(ray.exceptions.RayTaskError("load", "tb", cause))
    )
    learner = SimpleNamespace(load=SimpleNamespace(remote=lambda *a: None))
    with pytest.raises(CheckpointError, match="model.safetensors: unreadable"):
        checkpoint.load_learners([learner], tmp_path, 1.0)


@pytest.mark.parametrize(
    "payload",
    [
        b'[["w", "float32", [Infinity]]]',
        b'[["w", "float32", [NaN]]]',
        b'[["w", "float32", [4.5]]]',
        b'[["w", "float32", [true]]]',
        b'[["w", "float32", ["3"]]]',
        b'[["w", "float32", [1e400]]]',
        b'[["w", "float32", [4611686018427387904]]]',
        b'[["w", "float32"]]',
        b'[[1, "float32", [2]]]',
        b'[["w", "float32", 3]]',
        b"[" * 100_000 + b"]" * 100_000,
    ],
)
def test_gloo_metadata_with_a_bad_shape_is_a_value_error(payload):
    with pytest.raises(ValueError, match="metadata"):
        decode_meta(payload)


# ------------------------------------------------------------------------------------------ through `rlvr train`
def test_train_refuses_a_step_that_is_a_bool_and_changes_nothing(tmp_path):
    """The reported case: `"step": true` was resumed as step 1, step 2 retrained and its checkpoint replaced."""
    run = RunDir(tmp_path / "runs" / "r")
    run.create()
    (run.root / "config.yaml").write_text("num_steps: 3\n")
    _checkpoint(run, 1)
    ckpt = _checkpoint(run, 2)
    _tamper_driver(ckpt, lambda d: d.__setitem__("step", True))
    before = {str(p): p.read_bytes() for p in sorted(run.root.rglob("*")) if p.is_file() and p.name != "events.log"}
    cmd = [sys.executable, "-m", "rlvr.cli", "train", "--checkpoint.output-dir", str(tmp_path / "runs")]
    cmd += ["--logging.run-name", "r", "--num-steps", "3", "--logging.console-progress", "False"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "driver.json" in p.stderr and "step must be an integer, got true" in p.stderr
    assert "Traceback" not in p.stderr
    after = {str(p): p.read_bytes() for p in sorted(run.root.rglob("*")) if p.is_file() and p.name != "events.log"}
    assert after == before
