"""A real three-node Ray cluster on one machine, started by scripts/ray_node_setup.sh exactly as a scheduler
would: a Slurm-style head (rank 0 of `127.0.0.[1-3]`), a Slurm-style worker and a Beaker-style worker, each
with its own ports and temp dir and one CPU. The head runs tiny `rlvr train` with two engines, so its
learner and engines cannot share a node; every process the three scripts started is gone at the end
(checked by PID), and the workers exit 0 once the head has gone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from rlvr.launch.local_cluster import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ray_node_setup.sh"
JOB = Path(__file__).with_name("multinode_job.py")
SCHEDULER_VARS = ("RLVR_", "SLURM_", "BEAKER_", "JOB_COMPLETION_INDEX", "KUBERAY_", "FQ_RAY_IP", "RAY_ADDRESS")
TRAIN = [
    "--num-steps",
    "2",
    "--cluster.num-engines",
    "2",
    "--rollout.prompts-per-step",
    "4",
    "--generation.num-samples",
    "4",
    "--eval.every-n-steps",
    "0",
    "--eval.at-step-0",
    "False",
    "--logging.console-progress",
    "False",
    "--logging.run-name",
    "multinode",
]


def _node(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen:
    base = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULER_VARS)}
    base.update(
        RLVR_HEAD_LOST_S="4",
        RLVR_HEAD_WAIT_S="90",
        RLVR_PYTHON=sys.executable,
        PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    )
    with open(log, "w") as f:
        return subprocess.Popen(
            ["bash", str(SCRIPT), "--num-cpus", "1", *args],
            env={**base, **env},
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )


def _descendants(procs: list[subprocess.Popen], seen: set[int]) -> None:
    for p in procs:
        try:
            seen.update(c.pid for c in psutil.Process(p.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass


def _alive(pids: set[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{pid} {' '.join(proc.cmdline())[:120]}")
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cluster_three_nodes_train_across_nodes(tmp_path: Path) -> None:
    pytest.importorskip("rlvr.orchestration.run")
    port, dash = free_port(), free_port()
    slurm = {"SLURM_JOB_NODELIST": "127.0.0.[1-3]", "SLURM_JOB_NUM_NODES": "3"}
    common = {"RLVR_RAY_PORT": str(port)}
    report = tmp_path / "report.json"
    # Ray's socket paths live under the temp dir and must stay under 107 bytes: short dirs in /tmp.
    short = Path(tempfile.mkdtemp(prefix="rlvr-mn-"))
    procs: list[subprocess.Popen] = []
    seen: set[int] = set()
    try:
        procs.append(
            _node(
                {
                    **slurm,
                    **common,
                    "SLURM_NODEID": "0",
                    "RLVR_RAY_TEMP_DIR": str(short / "r0"),
                    "RLVR_RAY_DASHBOARD_PORT": str(dash),
                    "RLVR_RAY_START_ARGS": f"--ray-client-server-port {free_port()} "
                    f"--dashboard-agent-listen-port {free_port()}",
                },
                tmp_path / "head.log",
                "--",
                sys.executable,
                str(JOB),
                str(report),
                str(tmp_path / "runs"),
                *TRAIN,
            )
        )
        procs.append(
            _node(
                {
                    **slurm,
                    **common,
                    "SLURM_NODEID": "1",
                    "RLVR_RAY_TEMP_DIR": str(short / "r1"),
                    "RLVR_RAY_START_ARGS": f"--dashboard-agent-listen-port {free_port()}",
                },
                tmp_path / "worker1.log",
            )
        )
        procs.append(
            _node(
                {
                    **common,
                    "BEAKER_LEADER_REPLICA_HOSTNAME": "127.0.0.1",
                    "BEAKER_REPLICA_RANK": "2",
                    "RLVR_RAY_TEMP_DIR": str(short / "r2"),
                    "RLVR_RAY_START_ARGS": f"--dashboard-agent-listen-port {free_port()}",
                },
                tmp_path / "worker2.log",
            )
        )
        deadline = time.monotonic() + 240
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if procs[0].poll() not in (None, 0):
                break  # the head failed: no point waiting for the workers' timeouts
            _descendants(procs, seen)
            time.sleep(1)
        codes = [p.poll() for p in procs]
        logs = "\n".join(
            f"== {n}\n" + (tmp_path / n).read_text()[-4000:] for n in ("head.log", "worker1.log", "worker2.log")
        )
        assert codes == [0, 0, 0], f"exit codes {codes}\n{logs}"
        result = json.loads(report.read_text())
        assert result["num_nodes"] == 3 and len(result["task_nodes"]) == 3, result
        assert result["train_rc"] == 0, logs
        nodes = result["actor_nodes"]
        assert len(nodes["EngineActor"]) == 2 and len(nodes["LearnerActor"]) == 1, nodes
        used = set(nodes["EngineActor"]) | set(nodes["LearnerActor"])
        assert len(used) == 3, f"actors did not spread over the nodes: {nodes}"  # 1 CPU per node
        metrics = (tmp_path / "runs" / "multinode" / "metrics.jsonl").read_text().splitlines()
        assert json.loads(metrics[-1])["step"] == 2
        assert len(seen) >= 6, f"too few Ray processes observed: {seen}"  # raylets, GCS, workers...
        end = time.monotonic() + 30
        while _alive(seen) and time.monotonic() < end:
            time.sleep(1)
        assert _alive(seen) == [], "processes left behind"
    finally:
        for p in procs:  # on failure: stop what this test started, by handle and recorded PID only
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=45)
            except subprocess.TimeoutExpired:
                p.kill()
        for pid in seen:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass
        shutil.rmtree(short, ignore_errors=True)
