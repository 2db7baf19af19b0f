"""The sandbox launcher: runs one program against its tests; executed as a script, stdlib only.

Started by `LocalSandboxExecutor` (rlvr/rewards/sandbox.py) with an explicit minimal environment, normally as
`unshare [--user --map-root-user] --pid --net --mount --ipc --uts --fork --kill-child --mount-proc python -I -S
sandbox_launcher.py`, so it is PID 1 of a fresh pid namespace, alone in a network namespace with only a down
loopback, in a private mount namespace. It reads one job (JSON) on stdin and writes one result (JSON) on stdout.

Invariants:
- Namespace modes: before any program runs, the launcher pivots into a fresh tmpfs root holding read-only binds
  of /usr, /bin, /lib*, /sbin, a few /etc files, the interpreter's prefix and /dev/{null,zero,full,random,
  urandom}, a new /proc, and private tmpfs /tmp and /dev/shm; the host root is detached and the root itself is
  remounted read-only. Nothing of $HOME, /run, /var or /work is in the tree, so unmounting anything reveals an
  empty directory, and the only writable places are the private tmpfs mounts.
- Untrusted code runs only in children confined by sandbox_confine.drop_privileges before exec (new session,
  rlimits, the per-sample uid as root, no capabilities, SECBIT_NOROOT, no_new_privs, Landlock, seccomp):
  CapEff, CapPrm and CapBnd are 0 in the program in the namespace modes.
- The launcher is non-dumpable and keeps capabilities the program lacks, so the program cannot read its memory,
  environment or file descriptors through /proc or ptrace; as PID 1 it cannot be signalled from inside.
- The program never holds the tests: expected outputs and assert tests stay in this process. Stdio tests
  compare the child's stdout (a memfd) with the expected output here. Each assert test gets one fresh program
  child and one judge (forked from here, all capabilities dropped, its own uid as root, its own Landlock
  domain, no write access anywhere) that runs the test code against the program's objects through
  sandbox_rpc.py and writes one verdict byte to a pipe that only it holds.
- Landlock (when the kernel has it) confines every program and judge: read-only system paths, writable
  private scratch only, no TCP, no abstract unix sockets, no signals or ptrace outside its own domain. The
  launcher itself is not confined (it mounts, forks judges and kills).
- After each test every other process of the sample is SIGKILLed and reaped (kill(-1) from PID 1; in the
  rlimits mode, kill(-1) as the sample uid when root, else the process group and every orphan re-parented to
  the launcher as a child subreaper).
"""

import ctypes
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time
import types

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1,
    2,
    4,
    8,
    32,
    4096,
    16384,
    1 << 18,
)
MNT_DETACH = 2
PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "passwd", "group", "nsswitch.conf")
DEVICES = ("null", "zero", "full", "random", "urandom")
HERE = os.path.dirname(os.path.abspath(__file__))
PRELOADED = (
    "math",
    "cmath",
    "itertools",
    "functools",
    "collections",
    "heapq",
    "bisect",
    "re",
    "string",
    "operator",
    "fractions",
    "decimal",
    "statistics",
    "typing",
    "copy",
    "datetime",
    "random",
    "array",
    "json",
)
_libc = ctypes.CDLL(None, use_errno=True)


def _check(name: str, rc: int) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    _check(f"mount {target}", _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)))


def _bind_readonly(source: str, target: str) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(source, target, None, MS_BIND | MS_REC)
    with open("/proc/self/mountinfo") as f:  # the bind and every mount under it, each made read-only
        points = [line.split()[4] for line in f]
    for point in points:
        if point == target or point.startswith(target.rstrip("/") + "/"):
            st = os.statvfs(point)
            keep = st.f_flag & (os.ST_NOSUID | os.ST_NODEV | os.ST_NOEXEC | os.ST_NOATIME | os.ST_RELATIME)
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | keep)


def _build_root(python: str, tmp_size_mb: int) -> None:
    """Pivot into a minimal read-only tree (module docstring); the host root is detached afterwards."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    new = "/tmp"  # any directory will do: this tmpfs exists only in our mount namespace
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    for name in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), new + host)
        elif os.path.isdir(host):
            _bind_readonly(host, new + host)
    for name in ETC_FILES:
        if os.path.exists("/etc/" + name):
            _bind_readonly("/etc/" + name, f"{new}/etc/{name}")
    prefix = os.path.dirname(os.path.dirname(os.path.realpath(python)))
    if not os.path.exists(new + prefix):
        _bind_readonly(prefix, new + prefix)
    os.makedirs(new + "/dev")
    _mount("tmpfs", new + "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
    for name in DEVICES:
        open(f"{new}/dev/{name}", "a").close()
        _mount("/dev/" + name, f"{new}/dev/{name}", None, MS_BIND)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{new}/dev/{name}")
    for d in ("/tmp", "/dev/shm"):
        os.makedirs(new + d)
        _mount("tmpfs", new + d, "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp_size_mb}m,mode=1777")
    os.makedirs(new + "/var")
    os.symlink("/tmp", new + "/var/tmp")
    os.makedirs(new + "/proc")
    _mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(new + "/.old")
    _check("pivot_root", _libc.syscall(155, new.encode(), (new + "/.old").encode()))  # SYS_pivot_root (x86_64)
    os.chdir("/")
    _check("umount old root", _libc.umount2(b"/.old", MNT_DETACH))
    os.rmdir("/.old")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


class Sandbox:
    """Spawns and kills the program's processes for one job (see the module docstring)."""

    def __init__(self, job: dict, stub_source: str, confine: types.ModuleType) -> None:
        self.job, self.limits, self.stub_source, self.confine = job, job["limits"], stub_source, confine
        self.namespaced, self.uid = job["namespaced"], job["drop_uid"]
        self.judge_uid = None if self.uid is None else self.uid + 1  # root: the judge is not the program's uid
        with open("/proc/sys/kernel/cap_last_cap") as f:
            self.cap_last = int(f.read())
        self.privileged = os.geteuid() == 0  # root of the host or of our user namespace: we hold CAP_SETPCAP
        devices = [f"/dev/{d}" for d in DEVICES]
        if self.namespaced:  # the tree is already minimal: all of it readable, the private tmpfs writable
            read, write = ["/"], ["/tmp", "/dev/shm", *devices[:3]]
        else:  # the host's tree: only what Python needs to start, and the scratch dir
            prefix = os.path.dirname(os.path.dirname(os.path.realpath(job["python"])))
            read = [
                *(f"/{d}" for d in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")),
                *(f"/etc/{f}" for f in ETC_FILES),
                prefix,
                *devices,
            ]
            write = [job["workdir"], *devices[:3]]
            read.append("/proc/self")  # opened in the child: its own /proc entry only
        self.landlock = (confine.landlock_abi(), read, write)
        self.env = {"PATH": "/usr/bin:/bin", "HOME": job["workdir"], "LANG": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}
        if not self.namespaced:
            _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans come to us, so we can kill them
        self.program_fd = os.memfd_create("solution.py", os.MFD_ALLOW_SEALING)
        os.write(self.program_fd, job["program"].encode("utf-8", "replace"))
        fcntl.fcntl(
            self.program_fd,
            fcntl.F_ADD_SEALS,
            fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL,
        )

    def spawn(
        self, args: list[str], stdin: int, stdout: int, pass_fds: tuple[int, ...], cpu_s: float
    ) -> subprocess.Popen:
        os.lseek(self.program_fd, 0, os.SEEK_SET)
        # RLIMIT_NPROC counts every process of the uid: add the sandbox's own that share it (sandbox.py)
        num = self.limits["num_processes"] + self.limits["num_shared_processes"][args[0]]
        limits = {**self.limits, "cpu_s": cpu_s, "num_processes": num}
        argv = [self.job["python"], "-I", "-S", "-c", self.stub_source, *args]  # HERE is not in the sandbox tree

        def confine() -> None:
            self.confine.drop_privileges(limits, self.uid, self.cap_last, self.privileged, self.landlock)

        return subprocess.Popen(
            argv,
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.DEVNULL,
            cwd=self.job["workdir"],
            env=self.env,
            close_fds=True,
            pass_fds=(self.program_fd, *pass_fds),
            preexec_fn=confine,
        )

    def kill_all(self, proc: subprocess.Popen, judge: int = -1) -> None:
        if judge > 0:
            try:
                os.killpg(judge, signal.SIGKILL)  # the judge called setsid
            except (ProcessLookupError, PermissionError):
                pass
        if self.namespaced:
            try:
                os.kill(-1, signal.SIGKILL)  # from PID 1 of the namespace: every other process in it
            except ProcessLookupError:
                pass
        else:
            if self.uid is not None:
                helper = os.fork()
                if helper == 0:  # as the sample uid, kill(-1) reaches exactly the sample's processes
                    try:
                        os.setresuid(self.uid, self.uid, self.uid)
                        os.kill(-1, signal.SIGKILL)
                    finally:
                        os._exit(0)
                os.waitpid(helper, 0)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._reap()
        proc.returncode = proc.returncode if proc.returncode is not None else -9

    def _reap(self) -> None:
        if self.namespaced:  # everything is dead already; collect the zombies
            while True:
                try:
                    os.waitpid(-1, 0)
                except ChildProcessError:
                    return
        end = time.monotonic() + 10.0
        while time.monotonic() < end:  # orphans re-parented to us (subreaper): kill each generation as it comes
            self._kill_children()
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                time.sleep(0.01)

    def _kill_children(self) -> None:
        me = os.getpid()
        try:
            with open(f"/proc/{me}/task/{me}/children") as f:
                children = [int(p) for p in f.read().split()]
        except OSError:
            return
        for pid in children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def run_stdio(self, test: dict, timeout: float, outputs: list[str]) -> bool:
        stdin, stdout = os.memfd_create("stdin"), os.memfd_create("stdout")
        try:
            os.write(stdin, str(test.get("input", "")).encode("utf-8", "replace"))
            os.lseek(stdin, 0, os.SEEK_SET)
            proc = self.spawn(["stdio", str(self.program_fd)], stdin, stdout, (), cpu_s=int(timeout) + 1)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = None
            self.kill_all(proc)
            out = os.pread(stdout, self.limits["max_output_bytes"], 0).decode("utf-8", "replace")
            outputs.append(out)
        finally:
            os.close(stdin)
            os.close(stdout)
        return rc == 0 and out.split() == str(test.get("output", "")).split()

    def run_assert(self, test: str, timeout: float, rpc: types.ModuleType) -> bool:
        """One fresh child runs the program; a judge process runs `test` against it; we only read the verdict."""
        request_r, request_w = os.pipe()
        reply_r, reply_w = os.pipe()
        verdict_r, verdict_w = os.pipe()
        proc, judge = None, -1
        try:
            proc = self.spawn(
                ["rpc", str(self.program_fd), str(request_r), str(reply_w)],
                subprocess.DEVNULL,
                subprocess.DEVNULL,
                (request_r, reply_w),
                cpu_s=2 * timeout + 1,
            )
            judge = os.fork()
            if judge == 0:
                self._judge(test, timeout, rpc, request_w, reply_r, verdict_w)
            for fd in (request_r, reply_w, request_w, reply_r, verdict_w):
                os.close(fd)
            request_r = reply_w = request_w = reply_r = verdict_w = -1
            if not select.select([verdict_r], [], [], 2 * timeout + 1.0)[0]:
                return False
            return os.read(verdict_r, 1) == b"1"
        finally:
            for fd in (request_r, request_w, reply_r, reply_w, verdict_r, verdict_w):
                if fd >= 0:
                    os.close(fd)
            if proc is not None:
                self.kill_all(proc, judge)

    def _judge(
        self, test: str, timeout: float, rpc: types.ModuleType, request_w: int, reply_r: int, verdict_w: int
    ) -> None:
        """The forked judge: trusted test code, but with no privileges, its own uid (root) and Landlock domain.

        The program cannot signal, ptrace or write to it (another uid, or a sibling Landlock domain), and the
        test code, fed the program's data, cannot touch the launcher or its result pipe (fd 1 is closed here).
        """
        ok = False
        try:
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            keep = {0, 1, 2, request_w, reply_r, verdict_w}
            for fd in map(int, os.listdir("/proc/self/fd")):
                if fd not in keep:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            limits = {**self.limits, "cpu_s": 2 * timeout + 1, "num_processes": 1}
            read = self.landlock[1]
            self.confine.drop_privileges(
                limits, self.judge_uid, self.cap_last, self.privileged, (self.landlock[0], read, [])
            )
            channel = rpc.Channel(request_w, reply_r, deadline=time.monotonic() + 2 * timeout)
            ok = rpc.run_assert_test(test, channel)
        finally:  # whatever happened, the judge never returns into the launcher's code
            try:
                os.write(verdict_w, b"1" if ok else b"0")
            finally:
                os._exit(0)


def _load(filename: str) -> tuple[types.ModuleType, str]:
    """A sibling file as a module and as source (we run as a script: no package imports)."""
    with open(os.path.join(HERE, filename), encoding="utf-8") as f:
        source = f.read()
    name = filename.removesuffix(".py")
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module, source


def _join_cgroups(procs_files: list[str]) -> None:
    for path in procs_files:
        with open(path, "w") as f:
            f.write("0")


def main() -> None:
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # /proc/1/{mem,environ,fd} need CAP_SYS_PTRACE over us now
    job = json.loads(sys.stdin.buffer.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    _join_cgroups(job.get("cgroup_procs") or [])
    if os.geteuid() == 0:
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("-1000")
        except OSError:
            pass
    rpc, stub_source = _load("sandbox_rpc.py")  # before the pivot: HERE is not in the sandbox's tree
    confine = _load("sandbox_confine.py")[0]
    for name in PRELOADED:  # the judges (other uids, Landlock) may not reach our stdlib on disk: import it now
        try:
            __import__(name)
        except ImportError:
            pass
    limits = job["limits"]
    if job["namespaced"]:
        _build_root(job["python"], limits["tmp_size_mb"])
        os.makedirs(job["workdir"], mode=0o700, exist_ok=True)
    if job["drop_uid"] is not None:
        os.chown(job["workdir"], job["drop_uid"], job["drop_uid"])
    os.chmod(job["workdir"], 0o700)
    # as PID 1, signals without a handler are dropped when they come from inside the namespace: keep it so
    for sig in (signal.SIGINT, signal.SIGALRM, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    sandbox = Sandbox(job, stub_source, confine)
    timeout = float(limits["test_timeout_s"])
    passed: list[bool] = []
    outputs: list[str] = []
    errors: list[str] = []
    for i, test in enumerate(job["tests"]):
        try:
            if isinstance(test, dict):
                passed.append(sandbox.run_stdio(test, timeout, outputs))
            else:
                passed.append(sandbox.run_assert(str(test), timeout, rpc))
        except Exception as e:  # trust boundary: a test the sandbox could not run is failed, and reported
            passed.append(False)
            errors.append(f"test {i}: {type(e).__name__}: {e}"[:300])
    result = {"passed": passed, "errors": errors, **({"outputs": outputs} if job.get("return_outputs") else {})}
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
