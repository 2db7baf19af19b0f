"""Code executors: run a program against tests and say which passed. Local sandbox (default) or remote service.

Tests are a list whose items are either `{"input": str, "output": str}` (stdin/stdout case: the program runs
once per case; passed when it exits 0 and its stdout equals `output` up to whitespace) or a string of Python
code run against the program's names (assert-based: passed when it raises nothing). Assert tests run in an
unprivileged judge process against handles on the program's objects in a separate child (sandbox_rpc.py):
only plain data comes back, so an object that equals everything, a patched builtin or a forged report cannot
pass a test.

`LocalSandboxExecutor` isolation, strongest available (`isolation_level()` says which; `describe()` says it
and the memory cap in force):
- "namespaces" (root and `unshare` works): the launcher (sandbox_launcher.py) runs in new pid, net, mount,
  ipc and uts namespaces and pivots into a minimal read-only root with private tmpfs /tmp and /dev/shm;
  untrusted code runs as a per-sample uid (its judges as the next one; sandbox_uids.py reserves the pair so no
  other live sample on the host shares it) with no capabilities, no_new_privs and rlimits.
- "userns" (not root, unprivileged user namespaces allowed): the same inside a user namespace; the code runs
  as the namespace's uid 0 (our uid outside) with every capability dropped, the bounding set emptied and
  SECBIT_NOROOT locked, so it cannot unmount, remount or ptrace anything.
- "rlimits" (neither): rlimits, a fresh session and, as root, a per-sample uid; the scratch dir is a host
  temp dir removed afterwards. Weaker: no network or filesystem isolation (README, Security and reliability).
Memory (`memory_cap()`): as root, a cgroup per sample ("cgroup2" or "cgroup1": memory and pids limits on the
whole sample); otherwise "rlimits": RLIMIT_NPROC is lowered so the program's own processes x RLIMIT_AS <= the total
budget (sandbox processes that share its uid in a user namespace are added on top: `num_shared_processes`).
The launcher is always started with a minimal environment, so no secret of ours is visible to the program.

`RemoteExecutor` posts JSON to a user's sandbox service (stdlib urllib): request
`{"program": str, "tests": [...], "max_execution_time": float}`, response `{"results": [0/1 or bool, ...]}`
(open-instruct's code API shape; `"passed"` is accepted for `"results"`).

Invariants: `run` never raises for anything the program does; it returns one bool per test (all False
when the sandbox itself failed) and the sandbox's processes, cgroup and scratch dir are gone when it returns.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from rlvr.rewards.sandbox_cgroup import SampleCgroup, memory_cap
from rlvr.rewards.sandbox_confine import landlock_abi
from rlvr.rewards.sandbox_uids import UidPool

_log = logging.getLogger(__name__)
_LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_launcher.py")
_NS_FLAGS = ["--pid", "--net", "--mount", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc"]
_LAUNCHER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "LANG": "C.UTF-8"}
_UID_POOL = UidPool()  # per-sample uid pairs for the root modes, never held by two live samples of this host


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed program run."""

    test_timeout_s: float = 4.0  # wall seconds per stdio test; an assert test gets 2x (load + test code)
    memory_bytes: int = 512 * 1024 * 1024  # RLIMIT_AS of each process
    total_memory_bytes: int = 1024 * 1024 * 1024  # whole sample: cgroup memory.max, or nproc x AS <= this
    file_size_bytes: int = 16 * 1024 * 1024  # RLIMIT_FSIZE: largest file it may write (stdout included)
    num_processes: int = 32  # RLIMIT_NPROC / pids.max when a cgroup holds the memory budget
    max_output_bytes: int = 1024 * 1024  # stdout read back for comparison
    tmp_size_mb: int = 64  # size of the private /tmp and /dev/shm (namespace modes)


class CodeExecutor(Protocol):
    """Runs `program` against `tests`; returns one bool per test. Must not raise for bad programs."""

    def run(self, program: str, tests: list[Any]) -> list[bool]: ...


def _ns_prefix(level: str) -> list[str]:
    unshare = shutil.which("unshare") or "unshare"
    return [unshare, *_NS_FLAGS] if level == "namespaces" else [unshare, "--user", "--map-root-user", *_NS_FLAGS]


@functools.cache
def isolation_level() -> str:
    """ "namespaces", "userns" or "rlimits": the strongest isolation that works here (cached)."""
    if shutil.which("unshare") is None:
        return "rlimits"
    level = "namespaces" if os.geteuid() == 0 else "userns"
    python = os.path.realpath(sys.executable)  # what the launcher will run: it must start inside the namespaces too
    try:
        probe = subprocess.run(
            [*_ns_prefix(level), python, "-I", "-S", "-c", "pass"], capture_output=True, timeout=30, env=_LAUNCHER_ENV
        )
    except (OSError, subprocess.TimeoutExpired):
        return "rlimits"
    return level if probe.returncode == 0 else "rlimits"


def _world_traversable(path: str) -> bool:
    parts = os.path.realpath(path).strip("/").split("/")
    return all(os.stat("/" + "/".join(parts[:i])).st_mode & 0o001 for i in range(1, len(parts)))


class LocalSandboxExecutor:
    """The default executor: runs programs locally in `sandbox_launcher.py` (module docstring)."""

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        python: str | None = None,
        level: str | None = None,
        memory_cap_kind: str | None = None,
    ) -> None:
        """`level` / `memory_cap_kind` force a weaker mode than the detected one ("rlimits"; tests, benchmarks)."""
        self.limits = limits or SandboxLimits()
        self.level = level or isolation_level()
        self.memory_cap = memory_cap_kind or memory_cap()
        if self.level not in ("namespaces", "userns", "rlimits") or self.memory_cap not in (
            "cgroup2",
            "cgroup1",
            "rlimits",
        ):
            raise ValueError(f"unknown sandbox level {self.level!r} or memory cap {self.memory_cap!r}")
        base = os.path.realpath(sys.executable)
        if python is None and self.level == "rlimits" and os.geteuid() == 0 and not _world_traversable(base):
            python = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin")  # the sample uid must reach it
        self.python = python or base

    def num_processes(self) -> int:
        """Processes and threads the program may have at once: the configured count under a cgroup, else what the
        memory budget allows (processes x RLIMIT_AS <= total)."""
        if self.memory_cap != "rlimits":
            return self.limits.num_processes
        return min(self.limits.num_processes, max(1, self.limits.total_memory_bytes // self.limits.memory_bytes))

    def num_shared_processes(self) -> dict[str, int]:
        """Sandbox processes that run as the program's uid, by test kind: RLIMIT_NPROC counts them too, so the
        program's limit is raised by exactly that many. In a user namespace: the `unshare` parent and the launcher,
        plus the judge of an assert test (one uid is mapped there); as root the program's uid is its own."""
        shared = 2 if self.level == "userns" else 0
        return {"stdio": shared, "rpc": shared + (shared > 0)}

    def describe(self) -> dict:
        """What is in force: isolation level, memory cap kind and the resulting process limit."""
        return {
            "isolation": self.level,
            "memory_cap": self.memory_cap,
            "landlock_abi": landlock_abi(),
            "num_processes": self.num_processes(),
            "num_shared_processes": self.num_shared_processes(),
            "total_memory_bytes": self.limits.total_memory_bytes,
            "memory_bytes": self.limits.memory_bytes,
        }

    def _deadline(self, tests: list[Any]) -> float:
        per_test = [1.0 if isinstance(t, dict) else 2.0 for t in tests]
        return self.limits.test_timeout_s * sum(per_test) + 2.0 * len(tests) + 15.0

    def run(self, program: str, tests: list[Any]) -> list[bool]:
        """One bool per test; all False if the sandbox failed or ran out of time."""
        return self._run(program, tests, return_outputs=False)[0] if tests else []

    def run_capture(self, program: str, stdin: str = "") -> str | None:
        """The stdout of `program` run once on `stdin` in the sandbox (diagnostics and tests), None on failure."""
        outputs = self._run(program, [{"input": stdin, "output": ""}], return_outputs=True)[1]
        return outputs[0] if outputs else None

    def _run(self, program: str, tests: list[Any], return_outputs: bool) -> tuple[list[bool], list[str]]:
        namespaced = self.level in ("namespaces", "userns")
        # a uid pair per sample (root; only our own uid is mapped in a user namespace): its processes, rlimits and
        # files are its own, and kill(-1) as it is exact, because no other live sample on the host holds it
        reserve = os.geteuid() == 0 and self.level != "userns"
        scratch_parent = cgroup = uids = proc = None
        prefix: list[str] = []
        finished = False
        try:
            uids = _UID_POOL.reserve() if reserve else None
            drop_uid = uids.program if uids is not None else None
            if namespaced:
                workdir, prefix = "/tmp/work", _ns_prefix(self.level)
            else:
                scratch_parent = tempfile.mkdtemp(prefix="rlvr-sandbox-")
                os.chmod(scratch_parent, 0o711)  # the sample uid may enter its workdir but not list the parent
                workdir = os.path.join(scratch_parent, "work")
                os.mkdir(workdir, 0o700)
            limits = {
                **asdict(self.limits),
                "num_processes": self.num_processes(),
                "num_shared_processes": self.num_shared_processes(),
            }
            cgroup = SampleCgroup.create(self.memory_cap, self.limits) if self.memory_cap != "rlimits" else None
            job = {
                "program": program,
                "tests": tests,
                "limits": limits,
                "python": self.python,
                "workdir": workdir,
                "drop_uid": drop_uid,
                "namespaced": namespaced,  # the launcher gives its judges drop_uid + 1
                "cgroup_procs": cgroup.procs_files if cgroup else [],
                "return_outputs": return_outputs,
            }
            proc = subprocess.run(
                [*prefix, os.path.realpath(sys.executable), "-I", "-S", _LAUNCHER],
                input=json.dumps(job).encode(),
                capture_output=True,
                env=_LAUNCHER_ENV,
                timeout=self._deadline(tests),
            )
            finished = True  # the launcher exited: in a pid namespace, everything in it is gone too
            result = json.loads(proc.stdout)
            passed = result["passed"]
            outputs = [str(o) for o in result.get("outputs", [])]
            if result.get("errors"):  # the sandbox, not the program, failed these tests
                _log.warning(
                    "code sandbox (%s) could not run %d of %d tests: %s",
                    self.level,
                    len(result["errors"]),
                    len(tests),
                    "; ".join(map(str, result["errors"][:3])),
                )
            return [p is True for p in passed][: len(tests)] + [False] * max(0, len(tests) - len(passed)), outputs
        except (OSError, ValueError, KeyError, TypeError, subprocess.TimeoutExpired) as e:
            # Trust boundary: whatever went wrong in the sandbox, the program passed nothing. The launcher bounds
            # every test itself, so getting here is the sandbox failing, not the program: say so.
            stderr = proc.stderr.decode("utf-8", "replace")[-300:] if proc is not None else ""
            _log.warning(
                "code sandbox (%s) failed, %d tests scored 0: %s: %s %s",
                self.level,
                len(tests),
                type(e).__name__,
                e,
                stderr,
            )
            return [False] * len(tests), []
        finally:
            if cgroup is not None:
                cgroup.close()
            if uids is not None and (not namespaced or not finished):
                _kill_uids(uids.program, uids.judge)  # what outlived a launcher killed on timeout, before reuse
            if uids is not None:
                uids.release()
            if scratch_parent is not None:
                subprocess.run(["rm", "-rf", "--one-file-system", scratch_parent], capture_output=True, timeout=60)


_KILL_UIDS = """import os, signal, sys
for uid in map(int, sys.argv[1:]):
    pid = os.fork()
    if pid == 0:
        try:
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
"""


def _kill_uids(*uids: int) -> None:
    """SIGKILL every process of each uid (kill(-1) as that uid), in one helper process."""
    subprocess.run(
        [os.path.realpath(sys.executable), "-I", "-S", "-c", _KILL_UIDS, *map(str, uids)],
        capture_output=True,
        timeout=30,
        env=_LAUNCHER_ENV,
    )


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
        request = urllib.request.Request(
            self.url, data=body.encode(), method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                reply = json.loads(response.read(16 << 20))
            results = reply.get("results", reply.get("passed"))
            return [bool(r) and r == 1 for r in results][: len(tests)] + [False] * max(0, len(tests) - len(results))
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
