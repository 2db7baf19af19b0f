"""Presets load, validate, dump and reload to an equal config; the code default equals tiny-cpu.yaml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlvr.config import default_config, from_dict, load_config, to_yaml

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted((ROOT / "configs").glob("*.yaml"))


def test_presets_exist():
    names = {p.name for p in PRESETS}
    assert {"tiny-cpu.yaml", "gpu-1x-colocate.yaml", "gpu-2x.yaml", "gpu-8x.yaml", "gpu-2node.yaml"} <= names


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_preset_round_trip_via_dry_run(path, tmp_path):
    cfg = load_config(path)
    out = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", "--config", str(path), "--dry-run"],
        capture_output=True,
        text=True,
        check=True,
    )
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(out.stdout)
    assert load_config(dumped) == cfg
    assert from_dict(yaml.safe_load(to_yaml(cfg))) == cfg


def test_code_default_equals_tiny_cpu_yaml():
    assert load_config(ROOT / "configs" / "tiny-cpu.yaml") == default_config()


def test_cli_override_applies_over_preset(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr.cli",
            "train",
            "--config",
            str(ROOT / "configs/gpu-8x.yaml"),
            "--cluster.num-engines",
            "1",
            "--learner.lr",
            "2e-6",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    d = yaml.safe_load(out.stdout)
    assert d["cluster"]["num_engines"] == 1 and d["cluster"]["num_learners"] == 6
    assert d["learner"]["lr"] == 2e-6 and d["learner"]["zero_stage"] == 3
