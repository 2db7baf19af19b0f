"""Job specs for the schedulers rlvr submits to: Beaker, Kubernetes (KubeRay `RayJob` or indexed `Job`), Slurm.

Pure functions from a `JobRequest` to the text of a spec (YAML or an sbatch script); `rlvr submit` writes
and submits them. The output is deterministic (no timestamps, stable key order), so golden files pin it.

Storage: `--mount KIND:SOURCE:TARGET` puts a volume at TARGET in every node's container: `pvc` (a Kubernetes
PersistentVolumeClaim), `host` (a directory of the node: Kubernetes hostPath, Beaker hostPath, a pyxis container
mount on Slurm), `beaker` (a Beaker dataset). The run directory (`checkpoint.output_dir`, relative to the image's
/opt/rlvr) must be on one of them or it dies with the pod; Beaker keeps `/results`, where its runs go by default.
Kubernetes containers request CPUs and memory; Slurm jobs get SIGTERM `signal_lead_s` before their time limit
(`#SBATCH --signal`), which rlvr answers with a checkpoint (exit 75). No YAML anchors are emitted.

Every spec runs one task per node. Except under KubeRay (whose operator starts Ray in each pod and runs
the entrypoint itself), each node runs `scripts/ray_node_setup.sh`, which finds the leader from the
scheduler's environment: Beaker's leader selection (BEAKER_LEADER_REPLICA_HOSTNAME), the indexed Job's
completion index plus a headless Service (pod 0 is `<name>-0.<name>`), Slurm's node list.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

import yaml

DEFAULT_IMAGE = "ghcr.io/rlvr/rlvr:0.1.0-cu130"
"""The image docker/Dockerfile builds (docker/README.md)."""
RAY_VERSION = "2.60.0"
"""The Ray version pinned in docker/Dockerfile (KubeRay's `rayVersion`)."""
IMAGE_WORKDIR = "/opt/rlvr"
"""Where the image holds the repository (configs/, scripts/); commands run from there."""
NODE_SETUP = "scripts/ray_node_setup.sh"
GCS_PORT = 6379
DASHBOARD_PORT = 8265


MOUNT_KINDS = {"beaker": ("host", "beaker"), "k8s": ("pvc", "host"), "slurm": ("host",)}


@dataclass(frozen=True)
class Mount:
    """A volume at `target` in every node's container (module docstring)."""

    kind: str
    source: str
    target: str


def parse_mount(item: str, scheduler: str) -> Mount:
    """`KIND:SOURCE:TARGET` (a PVC name, a node directory or a Beaker dataset; TARGET absolute); ValueError names
    the item and what the scheduler takes."""
    kinds = MOUNT_KINDS[scheduler]
    kind, _, rest = item.partition(":")
    source, _, target = rest.rpartition(":")
    forms = ", ".join(f"{k}:SOURCE:/path" for k in kinds)
    if kind not in kinds or not source or not target.startswith("/"):
        raise ValueError(f"--mount {item!r}: {scheduler} takes {forms} (an absolute path in the container)")
    if "," in item:
        raise ValueError(f"--mount {item!r}: no commas (give one --mount per volume)")
    if kind == "host" and not source.startswith("/"):
        raise ValueError(f"--mount {item!r}: a host directory must be an absolute path")
    if kind == "pvc" and dns_name(source) != source:
        raise ValueError(f"--mount {item!r}: {source!r} is not a valid claim name (lowercase letters, digits, '-')")
    return Mount(kind, source, target)


def covered(path: str, mounts: list[Mount]) -> bool:
    """Whether `path` (inside the container) lies on one of the mounts."""
    return any(path == m.target or path.startswith(m.target.rstrip("/") + "/") for m in mounts)


def container_path(path: str) -> str:
    """Where a config path (relative ones resolve against the image's working directory) is in the container."""
    return path if path.startswith("/") else f"{IMAGE_WORKDIR}/{path}".rstrip("/")


@dataclass
class JobRequest:
    """What to run and where; scheduler-specific fields are ignored by the other schedulers."""

    name: str
    """Job / experiment name (made DNS-safe for Kubernetes)."""
    command: list[str]
    """The rlvr command run once, on the leader (e.g. `rlvr train --config configs/gpu-2node.yaml`)."""
    num_nodes: int = 1
    gpus_per_node: int = 0
    image: str = DEFAULT_IMAGE
    env: dict[str, str] = field(default_factory=dict)
    """Plain environment variables for every node."""
    secrets: dict[str, str] = field(default_factory=dict)
    """Environment variable -> secret name (Kubernetes: `name` or `name:key`, key defaulting to the variable)."""
    shm_size_gib: int = 64
    """Shared memory (/dev/shm) per node in GiB: NCCL and Ray's object store use it."""
    beaker_budget: str | None = None
    beaker_workspace: str | None = None
    beaker_clusters: list[str] = field(default_factory=list)
    beaker_priority: str = "normal"
    k8s_namespace: str = "default"
    slurm_partition: str | None = None
    slurm_account: str | None = None
    slurm_time: str | None = None
    slurm_container: bool = False
    """Run each Slurm task in the image through pyxis/enroot (`srun --container-image`)."""
    mounts: list[Mount] = field(default_factory=list)
    """Volumes in every node's container (module docstring)."""
    cpus_per_node: int = 4
    """CPUs requested per node (Kubernetes requests, Beaker cpuCount)."""
    memory_gib: int = 16
    """Memory requested per node in GiB (Kubernetes requests, Beaker memory)."""
    signal_lead_s: int = 300
    """Slurm: SIGTERM this many seconds before the time limit (0 = none)."""


def dns_name(name: str) -> str:
    """A Kubernetes object name (RFC 1123 label: lowercase alphanumerics and '-', at most 63 characters)."""
    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].strip("-")
    return out or "rlvr"


def node_command(req: JobRequest) -> list[str]:
    """What every node runs: the node setup script, which runs req.command on the leader."""
    cmd = ["bash", NODE_SETUP]
    if req.gpus_per_node > 0:
        cmd += ["--num-gpus", str(req.gpus_per_node)]
    return cmd + ["--"] + list(req.command)


def base_env(req: JobRequest) -> dict[str, str]:
    """Environment shared by every node of every scheduler (user values win)."""
    return {"RLVR_NUM_NODES": str(req.num_nodes), "PYTHONUNBUFFERED": "1", **req.env}


class _NoAliases(yaml.SafeDumper):
    """A dumper that writes a shared object out again where it recurs, instead of a YAML anchor and alias
    (some tools and readers of the manifests do not resolve them)."""

    def ignore_aliases(self, data: object) -> bool:
        return True


def _dump(docs: list[dict]) -> str:
    return yaml.dump_all(docs, Dumper=_NoAliases, sort_keys=False, default_flow_style=False, width=120)


# --- Beaker ---------------------------------------------------------------------------------------------


def beaker_spec(req: JobRequest) -> str:
    """A Beaker experiment spec (v2): one task replicated per node, with leader selection."""
    env = [{"name": k, "value": v} for k, v in base_env(req).items()]
    env += [{"name": k, "secret": v} for k, v in req.secrets.items()]
    task: dict = {
        "name": dns_name(req.name),
        "image": {"docker": req.image},
        "command": node_command(req),
        "envVars": env,
        "resources": {
            "gpuCount": req.gpus_per_node,
            "cpuCount": req.cpus_per_node,
            "memory": f"{req.memory_gib}GiB",
            "sharedMemory": f"{req.shm_size_gib}GiB",
        },
        "context": {"priority": req.beaker_priority},
        "result": {"path": "/results"},
        "hostNetworking": True,
        "replicas": req.num_nodes,
        "leaderSelection": True,
        "propagateFailure": True,
    }
    if req.mounts:
        task["datasets"] = [
            {"source": {"hostPath" if m.kind == "host" else "beaker": m.source}, "mountPath": m.target}
            for m in req.mounts
        ]
    if req.beaker_clusters:
        task["constraints"] = {"cluster": list(req.beaker_clusters)}
    spec: dict = {"version": "v2"}
    if req.beaker_budget:
        spec["budget"] = req.beaker_budget
    spec["description"] = f"{req.name}: {req.num_nodes} node(s) x {req.gpus_per_node} GPU(s)"
    spec["tasks"] = [task]
    return _dump([spec])


# --- Kubernetes -----------------------------------------------------------------------------------------


def _k8s_env(req: JobRequest, extra: dict[str, str] | None = None) -> list[dict]:
    env: list[dict] = [{"name": k, "value": v} for k, v in {**base_env(req), **(extra or {})}.items()]
    for var, ref in req.secrets.items():
        secret, _, key = ref.partition(":")
        env.append({"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key or var}}})
    return env


def _pod_spec(req: JobRequest, container: dict) -> dict:
    volumes: list[dict] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{req.shm_size_gib}Gi"}}]
    mounts: list[dict] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    for i, m in enumerate(req.mounts):
        source = (
            {"persistentVolumeClaim": {"claimName": m.source}}
            if m.kind == "pvc"
            else {"hostPath": {"path": m.source, "type": "DirectoryOrCreate"}}
        )
        volumes.append({"name": f"storage-{i}", **source})
        mounts.append({"name": f"storage-{i}", "mountPath": m.target})
    container = {
        "name": container.pop("name"),
        "image": req.image,
        "imagePullPolicy": "IfNotPresent",
        **container,
        "volumeMounts": mounts,
    }
    requests = {"cpu": str(req.cpus_per_node), "memory": f"{req.memory_gib}Gi"}
    container["resources"] = {"requests": requests}
    if req.gpus_per_node > 0:
        gpus = str(req.gpus_per_node)
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}, "requests": {**requests, "nvidia.com/gpu": gpus}}
    return {"containers": [container], "volumes": volumes}


def k8s_job_manifests(req: JobRequest) -> str:
    """A headless Service plus an indexed Job of num_nodes pods (for clusters without KubeRay)."""
    name = dns_name(req.name)
    labels = {"app.kubernetes.io/name": "rlvr", "rlvr/job": name}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": req.k8s_namespace, "labels": labels},
        "spec": {
            "clusterIP": "None",
            "selector": {"rlvr/job": name},
            "publishNotReadyAddresses": True,
            "ports": [{"name": "gcs", "port": GCS_PORT}, {"name": "dashboard", "port": DASHBOARD_PORT}],
        },
    }
    container = {
        "name": "rlvr",
        "workingDir": IMAGE_WORKDIR,
        "command": node_command(req),
        "env": _k8s_env(req, {"RLVR_K8S_SERVICE": name}),
    }
    pod = {"subdomain": name, "restartPolicy": "Never", **_pod_spec(req, container)}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": req.k8s_namespace, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": req.num_nodes,
            "parallelism": req.num_nodes,
            "backoffLimit": 0,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }
    return _dump([service, job])


def kuberay_rayjob(req: JobRequest) -> str:
    """A KubeRay `RayJob`: the operator starts a head and num_nodes - 1 workers and runs the command."""
    name = dns_name(req.name)
    start: dict[str, str] = {"num-gpus": str(req.gpus_per_node)} if req.gpus_per_node > 0 else {}
    head = _pod_spec(
        req,
        {
            "name": "ray-head",
            "workingDir": IMAGE_WORKDIR,
            "env": _k8s_env(req),
            "ports": [
                {"name": "gcs", "containerPort": GCS_PORT},
                {"name": "dashboard", "containerPort": DASHBOARD_PORT},
            ],
        },
    )
    cluster: dict = {
        "rayVersion": RAY_VERSION,
        "headGroupSpec": {"rayStartParams": {"dashboard-host": "0.0.0.0", **start}, "template": {"spec": head}},
    }
    if req.num_nodes > 1:
        worker = _pod_spec(req, {"name": "ray-worker", "workingDir": IMAGE_WORKDIR, "env": _k8s_env(req)})
        n = req.num_nodes - 1
        cluster["workerGroupSpecs"] = [
            {
                "groupName": "workers",
                "replicas": n,
                "minReplicas": n,
                "maxReplicas": n,
                "rayStartParams": dict(start),
                "template": {"spec": worker},
            }
        ]
    rayjob = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "namespace": req.k8s_namespace, "labels": {"app.kubernetes.io/name": "rlvr"}},
        "spec": {
            "entrypoint": shlex.join(req.command),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "rayClusterSpec": cluster,
        },
    }
    return _dump([rayjob])


# --- Slurm ----------------------------------------------------------------------------------------------

_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_shell_inputs(req: JobRequest) -> None:
    """Names that go into the script verbatim must be shell identifiers and #SBATCH values one plain word each
    (values of --env are quoted, so they may hold anything)."""
    for flag, names in (("--env", req.env), ("--secret", req.secrets)):
        for key in names:
            if not _SHELL_NAME.fullmatch(key):
                raise ValueError(f"{flag} {key!r}: a variable name must match [A-Za-z_][A-Za-z0-9_]*")
    for flag, value in (
        ("--partition", req.slurm_partition),
        ("--account", req.slurm_account),
        ("--time", req.slurm_time),
    ):
        if value and not re.fullmatch(r"[A-Za-z0-9_.:,+@%=/-]+", value):
            raise ValueError(f"{flag} {value!r}: only letters, digits and _ . : , + @ % = / - are allowed")


def sbatch_script(req: JobRequest) -> str:
    """An sbatch script: one task per node, each running the node setup script through srun. Every value of
    the user's is quoted with shlex.quote or checked to be one plain word (`_check_shell_inputs`)."""
    _check_shell_inputs(req)
    name = dns_name(req.name)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={req.num_nodes}",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --exclusive",
        f"#SBATCH --output={name}-%j.out",
    ]
    if req.signal_lead_s > 0:  # every task's setup script passes it to rlvr, which checkpoints and exits 75
        lines.append(f"#SBATCH --signal=TERM@{req.signal_lead_s}")
    if req.gpus_per_node > 0:
        lines.append(f"#SBATCH --gpus-per-node={req.gpus_per_node}")
    for flag, value in (("partition", req.slurm_partition), ("account", req.slurm_account), ("time", req.slurm_time)):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    lines += [
        "# Generated by `rlvr submit slurm`: every node runs scripts/ray_node_setup.sh, which makes the",
        "# first node of SLURM_JOB_NODELIST the Ray head and runs the rlvr command there.",
        "set -euo pipefail",
    ]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in base_env(req).items()]
    for var in req.secrets:
        lines.append(
            f': "${{{var}:?export {var} (secret {req.secrets[var]}) before sbatch: Slurm has no secret store}}"'
        )
        lines.append(f"export {var}")
    srun = ["srun", f"--nodes={req.num_nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if req.slurm_container:
        srun += [f"--container-image={pyxis_image(req.image)}", f"--container-workdir={IMAGE_WORKDIR}"]
        if req.mounts:
            srun.append("--container-mounts=" + ",".join(f"{m.source}:{m.target}" for m in req.mounts))
    elif req.mounts:
        raise ValueError(
            "--mount on Slurm needs --slurm-container (without a container the nodes' own "
            "filesystems are used as they are)"
        )
    lines.append(shlex.join(srun + node_command(req)))
    return "\n".join(lines) + "\n"


def pyxis_image(image: str) -> str:
    """An image reference in enroot/pyxis form, `REGISTRY#IMAGE` (`ghcr.io/a/b:t` -> `ghcr.io#a/b:t`); images
    without a registry host (Docker Hub: `ubuntu:24.04`) stay as they are."""
    head, sep, rest = image.partition("/")
    if sep and ("." in head or ":" in head or head == "localhost") and "#" not in image:
        return f"{head}#{rest}"
    return image


def render(scheduler: str, req: JobRequest, k8s_flavor: str = "kuberay") -> str:
    """The spec text for scheduler (`beaker`, `k8s`, `slurm`)."""
    if scheduler == "beaker":
        return beaker_spec(req)
    if scheduler == "k8s":
        return kuberay_rayjob(req) if k8s_flavor == "kuberay" else k8s_job_manifests(req)
    if scheduler == "slurm":
        return sbatch_script(req)
    raise ValueError(f"unknown scheduler {scheduler!r}: use beaker, k8s or slurm")
