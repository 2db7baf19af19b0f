"""`rlvr train` starts its Ray head with the `ray` CLI. Where Ray is only importable (an offline site-packages tree
on PYTHONPATH, as on the GPU hosts) there is no `ray` script: the head must still start (it failed with
FileNotFoundError: 'ray' on an H100 host before the fallback)."""

from __future__ import annotations

import subprocess
import sys

from rlvr.launch import local_cluster
from rlvr.launch.local_cluster import RAY_CLI_MODULE, ray_command


def test_ray_command_without_any_ray_script_runs_the_package_cli(tmp_path, monkeypatch) -> None:
    python = sys.executable
    monkeypatch.setattr(local_cluster.sys, "executable", str(tmp_path / "python3"))  # no `ray` beside it
    monkeypatch.setenv("PATH", str(tmp_path))  # and none on PATH
    cmd = ray_command()
    assert cmd == [str(tmp_path / "python3"), "-c", RAY_CLI_MODULE]
    # the fallback really is the ray CLI: run it with this interpreter
    monkeypatch.undo()
    out = subprocess.run([python, "-c", RAY_CLI_MODULE, "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ray, version" in out.stdout, out.stderr[-2000:]


def test_ray_command_prefers_the_script_beside_the_interpreter(tmp_path, monkeypatch) -> None:
    (tmp_path / "ray").write_text("#!/bin/sh\n")
    monkeypatch.setattr(local_cluster.sys, "executable", str(tmp_path / "python3"))
    assert ray_command() == [str(tmp_path / "ray")]
