"""Kill the driver mid-run and resume: exact with async_steps=0 (plain torch, and 2 DeepSpeed ranks with ZeRO-2 and
ZeRO-3); prompt accounting holds with async_steps=1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlvr.config import from_dict, read_yaml

COMMON = [
    "--eval.every-n-steps",
    "0",
    "--eval.at-step-0",
    "False",
    "--logging.console-progress",
    "False",
    "--rollout.prompts-per-step",
    "4",
    "--generation.num-samples",
    "4",
    "--checkpoint.every-n-steps",
    "3",
    "--checkpoint.keep-last",
    "5",
    "--learner.lr",
    "1e-3",
    "--num-steps",
    "6",
]


def _cmd(out: Path, name: str, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rlvr.cli",
        "train",
        "--checkpoint.output-dir",
        str(out),
        "--logging.run-name",
        name,
        *COMMON,
        *extra,
    ]


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _run_and_kill_after(cmd: list[str], ckpt: Path) -> None:
    """Start the driver, SIGKILL it (no cleanup) as soon as checkpoint `ckpt` is complete."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 400
    try:
        while not (ckpt / "MANIFEST.json").exists():
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.time() < deadline, "checkpoint never appeared"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)


def _losses(run: Path) -> dict[int, float]:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        d = json.loads(line)
        if "loss/total" in d:
            out[d["step"]] = d["loss/total"]
    return out


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    if (ckpt / "adapter_model.safetensors").is_file():  # LoRA: the checkpoint holds only the adapter
        return load_file(str(ckpt / "adapter_model.safetensors"))
    return load_file(str(ckpt / "model.safetensors"))


DEEPSPEED_2_RANKS = ["--learner.backend", "deepspeed", "--cluster.num-learners", "2", "--learner.zero-stage"]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "learner",
    [
        [],
        DEEPSPEED_2_RANKS + ["2"],
        DEEPSPEED_2_RANKS + ["3", "--learner.zero3-gather-mb", "0.01"],
        ["--learner.lora-rank", "8", "--learner.lr", "1e-2"],
    ],
    ids=["torch", "deepspeed-zero2-2ranks", "deepspeed-zero3-2ranks", "torch-lora"],
)
def test_resume_is_exact_on_policy(tmp_path, ray_cluster, learner):
    """SIGKILL after step 3's checkpoint, resume: the same losses and final weights as an uninterrupted run (ZeRO-3
    saves and loads through parameter gathers on every rank; the GPU presets gpu-8x / gpu-2node train with it)."""
    extra = ["--rollout.async-steps", "0", "--cluster.num-engines", "1", *learner]
    _run(_cmd(tmp_path, "straight", extra))
    interrupted = _cmd(tmp_path, "killed", extra)
    _run_and_kill_after(interrupted, tmp_path / "killed" / "checkpoints" / "step_3")
    _run(interrupted)  # --checkpoint.resume auto picks step_3 up
    a, b = _losses(tmp_path / "straight"), _losses(tmp_path / "killed")
    assert sorted(a) == sorted(b) == [1, 2, 3, 4, 5, 6]
    for step in a:
        assert b[step] == pytest.approx(a[step], abs=1e-6), step
    wa = _weights(tmp_path / "straight" / "checkpoints" / "step_6")
    wb = _weights(tmp_path / "killed" / "checkpoints" / "step_6")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=1e-6, rtol=0)
    events = (tmp_path / "killed" / "events.log").read_text()
    assert "resumed from" in events and "step_3" in events


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_resume_async_keeps_prompt_accounting(tmp_path, ray_cluster):
    extra = ["--rollout.async-steps", "1", "--cluster.num-engines", "2"]
    cmd = _cmd(tmp_path, "async", extra)
    _run_and_kill_after(cmd, tmp_path / "async" / "checkpoints" / "step_3")
    _run(cmd)
    state = tmp_path / "async" / "checkpoints" / "step_6" / "trainer_state" / "driver.json"
    ledger = json.loads(state.read_text())["ledger"]
    states = ledger["state"]
    trained = [pid for pid, s in states.items() if s == "trained"]
    assert len(trained) == len(set(trained))
    assert set(states).isdisjoint(ledger["in_flight"])
    # none skipped: the pulled ids are exactly the first N ids of the (deterministic) prompt stream
    pulled = set(states) | set(ledger["in_flight"])
    from transformers import AutoTokenizer

    from rlvr.data import PromptStream

    cfg = from_dict(read_yaml(str(tmp_path / "async" / "config.yaml")))  # the run's own config: its stream
    tok = AutoTokenizer.from_pretrained(tmp_path / "async" / "builtin_model")
    stream = PromptStream(cfg, tok)
    expected = {stream.next_request().prompt_id for _ in range(len(pulled))}
    assert pulled == expected
    assert sum(1 for s in states.values() if s == "trained") >= 6 * 4 - 4  # 6 steps of B=4 (a step may filter)
