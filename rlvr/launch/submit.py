"""`rlvr submit beaker|k8s|slurm`: write a job spec for a training run and submit it with the scheduler's CLI.

Node count and GPUs per node default to the config's `cluster` section. `--dry-run` prints the spec and
submits nothing. Otherwise the spec is written to `--output` (default: a fresh temporary file) and handed
to `beaker experiment create`, `kubectl apply -f` or `sbatch`; when that CLI is not on PATH the command
exits 2 naming it. Spec generation itself lives in `rlvr.launch.specs`.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from typing import Annotated, Literal

import tyro

from rlvr.cli.flags import parse
from rlvr.cli.outpaths import OutputPathError, check_output_file, write_text_atomic
from rlvr.config import ConfigError, ExperimentConfig, default_config, from_dict, read_yaml
from rlvr.launch.specs import DEFAULT_IMAGE, JobRequest, Mount, container_path, covered, parse_mount, render

_RESULTS = Mount("host", "/results", "/results")  # Beaker keeps the result directory as a dataset
SUBMIT_CLI = {"beaker": "beaker", "k8s": "kubectl", "slurm": "sbatch"}
SPEC_SUFFIX = {"beaker": ".beaker.yaml", "k8s": ".k8s.yaml", "slurm": ".sbatch"}
SPEC_OUTPUT_SUFFIXES = (".yaml", ".yml", ".sbatch", ".sh")
"""An existing --output file is replaced only with one of these suffixes (an earlier spec, outside any run
directory, not a symlink; rlvr.cli.outpaths); anything else exits 2 before the spec is built."""


@dataclasses.dataclass
class SubmitArgs:
    """Write (and submit) a Beaker, Kubernetes or Slurm job spec for a training run."""

    scheduler: Annotated[Literal["beaker", "k8s", "slurm"], tyro.conf.Positional]
    """Where to run: `beaker` (experiment spec), `k8s` (KubeRay RayJob or indexed Job), `slurm` (sbatch)."""
    config: str | None = None
    """rlvr config preset the job trains with (e.g. configs/gpu-2node.yaml, a path inside the image)."""
    command: str | None = None
    """The rlvr command run on the leader (default: `rlvr train --config CONFIG`)."""
    name: str | None = None
    """Job name (default: `rlvr-<config file stem>`)."""
    image: str = DEFAULT_IMAGE
    """Container image (docker/README.md builds it)."""
    num_nodes: int | None = None
    """Nodes (default: the config's cluster.num_nodes)."""
    gpus_per_node: int | None = None
    """GPUs per node (default: the config's cluster.gpus_per_node)."""
    env: list[str] = dataclasses.field(default_factory=list)
    """Environment variables for every node, `KEY=VALUE` (e.g. NCCL_SOCKET_IFNAME=eth0)."""
    secret: list[str] = dataclasses.field(default_factory=list)
    """Secrets by name as environment variables, `VAR=SECRET` (Kubernetes: `VAR=SECRET:KEY`), e.g.
    WANDB_API_KEY=wandb-key. Slurm has no secret store: the variable must be exported before sbatch."""
    shm_size_gib: int = 64
    """Shared memory (/dev/shm) per node in GiB."""
    mount: list[str] = dataclasses.field(default_factory=list)
    """Storage in every node's container, `KIND:SOURCE:TARGET`: `pvc:CLAIM:/opt/rlvr/runs` (Kubernetes),
    `host:/node/dir:/data` (Kubernetes hostPath, Beaker hostPath, Slurm with --slurm-container),
    `beaker:DATASET:/data` (Beaker). Put the run directory on one, or checkpoints die with the pod; on several
    nodes it must be shared storage (a ReadWriteMany claim): the learner writes checkpoints from any node."""
    output_dir: str | None = None
    """Run directory parent in the container, added to the default command as --checkpoint.output-dir (default:
    /results/runs on Beaker, which keeps /results; elsewhere the config's, relative to /opt/rlvr)."""
    cpus_per_node: int | None = None
    """CPUs requested per node (Kubernetes, Beaker; default: 8 per GPU, 4 without GPUs)."""
    memory_gib: int | None = None
    """Memory requested per node in GiB (Kubernetes, Beaker; default: 32 per GPU, 16 without GPUs)."""
    signal_lead_s: int = 300
    """Slurm: SIGTERM every task this many seconds before the time limit, so rlvr checkpoints (0 = off)."""
    k8s_flavor: Literal["kuberay", "job"] = "kuberay"
    """Kubernetes manifest: a KubeRay `RayJob` (needs the KubeRay operator) or an indexed `Job` plus
    headless `Service` (any cluster)."""
    namespace: str = "default"
    """Kubernetes namespace."""
    beaker_budget: str | None = None
    """Beaker budget account (required by Beaker to submit)."""
    beaker_workspace: str | None = None
    """Beaker workspace to create the experiment in (default: your default workspace)."""
    beaker_cluster: list[str] = dataclasses.field(default_factory=list)
    """Beaker clusters the task may run on."""
    beaker_priority: Literal["urgent", "high", "normal", "low", "preemptible"] = "normal"
    """Beaker priority."""
    partition: str | None = None
    """Slurm partition."""
    account: str | None = None
    """Slurm account."""
    time: str | None = None
    """Slurm time limit (e.g. 24:00:00)."""
    slurm_container: bool = False
    """Run Slurm tasks inside the image with pyxis/enroot (`srun --container-image`)."""
    output: str | None = None
    """Also write the spec to this file (default when submitting: a temporary file); its directory must exist, and
    an existing file is replaced only when it is an earlier spec (*.yaml, *.yml, *.sbatch, *.sh) outside any run
    directory."""
    dry_run: bool = False
    """Print the spec and exit without submitting."""


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} takes KEY=VALUE (got {item!r})")
        out[key] = value
    return out


def build_request(args: SubmitArgs) -> JobRequest:
    """The JobRequest for args: defaults from the config's cluster section; raises ConfigError."""
    cfg: ExperimentConfig = from_dict(read_yaml(args.config)) if args.config else default_config()
    stem = os.path.splitext(os.path.basename(args.config))[0] if args.config else "tiny-cpu"
    output_dir = args.output_dir or ("/results/runs" if args.scheduler == "beaker" else None)
    command = (
        shlex.split(args.command)
        if args.command
        else (
            ["rlvr", "train"]
            + (["--config", args.config] if args.config else [])
            + (["--checkpoint.output-dir", output_dir] if output_dir else [])
        )
    )
    num_nodes = args.num_nodes if args.num_nodes is not None else cfg.cluster.num_nodes
    gpus = args.gpus_per_node if args.gpus_per_node is not None else cfg.cluster.gpus_per_node
    if num_nodes < 1 or gpus < 0:
        raise ConfigError(f"--num-nodes must be >= 1 and --gpus-per-node >= 0 (got {num_nodes}, {gpus})")
    try:
        mounts = [parse_mount(item, args.scheduler) for item in args.mount]
    except ValueError as e:
        raise ConfigError(str(e)) from e
    cpus = args.cpus_per_node if args.cpus_per_node is not None else max(4, 8 * gpus)
    memory = args.memory_gib if args.memory_gib is not None else max(16, 32 * gpus)
    if cpus < 1 or memory < 1 or args.signal_lead_s < 0:
        raise ConfigError("--cpus-per-node and --memory-gib must be >= 1, --signal-lead-s >= 0")
    return JobRequest(
        name=args.name or f"rlvr-{stem}",
        command=command,
        num_nodes=num_nodes,
        gpus_per_node=gpus,
        image=args.image,
        env=_pairs(args.env, "--env"),
        secrets=_pairs(args.secret, "--secret"),
        shm_size_gib=args.shm_size_gib,
        beaker_budget=args.beaker_budget,
        beaker_workspace=args.beaker_workspace,
        beaker_clusters=list(args.beaker_cluster),
        beaker_priority=args.beaker_priority,
        k8s_namespace=args.namespace,
        slurm_partition=args.partition,
        slurm_account=args.account,
        slurm_time=args.time,
        slurm_container=args.slurm_container,
        mounts=mounts,
        cpus_per_node=cpus,
        memory_gib=memory,
        signal_lead_s=args.signal_lead_s,
    )


def storage_warning(args: SubmitArgs, req: JobRequest) -> str | None:
    """A warning when the run directory would live only in the container (lost with the pod or node)."""
    if args.scheduler == "slurm" and not args.slurm_container:
        return None  # the nodes' own (shared) filesystem
    cfg_dir = from_dict(read_yaml(args.config)).checkpoint.output_dir if args.config else "runs"
    runs = container_path(args.output_dir or ("/results/runs" if args.scheduler == "beaker" else cfg_dir))
    if covered(runs, req.mounts) or (args.scheduler == "beaker" and covered(runs, [_RESULTS])):
        return None
    example = {"k8s": "pvc:CLAIM", "slurm": "host:/shared/dir", "beaker": "host:/node/dir"}[args.scheduler]
    return (
        f"warning: the run directory {runs} is on no --mount: checkpoints are lost when the job's container "
        f"goes (add e.g. --mount {example}:{runs})"
    )


def submit_command(scheduler: str, path: str, req: JobRequest) -> list[str]:
    """The scheduler CLI call that submits the spec at path."""
    if scheduler == "beaker":
        ws = ["--workspace", req.beaker_workspace] if req.beaker_workspace else []
        return ["beaker", "experiment", "create", *ws, path]
    if scheduler == "k8s":
        return ["kubectl", "apply", "-f", path]
    return ["sbatch", path]


def main(argv: list[str]) -> int:
    """`rlvr submit SCHEDULER [flags]`; returns the scheduler CLI's exit status (2 for usage errors)."""
    args = parse(SubmitArgs, argv, "rlvr submit", SubmitArgs.__doc__)
    try:
        out = None if args.output is None else check_output_file(args.output, "--output", SPEC_OUTPUT_SUFFIXES)
        req = build_request(args)
    except (ConfigError, OutputPathError, OSError) as e:
        print(f"rlvr submit: {e}", file=sys.stderr)
        return 2
    warning = storage_warning(args, req)
    if warning:
        print(f"rlvr submit: {warning}", file=sys.stderr)
    flavor = args.k8s_flavor
    try:
        text = render(args.scheduler, req, k8s_flavor=flavor)
    except ValueError as e:  # a name or value that cannot go into the spec safely
        print(f"rlvr submit: {e}", file=sys.stderr)
        return 2
    if out is not None:
        try:
            write_text_atomic(out, text)
        except OSError as e:
            print(f"rlvr submit: --output {out}: {e}", file=sys.stderr)
            return 2
    if args.dry_run:
        sys.stdout.write(text)
        return 0
    if args.scheduler == "beaker" and not req.beaker_budget:
        print("rlvr submit: Beaker needs a budget: pass --beaker-budget (e.g. ai2/my-team)", file=sys.stderr)
        return 2
    cli = SUBMIT_CLI[args.scheduler]
    if shutil.which(cli) is None:
        print(
            f"rlvr submit: `{cli}` is not on PATH: install it to submit to {args.scheduler}, "
            "or use --dry-run (with --output FILE) to write the spec and submit it yourself",
            file=sys.stderr,
        )
        return 2
    path = None if out is None else str(out)
    if path is None:
        fd, path = tempfile.mkstemp(prefix=f"{req.name}-", suffix=SPEC_SUFFIX[args.scheduler])
        with os.fdopen(fd, "w") as f:
            f.write(text)
    cmd = submit_command(args.scheduler, path, req)
    print(f"rlvr submit: {shlex.join(cmd)}", file=sys.stderr)
    return subprocess.call(cmd)
