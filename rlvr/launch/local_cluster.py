"""A single-node Ray head started (and stopped) by rlvr itself, for `rlvr launch` without `--address`.

The head runs as `ray start --head --block` in a child process with its own free ports and its own temp
dir, so several clusters can share a machine. `stop()` sends SIGTERM to that one process, which shuts
down the Ray processes it started, then reaps any of that process tree still running (by PID, recorded
before the signal): `ray stop` is never used, because it kills every Ray node on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field


def free_port() -> int:
    """A TCP port free right now on every interface of this machine (the OS picks it): for the Ray head here, and
    for the rendezvous an actor hosts for other nodes (`rlvr.orchestration.actors`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def token_auth_env() -> dict[str, str]:
    """`{"RAY_AUTH_MODE": "token"}` when the mode is unset and a Ray auth token is available, `disabled` when
    it is unset and none exists, else {} (an explicit mode is kept).

    `ray start --head` turns token authentication on by itself when a token exists (RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token, which any local `ray.init()` creates), but a client joining
    an existing cluster stays in `disabled` mode and is refused. Giving the head and every client of
    rlvr the same rule keeps them consistent.
    """
    if os.environ.get("RAY_AUTH_MODE"):
        return {}
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    if os.environ.get("RAY_AUTH_TOKEN") or os.path.exists(path):
        return {"RAY_AUTH_MODE": "token"}
    # no token yet: a head started now would generate one and require it while this process's clients
    # (which read the mode once, before the file exists) stay disabled; run both without tokens instead
    return {"RAY_AUTH_MODE": "disabled"}


RAY_CLI_MODULE = "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; sys.exit(main())"
"""Runs the `ray` CLI from the importable package: Ray installed on PYTHONPATH (an offline site-packages tree,
a `pip install --target`) has no `ray` script anywhere."""


def ray_command() -> list[str]:
    """The `ray` CLI of this Python environment, else the one on PATH, else this interpreter running the CLI
    of the `ray` package it imports (`RAY_CLI_MODULE`)."""
    candidate = os.path.join(os.path.dirname(sys.executable), "ray")
    if os.path.exists(candidate):
        return [candidate]
    found = shutil.which("ray")
    return [found] if found else [sys.executable, "-c", RAY_CLI_MODULE]


def _stop_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux prctl PR_SET_PDEATHSIG), so a head in
    its own session does not outlive a driver killed with SIGKILL."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _descendants(pid: int) -> list:
    """psutil handles of every process under pid (Ray's agents are grandchildren, under the raylet)."""
    import psutil  # a Ray dependency

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _reap(procs: list, grace_s: float = 10.0) -> None:
    """Terminate, then kill, those of procs still running (psutil checks PID reuse by start time)."""
    import psutil

    alive = [p for p in procs if p.is_running()]
    for p in alive:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, still = psutil.wait_procs(alive, timeout=grace_s)
    for p in still:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


@dataclass
class LocalRayHead:
    """One Ray head node on this machine; use as a context manager or call `start()` / `stop()`."""

    num_cpus: int | None = None
    """CPUs offered to Ray (None: Ray counts them)."""
    num_gpus: int | None = None
    """GPUs offered to Ray (None: Ray counts them)."""
    temp_dir: str | None = None
    """Ray temp dir (None: a fresh short directory under the system temp dir, removed by `stop()`)."""
    startup_timeout_s: float = 120.0
    """Seconds to wait for the GCS and the dashboard (job API) to accept connections."""
    include_dashboard: bool = True
    """Start the dashboard (the job API `rlvr launch` submits to); `rlvr train` needs none."""
    own_session: bool = False
    """Start the head in its own session, so that a signal to the caller's process group (Ctrl-C, Slurm's
    SIGTERM) does not reach the Ray processes; it is still stopped (SIGTERM) when the caller dies."""
    port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    _own_temp_dir: bool = False

    @property
    def address(self) -> str:
        """The GCS address (`ray.init(address=...)`, `RAY_ADDRESS`)."""
        return f"127.0.0.1:{self.port}"

    @property
    def dashboard_url(self) -> str:
        """The job-submission (dashboard) URL."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self) -> LocalRayHead:
        """Start the head and wait until it accepts jobs; raises RuntimeError with its output if it fails."""
        if self.temp_dir is None:
            self.temp_dir = tempfile.mkdtemp(prefix="rlvr-ray-")
            self._own_temp_dir = True
        cmd = [
            *ray_command(),
            "start",
            "--head",
            "--block",
            "--disable-usage-stats",
            "--port",
            str(self.port),
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(self.dashboard_port),
            "--temp-dir",
            self.temp_dir,
            "--ray-client-server-port",
            str(free_port()),
            "--dashboard-agent-listen-port",
            str(free_port()),
        ]
        if not self.include_dashboard:
            cmd += ["--include-dashboard", "false"]
        if self.num_cpus is not None:
            cmd += ["--num-cpus", str(self.num_cpus)]
        if self.num_gpus is not None:
            cmd += ["--num-gpus", str(self.num_gpus)]
        log_path = os.path.join(self.temp_dir, "ray_start.log")
        env = {**os.environ, **token_auth_env(), "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=self.own_session,
                preexec_fn=_stop_with_parent if self.own_session else None,
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while not (
            port_open("127.0.0.1", self.port)
            and (not self.include_dashboard or port_open("127.0.0.1", self.dashboard_port))
        ):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                with open(log_path, errors="replace") as f:
                    tail = f.read()[-3000:]
                raise RuntimeError(f"the local Ray head did not start (`{' '.join(cmd)}`):\n{tail}")
            time.sleep(0.5)
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM the `ray start --block` process (it stops its own children), SIGKILL after timeout_s."""
        if self.proc is not None and self.proc.poll() is None:
            tree = _descendants(self.proc.pid)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            _reap(tree)
        if self._own_temp_dir and self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalRayHead:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
