"""The sandbox launcher: runs one program against its tests; executed as a script, stdlib only.

Started by `LocalSandboxExecutor` (rlvr/rewards/sandbox.py), normally as
`unshare --pid --net --mount --ipc --uts --fork --kill-child --mount-proc python -I sandbox_launcher.py`,
so it is PID 1 of a fresh pid namespace, alone in a network namespace with only a down loopback, and in a
private mount namespace. It reads one job (JSON) on stdin and writes one result (JSON) on stdout.

Invariants:
- In namespace mode it mounts private tmpfs over /tmp, /var/tmp and /dev/shm (the scratch dir lives there, so
  it vanishes with the namespace and no sample sees another's files), and, when the interpreter lives under
  a directory the unprivileged user cannot enter (e.g. /root/.pyenv), a tmpfs over that directory with only
  the interpreter's prefix bound back in (which also hides the rest of it).
- Untrusted code runs only in children that called setsid, set the rlimits (CPU, address space, file size,
  open files, processes, no core) and, when we are root, dropped to uid/gid `drop_uid` with no
  supplementary groups and no_new_privs, before exec.
- After each test every other process of the namespace is SIGKILLed (kill(-1) from PID 1), and the kernel
  kills whatever is left when the launcher exits.
- Assert tests report through a results file with a per-run random nonce; a test counts as passed only if the
  harness wrote "<nonce> <index> 1" after the assertion ran. A program that calls os._exit(0) passes nothing.
"""

import ctypes
import json
import os
import resource
import secrets
import signal
import subprocess
import sys

MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_DETACH = 2, 4, 4096, 16384, 2

HARNESS = r"""
import ast, os, signal, sys, types
def _make_report(nonce, out):
    def report(i, ok):
        out.write("%s %d %d\n" % (nonce, i, ok))
    return report
_report = _make_report(os.environ.pop("RLVR_NONCE"), os.fdopen(int(sys.argv[3]), "w", buffering=1))
tests = ast.literal_eval(open(sys.argv[2]).read())
timeout = float(sys.argv[4])
class _Timeout(BaseException):
    pass
def _alarm(signum, frame):
    raise _Timeout()
signal.signal(signal.SIGALRM, _alarm)
# The solution gets its own __main__ module, so `import __main__` does not reach the harness.
module = types.ModuleType("__main__")
sys.modules["__main__"] = module
g = module.__dict__
try:
    signal.setitimer(signal.ITIMER_REAL, timeout)
    exec(compile(open(sys.argv[1]).read(), "solution.py", "exec"), g)
    signal.setitimer(signal.ITIMER_REAL, 0)
except BaseException:
    sys.exit(1)
for i, test in enumerate(tests):
    ok = 0
    try:
        signal.setitimer(signal.ITIMER_REAL, timeout)
        exec(compile(test, "test_%d.py" % i, "exec"), g)
        signal.setitimer(signal.ITIMER_REAL, 0)
        ok = 1
    except BaseException:
        signal.setitimer(signal.ITIMER_REAL, 0)
    _report(i, ok)
"""


def _libc_call(name: str, *args: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{args}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _libc_call("mount", source.encode(), target.encode(), fstype.encode() if fstype else None, flags,
               data.encode() if data else None)


def _blocked_ancestor(path: str) -> str | None:
    """The topmost directory on `path` that others cannot traverse (no o+x), or None."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:i])
        if os.path.isdir(d) and not os.stat(d).st_mode & 0o001:
            return d
    return None


def _isolate_filesystem(python: str, tmp_size_mb: int) -> None:
    opts = f"size={tmp_size_mb}m,mode=1777"
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, opts)
    for d in ("/var/tmp", "/dev/shm"):
        if os.path.isdir(d):
            _mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, opts)
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(python)))
    blocked = _blocked_ancestor(prefix)
    if blocked is not None:
        staging = "/tmp/.rlvr-python"
        os.mkdir(staging, 0o755)
        _mount(prefix, staging, None, MS_BIND | MS_REC)
        _mount("tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        os.makedirs(prefix, mode=0o755, exist_ok=True)
        _mount(staging, prefix, None, MS_BIND | MS_REC)
        _libc_call("umount2", staging.encode(), MS_DETACH)


def _child_setup(limits: dict, drop_uid: int | None) -> None:
    """Runs in the forked child before exec: new session, rlimits, then drop privileges."""
    os.setsid()
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_size_bytes"], limits["file_size_bytes"]))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["num_processes"], limits["num_processes"]))
    if drop_uid is not None:
        os.setgroups([])
        os.setgid(drop_uid)
        os.setuid(drop_uid)
    ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: setuid binaries cannot regain privileges


def _kill_others(namespaced: bool, proc: subprocess.Popen) -> None:
    if namespaced:
        try:
            os.kill(-1, signal.SIGKILL)  # from PID 1 of the namespace: every other process in it
        except ProcessLookupError:
            pass
    else:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _run(job: dict, argv: list[str], stdin_path: str, stdout_path: str, env: dict, wall_s: float,
         cpu_s: int, pass_fds: tuple[int, ...] = ()) -> tuple[int | None, str]:
    limits = {**job["limits"], "cpu_s": cpu_s}
    with open(stdin_path, "rb") as fin, open(stdout_path, "wb") as fout:
        proc = subprocess.Popen(argv, stdin=fin, stdout=fout, stderr=subprocess.DEVNULL, cwd=job["workdir"],
                                env=env, preexec_fn=lambda: _child_setup(limits, job["drop_uid"]),
                                close_fds=True, pass_fds=pass_fds)
        try:
            rc = proc.wait(timeout=wall_s)
        except subprocess.TimeoutExpired:
            rc = None
        _kill_others(job["namespaced"], proc)
    with open(stdout_path, "rb") as f:
        out = f.read(job["limits"]["max_output_bytes"]).decode("utf-8", "replace")
    return rc, out


def _outputs_match(actual: str, expected: str) -> bool:
    return actual.split() == expected.split()


def main() -> None:
    job = json.loads(sys.stdin.buffer.read())
    limits = job["limits"]
    if job["namespaced"]:
        _isolate_filesystem(job["python"], limits["tmp_size_mb"])
        os.makedirs(job["workdir"], mode=0o700, exist_ok=True)
    workdir, uid = job["workdir"], job["drop_uid"]
    if uid is not None:
        os.chown(workdir, uid, uid)
        os.chmod(workdir, 0o700)
    # Files the launcher (root) opens by path live in a root-owned dir that the program can enter but not
    # list or modify: a path inside the workdir could be swapped for a symlink (to /etc/passwd, a FIFO...).
    private = os.path.join(os.path.dirname(workdir), f".rlvr-launcher-{secrets.token_hex(8)}")
    os.mkdir(private, 0o711)
    program_path = os.path.join(private, "solution.py")
    with open(program_path, "w", encoding="utf-8") as f:
        f.write(job["program"])
    os.chmod(program_path, 0o644)
    env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    python, timeout = job["python"], float(limits["test_timeout_s"])
    stdout_path = os.path.join(private, "stdout")
    passed: list[bool] = []
    stdio = [t for t in job["tests"] if isinstance(t, dict)]
    asserts = [t for t in job["tests"] if isinstance(t, str)]
    for i, test in enumerate(stdio):
        stdin_path = os.path.join(private, f"in{i}")
        with open(stdin_path, "w", encoding="utf-8") as f:
            f.write(str(test.get("input", "")))
        rc, out = _run(job, [python, "-I", "-S", program_path], stdin_path, stdout_path, env,
                       wall_s=timeout, cpu_s=int(timeout) + 1)
        passed.append(rc == 0 and _outputs_match(out, str(test.get("output", ""))))
    if asserts:
        nonce = secrets.token_hex(16)
        tests_path = os.path.join(private, "tests")
        harness_path = os.path.join(private, "harness.py")
        results_path = os.path.join(private, "results")
        for path, text in ((tests_path, repr(asserts)), (harness_path, HARNESS)):
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(path, 0o644)
        results_fd = os.open(results_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        budget = timeout * (len(asserts) + 1)
        argv = [python, "-I", "-S", harness_path, program_path, tests_path, str(results_fd), str(timeout)]
        try:
            _run(job, argv, os.devnull, stdout_path, {**env, "RLVR_NONCE": nonce}, wall_s=budget + 1.0,
                 cpu_s=int(budget) + 1, pass_fds=(results_fd,))
        finally:
            os.close(results_fd)
        ok: dict[int, bool] = {}
        with open(results_path, "rb") as f:
            for line in f.read(1 << 20).decode("utf-8", "replace").splitlines():
                parts = line.split()
                if len(parts) == 3 and parts[0] == nonce and parts[1].isdigit():
                    ok.setdefault(int(parts[1]), parts[2] == "1")
        passed.extend(ok.get(i, False) for i in range(len(asserts)))
    sys.stdout.write(json.dumps({"passed": passed}))


if __name__ == "__main__":
    main()
