"""Deployment tooling, outside the training loop.

- `ray_job`: `rlvr launch`: resolve the config, find or start a Ray cluster, check resources, run training as a Ray
  job and stream its logs.
- `local_cluster`: a private single-node Ray head for a run on one machine (started and stopped by PID), and
  `free_port`.
- `specs`: Beaker, Kubernetes (RayJob, Job) and Slurm job specs rendered from a `JobRequest`.
- `submit`: `rlvr submit`: writes (and optionally submits) those specs.
"""
