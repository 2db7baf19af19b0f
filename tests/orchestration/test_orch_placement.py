"""Colocated placement on GPUs: learner i and engine i share GPU i (Ray with 2 logical GPUs, no CUDA needed).

Without the shared placement group Ray packs two 0.5-GPU learners onto one GPU, and NCCL then fails with
"invalid usage" at process-group setup (seen on 2 x H100 with --cluster.num-learners 2 --cluster.colocate).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, ray
    from rlvr.config import default_config, validate
    from rlvr.orchestration.actor_factory import ActorFactory

    ray.init(num_cpus=8, num_gpus=2, include_dashboard=False, log_to_driver=False)

    @ray.remote
    class Probe:
        def gpus(self):
            return [str(g) for g in ray.get_gpu_ids()]

    cfg = default_config()
    c = cfg.cluster
    c.colocate, c.device, c.num_learners, c.num_engines, c.gpus_per_node = True, "cuda", 2, 2, 2
    validate(cfg)
    f = ActorFactory(cfg, "/nonexistent", "cuda")
    strip = lambda o: {k: v for k, v in o.items() if k in ("num_cpus", "num_gpus", "scheduling_strategy")}
    learners = [Probe.options(**strip(f.colocated_options(f.learner_opts, i))).remote() for i in range(2)]
    engines = [Probe.options(**strip(f.colocated_options(f.engine_opts, i))).remote() for i in range(2)]
    placed = {"learners": ray.get([a.gpus.remote() for a in learners]),
              "engines": ray.get([a.gpus.remote() for a in engines])}
    for a in learners + engines:
        ray.kill(a)
    f.release()
    naive = [Probe.options(**strip(f.learner_opts)).remote() for _ in range(2)]
    placed["naive"] = ray.get([a.gpus.remote() for a in naive])
    print("PLACED " + json.dumps(placed))
""")


def test_colocated_learners_get_their_own_gpu_with_their_engine() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own cluster, with 2 logical GPUs
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240, env=env)
    line = [l for l in out.stdout.splitlines() if l.startswith("PLACED ")]
    assert out.returncode == 0 and line, out.stderr[-3000:]
    import json

    placed = json.loads(line[0][len("PLACED ") :])
    learners, engines = placed["learners"], placed["engines"]
    assert all(len(g) == 1 for g in learners + engines)
    assert learners[0] != learners[1], placed  # one learner rank per GPU (NCCL needs distinct devices)
    assert learners == engines, placed  # engine i sits on learner i's GPU (CUDA IPC and sleep/wake are per GPU)
    assert placed["naive"][0] == placed["naive"][1], placed  # the failure mode the placement group prevents
