"""The leader's command in test_cluster_multinode.py: runs on a Ray cluster started by ray_node_setup.sh.

1. A placement group with one 1-CPU bundle per node (STRICT_SPREAD) runs a task on every node and records
   the node ids (proves the cluster, with or without the trainer).
2. `rlvr train` with tiny settings and two engines runs against the same cluster (RAY_ADDRESS), then the
   nodes its learner and engine actors ran on are read from Ray's state API.
The JSON report goes to argv[1]; argv[2] is the run's output dir; the remaining arguments go to `rlvr train`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.state import list_actors


@ray.remote(num_cpus=1)
def node_id() -> str:
    return ray.get_runtime_context().get_node_id()


def spread_check() -> dict:
    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
    num_nodes = sum(1 for n in ray.nodes() if n["Alive"])
    pg = placement_group([{"CPU": 1}] * num_nodes, strategy="STRICT_SPREAD")
    ray.get(pg.ready(), timeout=60)
    ids = ray.get(
        [node_id.options(placement_group=pg, placement_group_bundle_index=i).remote() for i in range(num_nodes)],
        timeout=60,
    )
    remove_placement_group(pg)
    ray.shutdown()
    return {"num_nodes": num_nodes, "task_nodes": sorted(set(ids))}


def actor_nodes() -> dict[str, list[str]]:
    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
    out: dict[str, list[str]] = {}
    for actor in list_actors(detail=True, limit=1000, raise_on_missing_output=False):
        if actor.class_name in ("LearnerActor", "EngineActor"):
            out.setdefault(actor.class_name, []).append(actor.node_id)
    ray.shutdown()
    return out


def main() -> int:
    report_path, output_dir, train_args = sys.argv[1], sys.argv[2], sys.argv[3:]
    report = spread_check()
    cmd = ["rlvr", "train", "--checkpoint.output-dir", output_dir, *train_args]
    report["train_rc"] = subprocess.call(cmd)
    report["actor_nodes"] = actor_nodes()
    with open(report_path, "w") as f:
        json.dump(report, f)
    return report["train_rc"]


if __name__ == "__main__":
    sys.exit(main())
