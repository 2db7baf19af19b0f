"""Process and GPU plumbing of bench/gpu_grpo.py: which GPUs the bench was given, the environment of a run pinned to
some of them, peak GPU memory while a run lasts, a run guarded by a timeout (its whole process group killed), the
tail of its log, and the cards' names."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def visible_devices() -> list[str]:
    """The GPUs this script was given (its CUDA_VISIBLE_DEVICES: indices or UUIDs), [] where it is unset."""
    return [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]


def physical(gpus: list[int]) -> list[str]:
    """Device ids of the runs' GPU numbers (0, 1, ... among those this script was given): a bench started with
    CUDA_VISIBLE_DEVICES=3 runs on GPU 3, not on GPU 0 beside whatever else the host runs."""
    seen = visible_devices()
    return [seen[g] if seen else str(g) for g in gpus]


def gpu_env(gpus: list[int]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RLVR_IGNORE_EOS="1",
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
        RAY_DEDUP_LOGS="0",
        CUDA_VISIBLE_DEVICES=",".join(physical(gpus)),
    )
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.setdefault("NCCL_CUMEM_ENABLE", "0")
    env.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    pp = [str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = ":".join(pp)
    return env


# ----------------------------------------------------------------------------- subprocess guard
class PeakMemory:
    """Peak nvidia-smi memory.used (GiB) per GPU index while running: a thread samples every `every_s`."""

    def __init__(self, gpus: list[int], every_s: float = 0.5) -> None:
        self.gpus, self.every_s, self.peak = gpus, every_s, {g: 0.0 for g in gpus}
        self.device = dict(zip(physical(gpus), gpus))  # nvidia-smi's index or UUID -> the run's GPU number
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        for parts in smi_rows(["index", "uuid", "memory.used"], timeout_s=10):
            g = self.device.get(parts[0], self.device.get(parts[1]))
            if g is not None:
                self.peak[g] = max(self.peak[g], float(parts[2]) / 1024)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.every_s)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def result(self) -> dict[str, float]:
        return {str(g): round(v, 2) for g, v in self.peak.items()}


def run_guarded(
    cmd: list[str], env: dict[str, str], timeout_s: float, log_path: Path, gpus: list[int] | None = None
) -> dict[str, Any]:
    """Run in its own session; on timeout SIGTERM the group, then SIGKILL it 15 s later. With `gpus`, the result
    has `peak_mem_gib` ({gpu index: peak memory.used in GiB while it ran})."""
    t0 = time.time()
    with open(log_path, "w") as log, PeakMemory(gpus or []) as mem:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
    out = {"rc": proc.returncode, "timed_out": timed_out, "wall_s": round(time.time() - t0, 1)}
    if gpus:
        out["peak_mem_gib"] = mem.result()
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)  # the group of the process this script started (start_new_session)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            if sig == signal.SIGKILL:
                return
        except subprocess.TimeoutExpired:
            continue
    # the leader is gone but members of its group may linger (ray raylet, vLLM engine core)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def tail(path: Path, n: int = 25) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    keep = [l for l in lines if re.search(r"Error|error|Traceback|Exception|OOM|out of memory|Killed", l)]
    return (keep[-8:] + lines[-n:])[-n:]


def smi_rows(fields: list[str], timeout_s: float) -> list[list[str]]:
    """`nvidia-smi --query-gpu=<fields>` (CSV, no header, no units): one row of stripped values per GPU, the last
    field taking any commas of its own (a card's name); [] where nvidia-smi is absent or does not answer."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    n = len(fields) - 1
    return [[p.strip() for p in line.split(",", n)] for line in out.splitlines() if line.count(",") >= n]


def gpu_names() -> list[str]:
    seen = visible_devices()  # only the GPUs this script was given
    rows = smi_rows(["index", "uuid", "name"], timeout_s=30)
    return [name for idx, uuid, name in rows if not seen or idx in seen or uuid in seen]
