"""The driver's side of a LoRA weight update (rlvr.orchestration.weight_updates) against fake Ray actors: through
shared memory the learner writes first and every engine then loads that path; engines that slept while the learner
trained (colocated vLLM) wake their weights before the adapter lands and their KV cache after; the path never
reaches the metrics."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray

from rlvr.orchestration.weight_updates import WeightUpdater


@ray.remote
class _Log:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def add(self, call: str) -> None:
        self.calls.append(call)

    def get(self) -> list[str]:
        return self.calls


@ray.remote
class _Engine:
    def __init__(self, log, index: int) -> None:
        self.log, self.index = log, index

    def sleep(self, level: int) -> None:
        ray.get(self.log.add.remote(f"e{self.index} sleep {level}"))

    def wake_up(self, tags: list[str]) -> None:
        ray.get(self.log.add.remote(f"e{self.index} wake {','.join(tags)}"))

    def receive_weights(self, version: int, path: str) -> dict:
        ray.get(self.log.add.remote(f"e{self.index} load {path} v{version}"))
        return {"sync/load_s": 0.5 + self.index}


@ray.remote
class _Learner:
    def __init__(self, log) -> None:
        self.log = log

    def send_weights(self, engines, version: int) -> dict:
        ray.get(self.log.add.remote(f"learner write v{version}"))
        return {"handoff": f"/dev/shm/adapter-v{version}", "sync/seconds": 0.01, "sync/bytes": 100.0}


@pytest.mark.parametrize("asleep", [False, True], ids=["awake", "colocated-asleep"])
def test_shared_memory_adapter_update_order(ray_cluster, asleep):
    log = _Log.remote()
    factory = SimpleNamespace(transport="gloo", sync_transport="shm", colocated=True)
    actors = SimpleNamespace(
        learners=[_Learner.remote(log)], engines=[_Engine.remote(log, i) for i in range(2)], factory=factory
    )
    updater = WeightUpdater(actors, timeout_s=60)
    if asleep:
        updater.sleep_engines()
    out = updater.sync(3)
    calls = ray.get(log.get.remote())
    loads = sorted(c for c in calls if " load " in c)
    assert loads == ["e0 load /dev/shm/adapter-v3 v3", "e1 load /dev/shm/adapter-v3 v3"]
    assert calls.index("learner write v3") < min(calls.index(c) for c in loads)
    if asleep:
        for i in (0, 1):
            assert (
                calls.index(f"e{i} sleep 1")
                < calls.index(f"e{i} wake weights")
                < calls.index(f"e{i} load /dev/shm/adapter-v3 v3")
                < calls.index(f"e{i} wake kv_cache")
            )
        assert not updater.engines_asleep
    else:
        assert not any("wake" in c for c in calls)
    walls = {k: out.pop(k) for k in list(out) if k.startswith("sync/wall_")}  # the driver's phase timings
    assert out == {"sync/seconds": 0.01, "sync/bytes": 100.0, "sync/engine_load_s_max": 1.5}
    phases = ["sync/wall_begin_s", "sync/wall_send_s", "sync/wall_receive_s"] + ["sync/wall_wake_s"] * asleep
    assert sorted(walls) == sorted(phases) and all(v >= 0 for v in walls.values())
