"""The driver's side of a weight update (INTERFACES §4): learners -> engines after every optimizer step.

Two transports, picked by the actor factory:
- broadcast (NCCL on GPUs, gloo on CPU): learner rank 0 sends while every engine receives; an engine that
  dies mid-update becomes an `EngineFailure` naming it (the driver replaces it and updates again).
- `ipc` (colocated): the engines slept while the learners trained; wake the weights, stream CUDA IPC chunks,
  finish, then bring the KV cache back (keeps peak GPU memory at one copy of the weights plus the learner's).
- LoRA (`learner.lora_rank` > 0) moves only the adapter: through shared memory when every engine shares learner
  rank 0's host (`shm`: rank 0 writes a PEFT directory under /dev/shm, the engines load it), else broadcast over
  gloo; sleeping engines wake their weights first (the adapter slots live there) and their KV cache after.

Every `ray.get` has the actor timeout; a learner that dies or hangs becomes a `LearnerFailure`.
"""

from __future__ import annotations

from typing import Any

import ray

from rlvr.orchestration.health import EngineFailure, LearnerFailure, describe


class WeightUpdater:
    """Moves the learners' weights into the engines and reports where the update's time went."""

    def __init__(self, actors: Any, timeout_s: float) -> None:
        self.actors = actors
        self.timeout = timeout_s
        self.engines_asleep = False

    @property
    def colocated(self) -> bool:
        return self.actors.factory.colocated

    def engines(self, method: str, *args: Any) -> list:
        return ray.get([getattr(e, method).remote(*args) for e in self.actors.engines], timeout=self.timeout)

    def sleep_engines(self) -> None:
        """Colocated: free the engines' GPU memory for the learner's step (woken by `sync`)."""
        self.engines("sleep", 1)
        self.engines_asleep = True

    def sync(self, version: int) -> dict[str, float]:
        """Every engine ends at `version` with the learners' weights; returns the `sync/*` metrics."""
        factory = self.actors.factory
        transport = getattr(factory, "sync_transport", None) or factory.transport
        if transport == "ipc":
            return self._sync_ipc(version)
        move = self._sync_shm if transport == "shm" else self._sync_broadcast
        if not self.engines_asleep:
            return move(version)
        self.engines("wake_up", ["weights"])  # colocated LoRA: the adapter slots live with the weights
        out = move(version)
        self.engines("wake_up", ["kv_cache"])
        self.engines_asleep = False
        return out

    def _sync_ipc(self, version: int) -> dict[str, float]:
        if self.engines_asleep:
            self.engines("wake_up", ["weights"])
        self.engines("begin_weight_update")
        sent = learner_get([lrn.send_weights.remote(self.actors.engines, version) for lrn in self.actors.learners],
                           "send_weights", self.timeout)[0]
        self.engines("finish_weight_update", version)
        if self.engines_asleep:
            self.engines("wake_up", ["kv_cache"])
            self.engines_asleep = False
        return dict(sent)

    def _sync_shm(self, version: int) -> dict[str, float]:
        """LoRA on one host: learner rank 0 writes the adapter (PEFT directory) into shared memory, then every
        engine loads it from there."""
        sent = dict(learner_get([lrn.send_weights.remote(None, version) for lrn in self.actors.learners],
                                "send_weights", self.timeout)[0])
        path = sent.pop("path")
        refs = [e.load_adapter.remote(path, version) for e in self.actors.engines]
        got = []
        for i, ref in enumerate(refs):
            try:
                got.append(ray.get(ref, timeout=self.timeout))
            except ray.exceptions.RayActorError as err:
                raise EngineFailure(i, f"died during weight sync: {describe(err)}") from err
        sent["sync/engine_load_s_max"] = max(got)
        return sent

    def _sync_broadcast(self, version: int) -> dict[str, float]:
        refs = [lrn.send_weights.remote() for lrn in self.actors.learners]
        recv = [e.receive_weights.remote(version, self.actors.factory.sync_info) for e in self.actors.engines]
        got = []
        for i, ref in enumerate(recv):
            try:
                got.append(ray.get(ref, timeout=self.timeout))
            except ray.exceptions.RayActorError as err:
                ray.cancel(refs[0], force=False)
                raise EngineFailure(i, f"died during weight sync: {describe(err)}") from err
        out = dict(learner_get(refs, "send_weights", self.timeout)[0])
        out["sync/engine_load_s_max"] = max(g["sync/load_s"] for g in got)
        for key in ("pause_s", "receive_load_s", "finish_s", "engine_total_s", "receive_s"):
            vals = [g[f"sync/{key}"] for g in got if f"sync/{key}" in g]
            if vals:  # where an update's time goes on the engines (vLLM pause, transfer+load, resume)
                out[f"sync/engine_{key.removeprefix('engine_')}_max"] = max(vals)
        return out


def learner_get(refs: list, what: str, timeout_s: float) -> list:
    """ray.get on one call per learner rank; a dead or hung rank becomes a `LearnerFailure` naming it."""
    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError as e:
        raise LearnerFailure(0, f"{what} did not finish within --cluster.actor-timeout-s {timeout_s:g}") from e
    except ray.exceptions.RayActorError as e:
        index = next((i for i, r in enumerate(refs) if _failed(r)), 0)
        raise LearnerFailure(index, f"died during {what}: {describe(e)}") from e


def _failed(ref: Any) -> bool:
    try:
        ray.get(ref, timeout=0)
        return False
    except ray.exceptions.GetTimeoutError:
        return False
    except Exception:  # noqa: BLE001 - probing which call failed
        return True
