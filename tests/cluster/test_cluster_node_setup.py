"""scripts/ray_node_setup.sh: leader and rank discovery per environment, through `--print-plan` (starts nothing)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ray_node_setup.sh"
SCHEDULER_VARS = (
    "RLVR_",
    "SLURM_",
    "BEAKER_",
    "JOB_COMPLETION_INDEX",
    "KUBERAY_",
    "FQ_RAY_IP",
    "RAY_PORT",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "RAY_ADDRESS",
)


def plan(env: dict[str, str], *args: str, path: str | None = None) -> dict[str, str]:
    """The script's resolved plan as a dict (fails on a non-zero exit)."""
    res = run(env, "--print-plan", *args, path=path)
    assert res.returncode == 0, res.stderr
    return dict(line.split("=", 1) for line in res.stdout.splitlines())


def run(env: dict[str, str], *args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULER_VARS)}
    if path is not None:
        base["PATH"] = f"{path}:{base['PATH']}"
    return subprocess.run(["bash", str(SCRIPT), *args], env={**base, **env}, capture_output=True, text=True, timeout=30)


def test_cluster_plan_single_node_default() -> None:
    p = plan({}, "--", "rlvr", "train", "--num-steps", "2")
    assert (p["source"], p["role"], p["rank"], p["num_nodes"]) == ("none", "head", "0", "1")
    assert p["command"] == "rlvr train --num-steps 2"
    assert p["ray_start"].startswith("ray start --head --port 6379")


def test_cluster_plan_explicit() -> None:
    p = plan({"RLVR_HEAD_ADDRESS": "10.1.2.3:7000", "RLVR_NODE_RANK": "2", "RLVR_NUM_NODES": "4"})
    assert (p["source"], p["role"], p["rank"], p["head_address"], p["num_nodes"]) == (
        "explicit",
        "worker",
        "2",
        "10.1.2.3:7000",
        "4",
    )
    assert "--address 10.1.2.3:7000" in p["ray_start"] and "--block" in p["ray_start"]


def test_cluster_plan_beaker_leader_and_replica() -> None:
    env = {"BEAKER_LEADER_REPLICA_HOSTNAME": "node-a.beaker", "BEAKER_REPLICA_COUNT": "3"}
    lead = plan({**env, "BEAKER_REPLICA_RANK": "0"}, "--num-gpus", "8")
    assert (lead["source"], lead["role"], lead["head_address"], lead["num_nodes"]) == (
        "beaker",
        "head",
        "node-a.beaker:6379",
        "3",
    )
    assert "--num-gpus 8" in lead["ray_start"]
    rep = plan({**env, "BEAKER_REPLICA_RANK": "2"})
    assert (rep["role"], rep["rank"]) == ("worker", "2")


def test_cluster_plan_kubernetes_indexed_job() -> None:
    p = plan({"JOB_COMPLETION_INDEX": "3", "HOSTNAME": "rlvr-gpu-2node-3", "RLVR_K8S_SERVICE": "rlvr-gpu-2node"})
    assert (p["source"], p["role"], p["rank"]) == ("kubernetes", "worker", "3")
    assert p["head_address"] == "rlvr-gpu-2node-0.rlvr-gpu-2node:6379"
    p = plan({"JOB_COMPLETION_INDEX": "0", "RLVR_K8S_HEAD_HOST": "head.svc"})
    assert (p["role"], p["head_address"]) == ("head", "head.svc:6379")
    res = run({"JOB_COMPLETION_INDEX": "1"}, "--print-plan")
    assert res.returncode == 2 and "RLVR_K8S_SERVICE" in res.stderr


def test_cluster_plan_kuberay() -> None:
    head = plan({"KUBERAY_GEN_RAY_START_CMD": "ray start --head"})
    assert (head["source"], head["role"]) == ("kuberay", "head")
    assert head["ray_start"] == "<started by the KubeRay operator>"
    worker = plan({"KUBERAY_GEN_RAY_START_CMD": "ray start", "FQ_RAY_IP": "c-head-svc.ns.svc", "RAY_PORT": "6380"})
    assert (worker["role"], worker["head_address"]) == ("worker", "c-head-svc.ns.svc:6380")


@pytest.mark.parametrize(
    "nodelist,first",
    [("gpu[003-004,010],cpu1", "gpu003"), ("a1,a2", "a1"), ("node7", "node7"), ("r-1-[12-13]", "r-1-12")],
)
def test_cluster_plan_slurm_parses_nodelist(nodelist: str, first: str, tmp_path: Path) -> None:
    p = plan({"SLURM_JOB_NODELIST": nodelist, "SLURM_NODEID": "1", "SLURM_JOB_NUM_NODES": "4"})
    assert (p["source"], p["role"], p["rank"], p["head_address"], p["num_nodes"]) == (
        "slurm",
        "worker",
        "1",
        f"{first}:6379",
        "4",
    )


def test_cluster_plan_slurm_prefers_scontrol(tmp_path: Path) -> None:
    stub = tmp_path / "scontrol"
    stub.write_text('#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "expanded-1\\nexpanded-2\\n"\n')
    stub.chmod(0o755)
    p = plan({"SLURM_JOB_NODELIST": "weird[list", "SLURM_NODEID": "0"}, path=str(tmp_path))
    assert (p["role"], p["head_address"]) == ("head", "expanded-1:6379")


def test_cluster_plan_options_and_passthrough() -> None:
    p = plan(
        {
            "SLURM_JOB_NODELIST": "n[1-2]",
            "SLURM_NODEID": "0",
            "NCCL_SOCKET_IFNAME": "ib0",
            "GLOO_SOCKET_IFNAME": "eth0",
            "RLVR_RAY_TEMP_DIR": "/tmp/r1",
            "RLVR_RAY_START_ARGS": "--foo 1",
        },
        "--port",
        "7001",
        "--dashboard-port",
        "9001",
        "--num-cpus",
        "4",
    )
    assert p["head_address"] == "n1:7001" and p["temp_dir"] == "/tmp/r1"
    assert (p["nccl_socket_ifname"], p["gloo_socket_ifname"]) == ("ib0", "eth0")
    for piece in ("--port 7001", "--dashboard-port 9001", "--num-cpus 4", "--temp-dir /tmp/r1", "--foo 1"):
        assert piece in p["ray_start"]


def test_cluster_plan_precedence_and_errors() -> None:
    # The explicit variables win over a scheduler's (e.g. to override Slurm's first node).
    p = plan({"RLVR_HEAD_ADDRESS": "h", "RLVR_NODE_RANK": "0", "SLURM_JOB_NODELIST": "n1", "SLURM_NODEID": "1"})
    assert (p["source"], p["role"]) == ("explicit", "head")
    assert run({"RLVR_HEAD_ADDRESS": "h", "RLVR_NODE_RANK": "x"}, "--print-plan").returncode == 2
    assert run({"RLVR_HEAD_ADDRESS": "h"}, "--print-plan").returncode != 0  # rank is required with it
    assert run({}, "--bogus").returncode == 2
    res = run({}, "--help")
    assert res.returncode == 0 and "BEAKER_LEADER_REPLICA_HOSTNAME" in res.stdout
