"""A LoRA run end to end (issue 20): learner and engine on one host move only the adapter, through shared memory,
each step; the checkpoint holds the adapter in PEFT format, not the model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.timeout(400)
def test_lora_run_syncs_only_the_adapter_and_checkpoints_it(tmp_path, ray_cluster):
    cmd = [
        sys.executable,
        "-m",
        "rlvr.cli",
        "train",
        "--checkpoint.output-dir",
        str(tmp_path),
        "--logging.run-name",
        "lora",
        "--learner.lora-rank",
        "8",
        "--num-steps",
        "2",
        "--eval.every-n-steps",
        "0",
        "--eval.at-step-0",
        "False",
        "--logging.console-progress",
        "False",
        "--rollout.prompts-per-step",
        "4",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "lora"
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "time/sync" in s]
    ckpt = run / "checkpoints" / "step_2"
    adapter = (ckpt / "adapter_model.safetensors").stat().st_size
    model = sum(f.stat().st_size for f in Path(run / "builtin_model").glob("*.safetensors"))
    assert len(steps) == 2 and not (ckpt / "model.safetensors").exists()
    for s in steps:
        assert s["sync/bytes"] == adapter < model / 5  # the adapter's file, written once into shared memory
        assert s["sync/engine_load_s_max"] > 0
    assert json.loads((ckpt / "adapter_config.json").read_text())["r"] == 8
