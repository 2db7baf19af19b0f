"""One cgroup per sandboxed sample: a memory and a process budget for the whole sample, where the host allows it.

`memory_cap()` says what is available (cached): "cgroup2" when our own cgroup v2 directory is writable and
delegates the memory and pids controllers to children, "cgroup1" when writable v1 memory and pids hierarchies
are mounted (hybrid hosts), else "rlimits" (the caller then lowers RLIMIT_NPROC so that processes x RLIMIT_AS
stays within the budget). In practice only root gets a cgroup.

Invariants: a `SampleCgroup` is created empty with its limits already written; the launcher joins it (writes
its own pid to each `procs_files` entry) before it starts any program, so every process of the sample is
inside; `close()` kills whatever is left and removes the directories.
"""

from __future__ import annotations

import functools
import os
import secrets
import signal
import time
from typing import Any

_ROOT = "/sys/fs/cgroup"


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount root, mount point, fstype, super options) of every cgroup mount."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(fields) >= 5 and len(rest) >= 3 and rest[0] in ("cgroup", "cgroup2"):
                out.append((fields[3], fields[4], rest[0], set(rest[2].split(","))))
    return out


def _own_paths() -> dict[str, str]:
    """Controller name ("" for v2) -> our cgroup path, from /proc/self/cgroup."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
    return paths


def _dir_for(mount_root: str, mount_point: str, path: str) -> str | None:
    if mount_root != "/" and not (path + "/").startswith(mount_root.rstrip("/") + "/"):
        return None
    rel = path[len(mount_root) :] if mount_root != "/" else path
    return os.path.join(mount_point, rel.lstrip("/"))


def _parents() -> tuple[str, dict[str, str]] | None:
    """("cgroup2" | "cgroup1", {controller: our writable directory}) or None."""
    own, mounts = _own_paths(), _mounts()
    for root, point, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            d = _dir_for(root, point, own[""])
            if d and os.path.exists(os.path.join(d, "cgroup.subtree_control")):
                with open(os.path.join(d, "cgroup.subtree_control")) as f:
                    enabled = set(f.read().split())
                if {"memory", "pids"} <= enabled and os.access(d, os.W_OK):
                    return "cgroup2", {"": d}
    found: dict[str, str] = {}
    for root, point, fstype, opts in mounts:
        for c in ("memory", "pids"):
            if fstype == "cgroup" and c in opts and c in own:
                d = _dir_for(root, point, own[c])
                if d and os.access(d, os.W_OK):
                    found[c] = d
    return ("cgroup1", found) if len(found) == 2 else None


def _write(path: str, value: Any) -> None:
    with open(path, "w") as f:
        f.write(str(value))


class SampleCgroup:
    """The cgroup directories of one sample (module docstring)."""

    def __init__(self, kind: str, dirs: list[str]) -> None:
        self.kind, self.dirs = kind, dirs
        self.procs_files = [os.path.join(d, "cgroup.procs") for d in dirs]

    @classmethod
    def create(cls, kind: str, limits: Any) -> SampleCgroup:
        """A new cgroup holding `limits.total_memory_bytes` and `limits.num_processes` (+2 for the launcher)."""
        found = _parents()
        if found is None or found[0] != kind:
            raise OSError(f"{kind} is not available")
        name = f"rlvr-sandbox-{secrets.token_hex(8)}"
        made = []
        try:
            for controller, parent in found[1].items():
                d = os.path.join(parent, name)
                os.mkdir(d)
                made.append(d)
                if controller in ("", "memory"):
                    key = "memory.max" if kind == "cgroup2" else "memory.limit_in_bytes"
                    _write(os.path.join(d, key), limits.total_memory_bytes)
                    swap = os.path.join(d, "memory.swap.max" if kind == "cgroup2" else "memory.memsw.limit_in_bytes")
                    if os.path.exists(swap):
                        _write(swap, 0 if kind == "cgroup2" else limits.total_memory_bytes)
                if controller in ("", "pids"):
                    _write(os.path.join(d, "pids.max"), limits.num_processes + 2)
        except OSError:
            cls(kind, made).close()
            raise
        return cls(kind, made)

    def close(self) -> None:
        """Kill every process left in the cgroup and remove it (retrying while the dying exit)."""
        for d in self.dirs:
            end = time.monotonic() + 5.0
            while os.path.isdir(d):
                try:
                    os.rmdir(d)
                except OSError:
                    if time.monotonic() > end:
                        break
                    self._kill(d)
                    time.sleep(0.02)

    def _kill(self, d: str) -> None:
        if os.path.exists(os.path.join(d, "cgroup.kill")):
            _write(os.path.join(d, "cgroup.kill"), 1)
            return
        with open(os.path.join(d, "cgroup.procs")) as f:
            for pid in f.read().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass


@functools.cache
def memory_cap() -> str:
    """ "cgroup2", "cgroup1" or "rlimits": how a sample's total memory is capped here (module docstring)."""
    if os.geteuid() != 0:
        return "rlimits"
    try:
        found = _parents()
        if found is None:
            return "rlimits"

        class _Probe:
            total_memory_bytes, num_processes = 64 << 20, 4

        SampleCgroup.create(found[0], _Probe).close()
        return found[0]
    except OSError:
        return "rlimits"
