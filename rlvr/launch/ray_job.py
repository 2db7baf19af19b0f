"""`rlvr launch`: one command from a config to a training run on a Ray cluster.

Steps: resolve the config exactly as `rlvr train` does (same `--config` and override flags); find the
cluster (`--address`, else `cluster.address`, else `$RAY_ADDRESS`, else start a single-node head here);
check that the actors fit the resources Ray reports (`check_resources`; the error shows the arithmetic,
exit 2); write the resolved config to a file and submit `rlvr train --config config.yaml` as a Ray job
whose working_dir holds that file; stream the job's logs; return the job's exit status. A head started
here is stopped (by its PID) when the job ends.

Relative paths in the config (output dir, local dataset files) are made absolute against the directory
`rlvr launch` runs in, because the job runs in a temporary working_dir of Ray's: on a cluster that
directory should be on storage every node shares.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shlex
import shutil
import sys
import tempfile
import time
from typing import Annotated

import tyro

from rlvr.cli.flags import parse
from rlvr.config import ConfigError, ExperimentConfig, check_resources, to_yaml

JOB_EXIT_STOPPED = 130


@dataclasses.dataclass
class LaunchArgs:
    """Start or join a Ray cluster, check its resources, and run training as a Ray job.

    Every `rlvr train` flag is accepted as well (`--config PRESET`, `--section.field value`, `--dry-run`);
    see `rlvr train --help`."""

    address: Annotated[str | None, tyro.conf.arg(name="address")] = None
    """Ray (GCS) address of a running cluster, e.g. `10.0.0.1:6379` (default: the config's
    `cluster.address`, else $RAY_ADDRESS, else start a single-node cluster here for this run)."""
    dashboard_url: str | None = None
    """Job-submission URL when it is not the one Ray reports (e.g. a port-forward: `http://localhost:8265`)."""
    num_cpus: int | None = None
    """CPUs the local cluster offers (only when rlvr starts it; default: Ray counts them)."""
    num_gpus: int | None = None
    """GPUs the local cluster offers (only when rlvr starts it; default: Ray counts them)."""
    temp_dir: str | None = None
    """Ray temp dir of the local cluster (only when rlvr starts it; default: a fresh one, removed after)."""
    job_id: str | None = None
    """Ray job id (default: `rlvr-<run name or time>`)."""
    no_wait: bool = False
    """Submit and return without streaming logs (the job keeps running; follow it with `ray job logs -f`)."""


def _split_argv(argv: list[str]) -> tuple[LaunchArgs, list[str]]:
    args, rest = parse(LaunchArgs, argv, "rlvr launch", LaunchArgs.__doc__, return_unknown_args=True)
    return args, list(rest)


def _absolute_paths(cfg: ExperimentConfig, base: str) -> ExperimentConfig:
    """Copy of cfg whose relative output dir and existing local dataset files are absolute against base."""
    cfg = dataclasses.replace(cfg)
    out = cfg.checkpoint.output_dir
    if not os.path.isabs(out):
        cfg.checkpoint = dataclasses.replace(cfg.checkpoint, output_dir=os.path.join(base, out))
    datasets = [
        os.path.join(base, d) if not os.path.isabs(d) and os.path.exists(os.path.join(base, d)) else d
        for d in cfg.data.datasets
    ]
    cfg.data = dataclasses.replace(cfg.data, datasets=datasets)
    return cfg


def cluster_resources(address: str) -> tuple[float, float, str]:
    """(GPUs, CPUs, dashboard URL) that the Ray cluster at address reports."""
    import ray

    ctx = ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
    try:
        res = ray.cluster_resources()
        dashboard = ctx.dashboard_url or ""
    finally:
        ray.shutdown()
    if dashboard and not dashboard.startswith("http"):
        dashboard = "http://" + dashboard
    return float(res.get("GPU", 0)), float(res.get("CPU", 0)), dashboard


def resource_error(cfg: ExperimentConfig, num_gpus: float, num_cpus: float) -> str | None:
    """The `check_resources` message when the config's actors do not fit, else None."""
    try:
        check_resources(cfg, num_gpus=num_gpus, num_cpus=num_cpus)
    except ConfigError as e:
        return str(e)
    return None


def write_job_dir(cfg: ExperimentConfig) -> str:
    """A fresh directory holding `config.yaml` (the resolved config): the job's working_dir."""
    job_dir = tempfile.mkdtemp(prefix="rlvr-launch-")
    with open(os.path.join(job_dir, "config.yaml"), "w") as f:
        f.write(to_yaml(cfg))
    return job_dir


async def _stream(client: object, job_id: str) -> None:
    async for lines in client.tail_job_logs(job_id):  # type: ignore[attr-defined]
        sys.stdout.write(lines)
        sys.stdout.flush()


def run_job(dashboard_url: str, cfg: ExperimentConfig, job_id: str, wait: bool = True) -> int:
    """Submit `rlvr train --config config.yaml` with the config as working_dir; return its exit status."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(dashboard_url)
    job_dir = write_job_dir(cfg)
    entrypoint = "rlvr train --config config.yaml"
    try:  # submit_job uploads the working_dir before it returns: the local copy is not needed after
        client.submit_job(
            entrypoint=entrypoint,
            submission_id=job_id,
            runtime_env={"working_dir": job_dir, "env_vars": {"PYTHONUNBUFFERED": "1"}},
        )
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
    print(f"rlvr launch: submitted job {job_id} to {dashboard_url}: {entrypoint}", file=sys.stderr)
    if not wait:
        print(f"rlvr launch: follow it with `ray job logs -f --address {dashboard_url} {job_id}`", file=sys.stderr)
        return 0
    try:
        asyncio.run(_stream(client, job_id))
    except KeyboardInterrupt:
        print(f"\nrlvr launch: interrupted; stopping job {job_id}", file=sys.stderr)
        client.stop_job(job_id)
    while not (status := client.get_job_status(job_id)).is_terminal():
        time.sleep(0.5)
    info = client.get_job_info(job_id)
    print(f"rlvr launch: job {job_id} {status.value}" + (f": {info.message}" if info.message else ""), file=sys.stderr)
    if status == JobStatus.SUCCEEDED:
        return 0
    if status == JobStatus.STOPPED:
        return JOB_EXIT_STOPPED
    code = getattr(info, "driver_exit_code", None)
    return int(code) if code else 1


def _default_job_id(cfg: ExperimentConfig) -> str:
    name = cfg.logging.run_name or "run"
    return f"rlvr-{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def main(argv: list[str]) -> int:
    """`rlvr launch [launch flags] [rlvr train flags]`; returns the training job's exit status."""
    from rlvr.cli.train_args import parse_train_args
    from rlvr.launch.local_cluster import token_auth_env

    # Before Ray is imported (it reads the mode once): join with the auth mode a head here would use.
    os.environ.update(token_auth_env())
    args, train_argv = _split_argv(argv)
    try:
        train = parse_train_args(train_argv)
    except ConfigError as e:
        print(f"rlvr launch: config error: {e}", file=sys.stderr)
        return 2
    cfg = _absolute_paths(train.experiment, os.getcwd())
    if train.dry_run:
        sys.stdout.write(to_yaml(cfg))
        print("# job entrypoint: " + shlex.join(["rlvr", "train", "--config", "config.yaml"]))
        return 0
    address = args.address or cfg.cluster.address or os.environ.get("RAY_ADDRESS") or None
    head = None
    if address is None:
        from rlvr.launch.local_cluster import LocalRayHead

        head = LocalRayHead(num_cpus=args.num_cpus, num_gpus=args.num_gpus, temp_dir=args.temp_dir).start()
        address = head.address
        print(f"rlvr launch: started a local Ray head at {address} (dashboard {head.dashboard_url})", file=sys.stderr)
    try:
        num_gpus, num_cpus, dashboard = cluster_resources(address)
        if (err := resource_error(cfg, num_gpus, num_cpus)) is not None:
            print(
                f"rlvr launch: the cluster at {address} is too small for this config:\n  {err}\n"
                "  Lower --cluster.num-learners / --cluster.num-engines, or add nodes or GPUs.",
                file=sys.stderr,
            )
            return 2
        url = args.dashboard_url or (head.dashboard_url if head else dashboard)
        return run_job(url, cfg, args.job_id or _default_job_id(cfg), wait=not args.no_wait)
    finally:
        if head is not None:
            head.stop()
