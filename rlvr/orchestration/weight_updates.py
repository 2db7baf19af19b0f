"""The driver's side of a weight update (docs/design.md, Weight transport): learners -> engines after every optimizer step.

The transport (`rlvr.weight_sync.transport`: gloo, nccl, ipc, or shm for LoRA on one host) is what the actor factory
connected (`ActorFactory.connect_weight_sync`); learner and engine actors hold its sender and receivers, and every
kind runs the same sequence here, ordered by its `Steps`:
  [engines asleep (colocated vLLM): wake their weights] -> [`begin`: engines pause] -> every learner rank
  `send_weights` -> every engine `receive_weights` (during the send for a collective, else after it, given the
  sender's handoff) -> [wake the KV cache].
Waking the weights first and the KV cache last keeps peak GPU memory at one copy of the weights plus the learner's.
An engine that dies mid-update becomes an `EngineFailure` naming it (the driver replaces it and updates again); a
learner that dies or hangs becomes a `LearnerFailure`. Every `ray.get` has the actor timeout.
"""

from __future__ import annotations

import time
from typing import Any

import ray

from rlvr.orchestration.actors import learner_get
from rlvr.orchestration.health import EngineFailure, describe
from rlvr.weight_sync.transport import HANDOFF, steps

__all__ = ["WeightUpdater", "learner_get", "engine_sync_metrics"]


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
        kind = getattr(factory, "sync_transport", None) or factory.transport
        if not self.engines_asleep:
            return self._move(version, kind)
        t0 = time.perf_counter()
        self.engines("wake_up", ["weights"])  # the update lands in the weights (LoRA: the adapter slots live there)
        t1 = time.perf_counter()
        out = self._move(version, kind)
        t2 = time.perf_counter()
        self.engines("wake_up", ["kv_cache"])
        self.engines_asleep = False
        return {**out, "sync/wall_wake_s": t1 - t0 + time.perf_counter() - t2}

    def _move(self, version: int, kind: str) -> dict[str, float]:
        order = steps(kind)
        engines = self.actors.engines
        t0 = time.perf_counter()
        if order.begin:
            self.engines("begin_weight_sync")
        t1 = time.perf_counter()
        sends = [lrn.send_weights.remote(engines, version) for lrn in self.actors.learners]
        if order.concurrent:
            got = self._received(
                [e.receive_weights.remote(version, self.actors.factory.sync_info) for e in engines], cancel=sends[0]
            )
            t2 = time.perf_counter()  # the engines' receive ends with the collective: send and receive are one
            sent = dict(learner_get(sends, "send_weights", self.timeout)[0])
        else:
            sent = dict(learner_get(sends, "send_weights", self.timeout)[0])
            t2 = time.perf_counter()
            handoff = sent.pop(HANDOFF, None)
            got = self._received([e.receive_weights.remote(version, handoff) for e in engines])
        t3 = time.perf_counter()
        walls = {  # the driver's view of the phases, whatever the transport reports itself
            "sync/wall_begin_s": t1 - t0,
            "sync/wall_send_s": t2 - t1,
            "sync/wall_receive_s": t3 - t2,
        }
        return {**sent, **engine_sync_metrics(got), **walls}

    def _received(self, refs: list, cancel: Any = None) -> list[dict[str, float]]:
        """Every engine's receive; one that died is an `EngineFailure` (and the learners' send, a collective
        waiting for it, is cancelled)."""
        got = []
        for i, ref in enumerate(refs):
            try:
                got.append(ray.get(ref, timeout=self.timeout))
            except ray.exceptions.RayActorError as err:
                if cancel is not None:
                    ray.cancel(cancel, force=False)
                raise EngineFailure(i, f"died during weight sync: {describe(err)}") from err
        return got


def engine_sync_metrics(got: list[dict[str, float]]) -> dict[str, float]:
    """The slowest engine's load seconds (`sync/engine_load_s_max`) and phases (vLLM pause, transfer+load, finish,
    total, receive; with the staged NCCL sync the background receive `stage_s` and the generation lost `paused_s`:
    `sync/engine_<phase>_max`), where the receivers report them."""
    out: dict[str, float] = {}
    loads = [g["sync/load_s"] for g in got if "sync/load_s" in g]
    if loads:
        out["sync/engine_load_s_max"] = max(loads)
    for key in ("pause_s", "receive_load_s", "finish_s", "engine_total_s", "receive_s", "stage_s", "paused_s"):
        vals = [g[f"sync/{key}"] for g in got if f"sync/{key}" in g]
        if vals:
            out[f"sync/engine_{key.removeprefix('engine_')}_max"] = max(vals)
    staged = [g["sync/staged"] for g in got if "sync/staged" in g]
    if staged:  # --rollout.vllm-staged-sync: 0 where an engine had no room for the copy and paused instead
        out["sync/engine_staged_min"] = min(staged)
    return out
