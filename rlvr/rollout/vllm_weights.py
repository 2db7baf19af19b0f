"""The vLLM engine's weight updates (engine side): vLLM's weight-transfer sessions (NCCL broadcast, CUDA IPC chunks)
and LoRA adapters loaded in place, from a PEFT directory (`add_lora`) or from the learners' shared GPU buffer
(`load_adapter_ipc`: rlvr's worker extension, `rlvr.rollout.vllm_lora_ipc`, through `collective_rpc`). `VLLMWeightUpdates` is a mixin of `rlvr.rollout.vllm_engine.VLLMEngine`, split out
of it; the update protocol and its invariants are that module's docstring. vllm is imported only inside methods (they
run on the GPU machine only), so importing this module needs no vllm.

The mixin uses the engine's loop (`_call`), its `AsyncLLM` (`_llm`), admission state (`_updating`, `_pump`), failure
(`_fail`, `_raise_if_failed`), version and counters, and LoRA state (`_adapters`, `_lora_request`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

import torch

from rlvr.rollout.base import EngineError
from rlvr.rollout.lora import ADAPTER_NAME

logger = logging.getLogger("rlvr.rollout.vllm_engine")  # the engine's own log name, as before the split
SETTLE_S = 0.02  # the most `_pause` waits for drained outputs (vLLM's own fixed settling sleep)
STAGE_POLL_S = 0.005  # staged sync: how often the engine asks its workers whether the background receive is done
T = TypeVar("T")

LORA_ID = 1
"""vLLM's id of the policy's adapter (ids start at 1); every update replaces it in place."""


def allow_ipc_handles() -> None:
    """The engine core's workers unpickle the CUDA IPC handles of our own learner (`ipc_handles_pickled`; vLLM refuses
    without VLLM_ALLOW_INSECURE_SERIALIZATION): set before vLLM spawns them, so that they inherit it."""
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"


def pickled_ipc_handles(update_info: dict[str, Any]) -> dict[str, Any]:
    """An IPC chunk's update info as vLLM's engine-core RPC can carry it: CUDA IPC handles hold torch classes and
    dtypes, which its msgpack cannot encode, so they travel pickled (as vLLM's HTTP client sends them)."""
    handles = update_info.get("ipc_handles")
    if handles is None:
        return update_info
    import base64
    import pickle

    out = {k: v for k, v in update_info.items() if k != "ipc_handles"}
    out["ipc_handles_pickled"] = base64.b64encode(pickle.dumps(handles)).decode("ascii")
    return out


class VLLMWeightUpdates:
    """LoRA adapters and vLLM weight-transfer sessions (mixed into `VLLMEngine`)."""

    # ------------------------------------------------------------------ LoRA adapters
    def load_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """LoRA: serve these adapter tensors (PEFT on-disk names, any device) from now on: written to shared memory,
        then loaded in place (`load_adapter_dir`). Full weights reach vLLM only through its weight-transfer API
        (`receive_weights_nccl`, or IPC chunks between `begin_weight_update` and `finish_weight_update`)."""
        if self._adapters is None:
            raise ValueError(f"engine {self.engine_id}: load_adapter needs LoRA (--learner.lora-rank > 0)")
        self.load_adapter_dir(str(self._adapters.write(named_tensors, version)), version)

    def load_adapter_dir(self, path: str, version: int) -> None:
        """LoRA: serve the PEFT adapter directory at `path` (on this host) from now on, loaded in place."""
        self._call(self._adapter_update(path, version))

    def load_adapter_ipc(self, desc: dict[str, Any], version: int) -> dict[str, float]:
        """LoRA: serve the adapter in the learners' shared GPU buffers from now on (`desc`: the "lora_ipc"
        descriptor, `rlvr.weight_sync.lora_ipc`), loaded in place by every worker; returns the phases' seconds."""
        if self._adapters is None:
            raise ValueError(f"engine {self.engine_id}: load_adapter_ipc needs LoRA (--learner.lora-rank > 0)")
        return self._call(self._adapter_ipc_update(desc, version))

    # ------------------------------------------------------------------ weight transfer (NCCL, CUDA IPC)
    def init_weight_transfer(
        self,
        master_addr: str = "",
        master_port: int = 0,
        rank_offset: int = 1,
        world_size: int = 2,
        timeout_s: float = 600.0,
    ) -> None:
        """Join the trainer's weight-transfer group. NCCL: blocks until every member joined, so call it
        concurrently with `NcclWeightSender(...)` on learner rank 0; this engine's TP workers take ranks
        rank_offset .. rank_offset + engine_tp - 1 (rank_offset = 1 + engine_index * engine_tp). IPC: no-op."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        info: dict[str, Any] = {}
        if self.weight_transfer_backend != "ipc":
            info = {
                "master_address": master_addr,
                "master_port": int(master_port),
                "rank_offset": int(rank_offset),
                "world_size": int(world_size),
            }
        self._call(self._llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=info)), timeout=timeout_s)

    def begin_weight_update(self) -> float:
        """Stop admission, pause vLLM (keep or drain), start the update session; returns seconds taken."""
        self._raise_if_failed()
        return self._call(self._begin_update())

    def update_weights_chunk(self, update_info: dict[str, Any]) -> None:
        """Load one chunk (backend-specific `update_info`: names, dtype_names, shapes, packed, ...)."""
        self._call(self._guard(self._update_chunk(update_info)))

    def finish_weight_update(self, version: int) -> dict[str, float]:
        """Finish the session, set policy_version = version, resume; returns seconds taken."""
        return self._call(self._finish_update(version))

    def receive_weights_nccl(
        self, metadata: dict[str, Any], version: int, *, packed: bool = True, timeout_s: float | None = None
    ) -> dict[str, float]:
        """One whole NCCL update: run it concurrently with `NcclWeightSender.send` on learner rank 0.

        `metadata` = {"names", "dtype_names", "shapes"} in the sender's order (`rlvr.weight_sync.nccl.
        weight_metadata`), plus optional packed_buffer_size_bytes / packed_num_buffers equal to the sender's.
        """
        info = {**metadata, "packed": packed}
        if self.staged_sync and packed:
            return self._call(self._nccl_staged_update(info, version), timeout=timeout_s)
        return self._call(self._nccl_update(info, version), timeout=timeout_s)

    # ------------------------------------------------------------------ on the loop thread
    async def _guard(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run an update step; a failure marks the engine failed (weights may be partly loaded)."""
        try:
            return await coro
        except BaseException as exc:
            self._fail(exc)
            raise

    async def _begin_update(self, transfer: bool = True, settle: bool = True) -> float:
        t0 = time.perf_counter()
        self._updating = True
        try:
            await self._pause(settle)
            if transfer:  # a weight-transfer session (not for LoRA adapters)
                await self._llm.start_weight_update()
        except BaseException as exc:
            self._fail(exc)
            raise
        return time.perf_counter() - t0

    async def _pause(self, settle: bool) -> None:
        """vLLM's scheduler pause (keep or wait) without `AsyncLLM.pause_generation`'s fixed 20 ms sleep, which only
        orders the outputs of requests finishing just before the pause (vllm/v1/engine/async_llm.py: "not required
        for correctness"):
        - keep mode, `settle` off: running requests go on after the update anyway; nothing to wait for.
        - wait mode (draining), or `settle` on: the scheduler is idle when the pause returns, but the final outputs of
          the drained requests may still be in vLLM's output handler. Each of our samples stamps `version_end` when
          its final output arrives, so wait until none of ours is in flight (`_settle`), never longer than vLLM's
          20 ms: usually far less. Where the engine core has no scheduler pause, vLLM's own `pause_generation`."""
        mode = "keep" if self.inflight_updates else "wait"
        core = getattr(self._llm, "engine_core", None)
        if not callable(getattr(core, "pause_scheduler_async", None)):
            await self._llm.pause_generation(mode=mode, clear_cache=False)
            return
        await core.pause_scheduler_async(mode=mode, clear_cache=False)
        if settle or mode != "keep":
            await self._settle(SETTLE_S)

    async def _settle(self, limit_s: float) -> None:
        """Yield to the loop until no sample of ours is in flight (their final outputs are processed), at most
        `limit_s`: in keep mode samples stay in flight through the update, so this only waits out the limit."""
        deadline = time.monotonic() + limit_s
        while self._num_inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.0005)

    async def _update_chunk(self, update_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        # the worker unpickles the handles because the engine called allow_ipc_handles for the ipc backend
        await self._llm.update_weights(WeightTransferUpdateRequest(update_info=pickled_ipc_handles(update_info)))

    async def _finish_update(self, version: int, transfer: bool = True) -> dict[str, float]:
        t0 = time.perf_counter()
        try:
            # vLLM logs "RotaryEmbedding: Failed to load weights" here at every update. It is harmless: vLLM's
            # layerwise reload (model_loader/reload/layerwise.py, finalize_layerwise_processing) counts the
            # rotary layer's cos_sin_cache buffer as loadable, an update (like any HF checkpoint) carries no
            # rotary tensor, so vLLM warns and puts the layer's existing cache back. That cache is a function of
            # the config alone (rope theta, head dim, max positions) and never trained; the teacher-forced
            # log-prob match after a sync (tests/gpu, about 1e-3) shows the positions are right.
            if transfer:
                await self._llm.finish_weight_update()
            self._version = version
            if not self.inflight_updates and self.cfg.rollout.vllm_enable_prefix_caching and not self._asleep:
                await self._llm.reset_prefix_cache()  # drained: nothing holds blocks; the salt also isolates them
            if not self._asleep:
                await self._llm.resume_generation()
        except BaseException as exc:
            self._fail(exc)
            raise
        finally:
            self._updating = False
            self._counters["num_updates"] += 1
            self._pump()
        logger.debug("engine %d: policy version %d", self.engine_id, version)
        return {"sync/finish_s": time.perf_counter() - t0}

    async def _adapter_update(self, path: str, version: int) -> dict[str, float]:
        """pause -> add_lora in place (the same id) -> policy_version = version -> resume."""
        from vllm.lora.request import LoRARequest

        pause_s = await self._begin_update(transfer=False)
        t1 = time.perf_counter()
        try:
            if not await self._llm.add_lora(LoRARequest(ADAPTER_NAME, LORA_ID, path, load_inplace=True)):
                raise EngineError(f"vLLM did not load the adapter at {path}")
        except BaseException as exc:
            self._fail(exc)
            self._updating = False
            raise
        self._lora_request = LoRARequest(ADAPTER_NAME, LORA_ID, path)
        t2 = time.perf_counter()
        return {"sync/pause_s": pause_s, "sync/receive_load_s": t2 - t1, **await self._finish_update(version, False)}

    async def _adapter_ipc_update(self, desc: dict[str, Any], version: int) -> dict[str, float]:
        """pause -> every worker loads the adapter from the shared buffer into slot `LORA_ID` -> policy_version =
        version -> resume."""
        from vllm.lora.request import LoRARequest

        from rlvr.rollout.vllm_lora_ipc import RPC_METHOD

        t0 = time.perf_counter()
        pause_s = await self._begin_update(transfer=False, settle=False)  # one RPC between two steps: no settling
        t1 = time.perf_counter()
        try:
            done = await self._llm.collective_rpc(RPC_METHOD, args=(desc, LORA_ID))
        except BaseException as exc:
            self._fail(exc)
            self._updating = False
            raise
        if self._lora_request is None:
            # requests must name a path, which vLLM reads only to load an adapter it does not hold; this one is
            # registered by the call above and never evicted (one adapter, max_loras = max_cpu_loras = 1). The path
            # does not exist, so an unexpected reload fails loudly instead of serving a stale adapter.
            self._lora_request = LoRARequest(ADAPTER_NAME, LORA_ID, os.path.join(self._adapters.root, "in-gpu-memory"))
        t2 = time.perf_counter()
        out = await self._finish_update(version, False)
        return {
            "sync/pause_s": pause_s,
            "sync/receive_load_s": t2 - t1,
            "sync/worker_load_s": max((float(r["seconds"]) for r in done or []), default=0.0),
            **out,
            "sync/engine_total_s": time.perf_counter() - t0,
        }

    async def _nccl_staged_update(self, info: dict[str, Any], version: int) -> dict[str, float]:
        """`--rollout.vllm-staged-sync`: the workers receive the broadcast into a staging copy while generation goes
        on (`rlvr.rollout.vllm_staged`); then pause -> load the copy -> policy_version = version -> resume. A worker
        without the free memory for the copy stages nothing, and this sync takes the paused path."""
        from rlvr.rollout.vllm_staged import RPC_BEGIN, RPC_LOAD, RPC_POLL

        t0 = time.perf_counter()
        began = await self._guard(self._llm.collective_rpc(RPC_BEGIN, args=(info,)))
        if not all(b.get("staged") for b in began):
            if any(b.get("staged") for b in began):  # some workers are receiving: they must finish that
                raise EngineError("staged sync: workers disagree on staging")  # TP 1 only, so unreachable
            if not self._staged_fallback_logged:
                self._staged_fallback_logged = True
                need, free = max(b["need_bytes"] for b in began), min(b["free_bytes"] for b in began)
                logger.warning(
                    "engine %d: --rollout.vllm-staged-sync needs %.2f GB of free GPU memory beside vLLM for the "
                    "staged copy, %.2f GB are free: this engine pauses for the whole transfer instead (lower "
                    "--rollout.vllm-gpu-memory-utilization to stage)",
                    self.engine_id,
                    need / 1e9,
                    free / 1e9,
                )
            return {**await self._nccl_update(info, version), "sync/staged": 0.0}
        deadline = time.monotonic() + self.cfg.cluster.actor_timeout_s
        while True:
            polls = await self._guard(self._llm.collective_rpc(RPC_POLL))
            failed = [p["error"] for p in polls if p.get("error")]
            if not failed and time.monotonic() > deadline:  # the learner died mid-broadcast: NCCL never returns
                failed = [f"not finished after --cluster.actor-timeout-s {self.cfg.cluster.actor_timeout_s:g}"]
            if failed:
                exc = EngineError(f"engine {self.engine_id}: staged weight receive failed: {failed[0]}")
                self._fail(exc)
                raise exc
            if all(p.get("done") for p in polls):
                break
            await asyncio.sleep(STAGE_POLL_S)
        t1 = time.perf_counter()
        pause_s = await self._begin_update(transfer=False)
        t2 = time.perf_counter()
        try:
            await self._llm.collective_rpc(RPC_LOAD)
        except BaseException as exc:
            self._fail(exc)
            self._updating = False
            raise
        t3 = time.perf_counter()
        out = await self._finish_update(version, transfer=False)
        t4 = time.perf_counter()
        return {
            "sync/stage_s": t1 - t0,
            "sync/pause_s": pause_s,
            "sync/receive_load_s": t3 - t2,
            **out,
            "sync/paused_s": t4 - t1,
            "sync/engine_total_s": t4 - t0,
            "sync/staged": 1.0,
        }

    async def _nccl_update(self, info: dict[str, Any], version: int) -> dict[str, float]:
        t0 = time.perf_counter()
        pause_s = await self._begin_update()
        t1 = time.perf_counter()
        await self._guard(self._update_chunk(info))
        t2 = time.perf_counter()
        out = await self._finish_update(version)
        total = time.perf_counter() - t0
        return {
            "sync/pause_s": pause_s,
            "sync/receive_load_s": t2 - t1,
            **out,
            "sync/paused_s": total,  # generation stops for the whole update
            "sync/engine_total_s": total,
        }
