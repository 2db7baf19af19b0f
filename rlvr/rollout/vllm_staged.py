"""vLLM worker side of the staged NCCL weight sync (`--rollout.vllm-staged-sync`): the engine receives learner rank 0's
broadcast into a staging copy on a background thread while it goes on generating, and then loads that copy in one
short pause, instead of pausing generation for the whole transfer.

`StagedNcclWorkerExtension` is vLLM's `worker_extension_cls` for such engines; the engine (`rlvr.rollout.
vllm_weights`) calls its methods through `AsyncLLM.collective_rpc`, each between two engine steps:
- `rlvr_stage_begin(info)`: start the background receive of one sync (`info`: the sender's metadata and packing
  settings, as for vLLM's own `update_weights`); returns at once. Where the GPU lacks the free memory for the copy it
  starts nothing and says so (`staged: False`): the engine then takes vLLM's paused path for this sync.
- `rlvr_stage_poll()`: whether the receive finished, and its error if it failed.
- `rlvr_stage_load()`: vLLM's weight-update session (`start_weight_update` -> the model's `load_weights` per received
  bucket, exactly as vLLM's NCCL engine calls it -> `finish_weight_update`) over the staged tensors, then frees them.

Invariants:
- The receive is vLLM's own packed consumer (`packed_nccl_broadcast_consumer`, the same buckets as the sender's
  producer) with a loader that keeps each bucket's tensors (views into its buffer) instead of loading them, on the
  NCCL group vLLM's weight-transfer engine built. The model's weights are untouched until `rlvr_stage_load`; a
  receive that fails (or outlasts the engine's deadline) still marks the engine failed, as any failed sync does, since
  the NCCL group may be left mid-collective.
- The background thread waits for its side streams before it reports done, and the load waits for its own copies
  before the staging buffers are released, so no buffer is reused while a kernel still reads it.
- Engines of tensor-parallel size 1 only (validation): the engine's own collectives would otherwise run beside the
  weight broadcast on another communicator, an ordering NCCL does not guarantee to be safe.
vllm is imported inside functions only (this module is imported by vLLM's workers, and by tests without vllm).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

RPC_BEGIN = "rlvr_stage_begin"
RPC_POLL = "rlvr_stage_poll"
RPC_LOAD = "rlvr_stage_load"
HEADROOM_BYTES = 1 << 30
"""Free GPU memory left beside the staged copy (vLLM's activations and sampler buffers grow into it)."""

Bucket = list[tuple[str, torch.Tensor]]


def staged_bytes(info: dict[str, Any]) -> int:
    """Bytes of the staged copy: every tensor of the sync, as it travels."""
    total = 0
    for dtype_name, shape in zip(info["dtype_names"], info["shapes"], strict=True):
        dtype = getattr(torch, str(dtype_name), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"staged sync: unknown dtype {dtype_name!r}")
        total += math.prod(shape) * dtype.itemsize
    return total


class StagedReceive:
    """One worker's receive of one sync on a background thread (no vLLM here: the receive is passed in)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._buckets: list[Bucket] = []
        self._error: BaseException | None = None
        self._seconds = 0.0

    @property
    def active(self) -> bool:
        """A receive was begun and its tensors not yet taken."""
        return self._thread is not None

    def begin(self, receive: Callable[[Callable[[Bucket], None]], None], device: torch.device) -> None:
        """Run `receive(keep)` on a new thread; `receive` calls `keep(bucket)` for each bucket it received."""
        if self._thread is not None:
            raise RuntimeError("staged sync: a receive is already staged and not loaded")
        self._buckets, self._error, self._seconds = [], None, 0.0
        self._done.clear()

        def run() -> None:
            t0 = time.perf_counter()
            try:
                if device.type == "cuda":
                    torch.cuda.set_device(device)
                receive(self._buckets.append)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)  # the consumer's side streams: every bucket is in memory
            except BaseException as exc:  # the thread's boundary: reported by poll / take
                self._error = exc
                self._buckets = []  # a partial copy is never loaded: release it now
            finally:
                self._seconds = time.perf_counter() - t0
                self._done.set()

        self._thread = threading.Thread(target=run, name="rlvr-staged-receive", daemon=True)
        self._thread.start()

    def poll(self) -> dict[str, Any]:
        done = self._done.is_set()
        return {
            "done": done,
            "error": repr(self._error) if done and self._error is not None else "",
            "seconds": self._seconds if done else 0.0,
        }

    def take(self, timeout_s: float = 0.0) -> list[Bucket]:
        """The received buckets (the receive must have finished within `timeout_s`); re-raises its error. Either way
        the stage is free for the next sync afterwards."""
        if self._thread is None:
            raise RuntimeError("staged sync: nothing was staged")
        if not self._done.wait(timeout_s):
            raise RuntimeError("staged sync: the receive has not finished")
        self._thread = None
        buckets, self._buckets = self._buckets, []
        if self._error is not None:
            raise RuntimeError(f"staged sync: the receive failed: {self._error!r}") from self._error
        return buckets


def _free_bytes(device: torch.device) -> int:
    """GPU memory the staged copy can take: free on the device plus what this process's allocator holds unused."""
    free = torch.cuda.mem_get_info(device)[0]
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def _consumer() -> Callable[..., None]:
    from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_consumer

    return packed_nccl_broadcast_consumer


class StagedNcclWorkerExtension:
    """Mixed into vLLM's GPU worker (`worker_extension_cls`); the `rlvr_` prefix keeps clear of the worker's names."""

    def _rlvr_stage(self) -> StagedReceive:
        stage = self.__dict__.get("_rlvr_staged_receive")
        if stage is None:
            stage = self.__dict__["_rlvr_staged_receive"] = StagedReceive()
        return stage

    def rlvr_stage_begin(self, info: dict[str, Any]) -> dict[str, Any]:
        wte = self.weight_transfer_engine  # type: ignore[attr-defined]
        group = getattr(wte, "model_update_group", None)
        if group is None:
            raise RuntimeError("staged sync: the NCCL weight-transfer group is not initialised")
        device: torch.device = self.device  # type: ignore[attr-defined]
        stage = self._rlvr_stage()
        if stage.active:  # checked before the memory: a receive still running holds its buffers
            raise RuntimeError("staged sync: the previous receive was never loaded (a stuck broadcast?)")
        need = staged_bytes(info)
        free = _free_bytes(device) if device.type == "cuda" else need + HEADROOM_BYTES
        if need + HEADROOM_BYTES > free:
            return {"staged": False, "need_bytes": need, "free_bytes": free}
        consume = _consumer()

        def specs() -> Any:
            for name, dtype_name, shape in zip(info["names"], info["dtype_names"], info["shapes"], strict=True):
                yield name, (list(shape), getattr(torch, str(dtype_name)))

        def receive(keep: Callable[[Bucket], None]) -> None:
            consume(
                iterator=specs(),
                group=group,
                src=0,
                post_unpack_func=keep,
                buffer_size_bytes=int(info["packed_buffer_size_bytes"]),
                num_buffers=int(info["packed_num_buffers"]),
                device=device,
            )

        stage.begin(receive, device)
        return {"staged": True, "need_bytes": need, "free_bytes": free}

    def rlvr_stage_poll(self) -> dict[str, Any]:
        return self._rlvr_stage().poll()

    def rlvr_stage_load(self) -> dict[str, float]:
        """Load the staged weights (generation is paused), as vLLM's NCCL engine would have, bucket by bucket."""
        t0 = time.perf_counter()
        buckets = self._rlvr_stage().take()
        wte = self.weight_transfer_engine  # type: ignore[attr-defined]
        self.start_weight_update()  # type: ignore[attr-defined]
        try:
            for bucket in buckets:
                wte.model.load_weights(bucket)
        except BaseException:
            self._weight_update_active = False  # as vLLM's worker does when an update chunk fails
            wte.reset_weight_update_target()
            raise
        self.finish_weight_update()  # type: ignore[attr-defined]
        device: torch.device = self.device  # type: ignore[attr-defined]
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # the copies out of the staging buffers are done
        del buckets
        if device.type == "cuda":
            # the buffers were allocated on the consumer's side streams, which the next sync does not get back: cached
            # blocks of those streams would stay unusable and never count as free, so hand them back to the driver
            torch.cuda.empty_cache()
        return {"seconds": time.perf_counter() - t0}
