"""Code executors: run a program against tests and say which passed. Local sandbox (default) or remote service.

Tests are a list whose items are either `{"input": str, "output": str}` (stdin/stdout case: the program runs
once per case; passed when it exits 0 and its stdout equals `output` up to whitespace) or a string of Python
code run after the program in the same namespace (assert-based: passed when it raises nothing).

`LocalSandboxExecutor` isolation, strongest available (`isolation_level()` says which):
- "namespaces" (root and `unshare` works): the launcher (sandbox_launcher.py) runs in new pid, net, mount,
  ipc and uts namespaces with a private /tmp; untrusted code runs as uid/gid 65534 with rlimits.
- "userns" (not root, unprivileged user namespaces allowed): the same namespaces inside a user namespace; the
  code keeps our (unprivileged) uid.
- "rlimits" (neither): rlimits, a fresh session and, as root, uid 65534; the scratch dir is a host temp dir
  removed afterwards. Weaker: no network or filesystem isolation.
Limits (`SandboxLimits`): per-test wall and CPU time, address space, file size, process count, output size.

`RemoteExecutor` posts JSON to a user's sandbox service (stdlib urllib): request
`{"program": str, "tests": [...], "max_execution_time": float}`, response `{"results": [0/1 or bool, ...]}`
(open-instruct's code API shape; `"passed"` is accepted for `"results"`).

Invariants: `run` never raises for anything the program does; it returns one bool per test (all False
when the sandbox itself failed) and the sandbox's processes and scratch dir are gone when it returns.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any, Protocol

NOBODY = 65534
_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_launcher.py")
_NS_FLAGS = ["--pid", "--net", "--mount", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc"]


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed program run."""

    test_timeout_s: float = 4.0  # wall and CPU seconds per test (the whole assert suite gets (n+1) x this)
    memory_bytes: int = 512 * 1024 * 1024  # RLIMIT_AS of each process
    file_size_bytes: int = 16 * 1024 * 1024  # RLIMIT_FSIZE: largest file it may write (stdout included)
    num_processes: int = 32  # RLIMIT_NPROC for the sandbox uid
    max_output_bytes: int = 1024 * 1024  # stdout read back for comparison
    tmp_size_mb: int = 64  # size of the private /tmp (namespace modes)


class CodeExecutor(Protocol):
    """Runs `program` against `tests`; returns one bool per test. Must not raise for bad programs."""

    def run(self, program: str, tests: list[Any]) -> list[bool]: ...


@functools.cache
def isolation_level() -> str:
    """"namespaces", "userns" or "rlimits": the strongest isolation that works here (cached)."""
    if shutil.which("unshare") is None:
        return "rlimits"
    flags = _NS_FLAGS if os.geteuid() == 0 else ["--user", "--map-root-user", *_NS_FLAGS]
    try:
        probe = subprocess.run(["unshare", *flags, "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "rlimits"
    if probe.returncode != 0:
        return "rlimits"
    return "namespaces" if os.geteuid() == 0 else "userns"


def _world_traversable(path: str) -> bool:
    parts = os.path.realpath(path).strip("/").split("/")
    return all(os.stat("/" + "/".join(parts[:i])).st_mode & 0o001 for i in range(1, len(parts)))


class LocalSandboxExecutor:
    """The default executor: runs programs locally in `sandbox_launcher.py` (module docstring)."""

    def __init__(self, limits: SandboxLimits | None = None, python: str | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self.level = isolation_level()
        base = os.path.realpath(sys.executable)
        if python is None and self.level == "rlimits" and os.geteuid() == 0 and not _world_traversable(base):
            python = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")  # uid 65534 must reach it
        self.python = python or base

    def run(self, program: str, tests: list[Any]) -> list[bool]:
        """One bool per test; all False if the sandbox failed or ran out of time."""
        if not tests:
            return []
        namespaced = self.level in ("namespaces", "userns")
        drop_uid = NOBODY if os.geteuid() == 0 else None
        scratch_parent = None
        if namespaced:
            workdir = "/tmp/work"
            prefix = ["unshare", *_NS_FLAGS] if self.level == "namespaces" else \
                ["unshare", "--user", "--map-root-user", *_NS_FLAGS]
            if self.level == "userns":
                drop_uid = None  # only our own uid is mapped in the user namespace
        else:
            scratch_parent = tempfile.mkdtemp(prefix="rlvr-sandbox-")
            os.chmod(scratch_parent, 0o711)  # uid 65534 may enter its workdir but not list the parent
            workdir = os.path.join(scratch_parent, "work")
            os.mkdir(workdir, 0o700)
            prefix = []
        job = {"program": program, "tests": tests, "limits": asdict(self.limits), "python": self.python,
               "workdir": workdir, "drop_uid": drop_uid, "namespaced": namespaced}
        num_runs = sum(isinstance(t, dict) for t in tests) + (len(tests) + 1) * any(isinstance(t, str) for t in tests)
        deadline = self.limits.test_timeout_s * (num_runs + 1) + 10.0
        try:
            proc = subprocess.run([*prefix, os.path.realpath(sys.executable), "-I", "-S", _LAUNCHER],
                                  input=json.dumps(job).encode(), capture_output=True, timeout=deadline)
            passed = json.loads(proc.stdout)["passed"]
            return [bool(p) for p in passed][:len(tests)] + [False] * max(0, len(tests) - len(passed))
        except (OSError, ValueError, KeyError, TypeError, subprocess.TimeoutExpired):
            # Trust boundary: whatever went wrong in the sandbox, the program passed nothing.
            return [False] * len(tests)
        finally:
            if scratch_parent is not None:
                subprocess.run(["rm", "-rf", "--one-file-system", scratch_parent], capture_output=True, timeout=60)


class RemoteExecutor:
    """Posts program and tests to a sandbox service (module docstring for the JSON shapes)."""

    def __init__(self, url: str, timeout_s: float = 30.0, max_execution_time: float = 4.0) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.max_execution_time = max_execution_time

    def run(self, program: str, tests: list[Any]) -> list[bool]:
        """One bool per test; all False when the service fails or answers malformed JSON."""
        if not tests:
            return []
        body = json.dumps({"program": program, "tests": tests, "max_execution_time": self.max_execution_time})
        request = urllib.request.Request(self.url, data=body.encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                reply = json.loads(response.read(16 << 20))
            results = reply.get("results", reply.get("passed"))
            return [bool(r) and r == 1 for r in results][:len(tests)] + [False] * max(0, len(tests) - len(results))
        except (OSError, ValueError, AttributeError, TypeError):
            # Trust boundary (network): a failed call means no test passed; the caller sees pass fraction 0.
            return [False] * len(tests)


_DEFAULT: CodeExecutor | None = None


def set_default_executor(executor: CodeExecutor | None) -> None:
    """Make `executor` the one the `code` rewards use when no `executor_url` param is given (None: local)."""
    global _DEFAULT
    _DEFAULT = executor


def default_executor() -> CodeExecutor:
    """The executor set by `set_default_executor`, else a `LocalSandboxExecutor` with default limits."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = LocalSandboxExecutor()
    return _DEFAULT
