"""The CLI's help pages, the not-implemented contract, light imports and the README's config reference."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[2]


def _run(*args):
    return subprocess.run([sys.executable, "-m", "rlvr.cli", *args], capture_output=True, text=True, timeout=120)


def test_top_level_help():
    out = _run("--help")
    assert out.returncode == 0
    for name in SUBCOMMANDS:
        assert name in out.stdout


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_subcommand_help(name):
    out = _run(name, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def test_train_help_shows_field_docstrings():
    out = _run("train", "--help")
    assert "--cluster.num-engines" in out.stdout
    assert "Generation engine actors" in out.stdout


def test_unknown_command_fails():
    out = _run("fly")
    assert out.returncode == 2 and "unknown command" in out.stderr


def test_import_config_is_light():
    code = (
        "import sys, rlvr, rlvr.config; bad=[m for m in ('torch','ray','vllm','deepspeed') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_readme_config_reference_is_current():
    from rlvr.config.reference import splice

    text = (ROOT / "README.md").read_text()
    assert splice(text) == text, (
        "README config reference is stale: run python -m rlvr.config.reference --write README.md"
    )


def test_public_api():
    import rlvr

    assert callable(rlvr.train) and callable(rlvr.load_config)
    assert rlvr.ExperimentConfig().generation.num_samples == 8
