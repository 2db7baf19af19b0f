"""The sandbox against the attack catalogue of bench/sandbox_attacks.py, in every mode this machine offers.

Reward hacks must score 0 under `code` and `code_binary` while an honest program scores 1; escape probes must
see and leave nothing. Root mode runs here; the user-namespace mode runs the whole catalogue as uid 65534
(setpriv), as a non-root trainer would; the rlimits fallback runs the hacks and the memory cap.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import sandbox_attacks as attacks  # noqa: E402

from rlvr.rewards.sandbox import LocalSandboxExecutor, SandboxLimits, isolation_level, memory_cap, set_default_executor  # noqa: E402
from rlvr.rewards.sandbox_confine import landlock_abi  # noqa: E402

LIMITS = SandboxLimits(test_timeout_s=5.0)
root_ns = pytest.mark.skipif(isolation_level() != "namespaces", reason="needs root and unshare (namespace isolation)")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to set up the mode or to switch to uid 65534)")


@pytest.fixture(scope="module")
def executor():
    ex = LocalSandboxExecutor(LIMITS)
    set_default_executor(ex)
    yield ex
    set_default_executor(None)


@pytest.fixture(scope="module")
def host():
    ctx = attacks.HostContext(tempfile.mkdtemp(prefix="rlvr-attacks-"))
    yield ctx
    ctx.close()


@root_ns
@pytest.mark.parametrize("name", list(attacks.HACKS))
def test_reward_hack_scores_zero(executor, name):
    assert attacks.run_hack(name) == {"contained": True, "scores": (0.0, 0.0)}


@root_ns
@pytest.mark.parametrize("task", ["assert", "stdio"])
def test_honest_solution_scores_one(executor, task):
    assert attacks.score(attacks.HONEST[task], task) == (1.0, 1.0)


@root_ns
@pytest.mark.parametrize("name", attacks.ESCAPE_NAMES)
def test_escape_contained_as_root(executor, host, name):
    result = attacks.run_escape(name, executor, host)
    assert result["contained"], result


@as_root
def test_hacks_score_zero_in_rlimits_mode():
    ex = LocalSandboxExecutor(LIMITS, level="rlimits", memory_cap_kind="rlimits")
    set_default_executor(ex)
    try:
        scores = {name: attacks.run_hack(name)["scores"] for name in attacks.HACKS}
        honest = [attacks.score(attacks.HONEST[t], t) for t in ("assert", "stdio")]
    finally:
        set_default_executor(None)
    escaped = {n: s for n, s in scores.items() if s != (0.0, 0.0)}
    if landlock_abi() == 0:  # README: rlimits without Landlock reads host files, this catalogue's source included
        escaped.pop("lookup_table_from_tests", None)
    assert escaped == {}
    assert honest == [(1.0, 1.0), (1.0, 1.0)]


@pytest.mark.parametrize("cap", ["detected", "rlimits"])
def test_memory_budget_holds_for_the_whole_sample(cap):
    """8 children of 400 MB each cannot all be alive: a cgroup OOM-kills them, or RLIMIT_NPROC stops the forks."""
    if cap == "detected" and memory_cap() == "rlimits":
        pytest.skip("no delegable cgroup here; the rlimits case covers the fallback")
    ex = LocalSandboxExecutor(LIMITS, memory_cap_kind=None if cap == "detected" else "rlimits")
    described = ex.describe()
    assert described["memory_cap"] == (memory_cap() if cap == "detected" else "rlimits")
    if described["memory_cap"] == "rlimits":
        assert described["num_processes"] * described["memory_bytes"] <= described["total_memory_bytes"]
    report = attacks._parse(ex.run_capture("import json\n" + attacks.MEMORY_BOMB))
    assert report is None or report["alive"] < 8, report
    assert ex.run(attacks.HONEST["assert"], ["assert add(2, 3) == 5"]) == [True]


def _nobody_python() -> str | None:
    """An interpreter uid 65534 can run, that imports this checkout and starts in a user namespace, or None."""
    candidates = [os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"]
    for python in candidates:
        if not os.path.exists(python):
            continue
        probe = subprocess.run(
            [
                "setpriv",
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                python,
                "-c",
                "import sys; sys.path.insert(0, sys.argv[1]); import rlvr.rewards.code_verifiers\n"
                "from rlvr.rewards.sandbox import isolation_level; print(isolation_level())",
                str(ROOT),
            ],
            capture_output=True,
            timeout=60,
            cwd="/",
        )
        if probe.returncode == 0 and probe.stdout.decode().split() == ["userns"]:
            return python
    return None


def _nobody_or_skip() -> str:
    """The interpreter to run as uid 65534 in user-namespace mode; skips where this host cannot."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    userns = subprocess.run(
        [
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "unshare",
            "--user",
            "--map-root-user",
            "true",
        ],
        capture_output=True,
        timeout=30,
    )
    if userns.returncode != 0:
        pytest.skip(f"the kernel forbids unprivileged user namespaces: {userns.stderr.decode().strip()}")
    python = _nobody_python()
    if python is None:
        pytest.skip("no Python interpreter that uid 65534 can run, imports this checkout and starts in a userns")
    return python


@as_root
def test_catalogue_as_unprivileged_user_in_user_namespace():
    python = _nobody_or_skip()
    home = tempfile.mkdtemp(prefix="rlvr-nobody-home-")
    os.chown(home, 65534, 65534)
    try:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "HF_TOKEN": "hf-fake-token"}
        proc = subprocess.run(
            [
                "setpriv",
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                python,
                str(ROOT / "bench" / "sandbox_attacks.py"),
            ],
            capture_output=True,
            timeout=500,
            env=env,
            cwd=home,
        )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    result = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert result["mode"] == "userns" and result["memory_cap"] == "rlimits", result
    assert result["not_contained"] == [] and result["attacks_contained"] == result["attacks_tried"], result
    assert result["honest_passed"] is True


THREADS = (
    "import threading\ndef started():\n    stop, n = threading.Event(), 0\n    try:\n"
    "        for _ in range(3):\n            threading.Thread(target=stop.wait).start()\n            n += 1\n    except RuntimeError:\n"
    "        pass\n    stop.set()\n    return n\n"
)
SUBPROCESS = (
    "import subprocess, sys\ndef child():\n    out = subprocess.run([sys.executable, '-c', 'print(7)'], "
    "capture_output=True)\n    return out.stdout.decode().strip()\n"
)
NOBODY_RUN = """import json, sys
sys.path.insert(0, sys.argv[1])
from rlvr.rewards.sandbox import LocalSandboxExecutor, SandboxLimits
ex = LocalSandboxExecutor(SandboxLimits(test_timeout_s=5.0))
threads, child = json.loads(sys.argv[2]), json.loads(sys.argv[3])
print(json.dumps({"describe": ex.describe(),
                  "threads": ex.run(threads, ["assert started() == 1"])
                             + ex.run(threads + "print(started())", [{"input": "", "output": "1"}]),
                  "child": ex.run(child, ["assert child() == '7'"])
                           + ex.run(child + "print(child())", [{"input": "", "output": "7"}])}))
"""


@as_root
def test_honest_threads_and_subprocess_in_user_namespace():
    """Run as uid 65534: RLIMIT_NPROC counts the unshare parent, the launcher and the judge too (same uid), so the
    program still gets exactly its own budget: 2 processes or threads of 512 MB, i.e. one thread or one child."""
    python = _nobody_or_skip()
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            python,
            "-c",
            NOBODY_RUN,
            str(ROOT),
            json.dumps(THREADS),
            json.dumps(SUBPROCESS),
        ],
        capture_output=True,
        timeout=300,
        cwd="/",
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    result = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    described = result["describe"]
    assert described["isolation"] == "userns" and described["num_processes"] == 2, described
    assert result["threads"] == [True, True], result  # one extra thread starts, a second one does not
    assert result["child"] == [True, True], result
