"""Colocated weight sync through CUDA IPC (vLLM 0.26's IPC weight-transfer engine): learner -> vLLM on one GPU.

No process group of its own: every learner rank packs its full tensors into one reusable GPU buffer
(`packed_ipc_producer`) and shares a CUDA IPC handle to it; with several learner ranks (torch.distributed
initialised) the handles are all-gathered so that each engine worker finds the one for its own GPU (by
UUID). Learner rank 0 hands each chunk's update info to `deliver`, which must return only after every
engine has loaded the chunk (`VLLMEngine.update_weights_chunk`): the buffer is then reused for the next one.

Protocol per sync (docs/design.md, Weight transport), driven by the caller (in rlvr: `rlvr.weight_sync.transport`'s "ipc" kind):
  every engine: `begin_weight_update()` -> every learner rank: `IpcWeightSender.send(named)` (rank 0
  delivers chunks; metadata travels with each chunk) -> every engine: `finish_weight_update(version)`.
In colocated mode wake the engine's weights first (`VLLMEngine.wake_up(["weights"])`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from rlvr.weight_sync.nccl import wire_tensor

DEFAULT_IPC_BUFFER_BYTES = 512 << 20
"""Bytes of the shared buffer (raised to the largest tensor when metadata is given): memory is tight on a
shared GPU, and one buffer is reused for every chunk."""


def _vllm_ipc() -> Any:
    try:
        from vllm.distributed.weight_transfer import ipc_engine
    except ImportError as exc:
        raise ImportError("CUDA IPC weight sync needs vllm==0.26.0: pip install 'rlvr[gpu]'") from exc
    return ipc_engine


def _wire(
    named_tensors: Iterable[tuple[str, torch.Tensor]], wire_dtype: torch.dtype | None, tally: list[int]
) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in named_tensors:
        t = wire_tensor(tensor, wire_dtype)
        if not t.is_cuda:
            t = t.to("cuda")
        tally[0] += t.numel() * t.element_size()
        yield name, t


class IpcWeightSender:
    """A learner rank's end of the colocated CUDA IPC sync (every rank calls `send`; rank 0 delivers)."""

    def __init__(
        self,
        deliver: Callable[[dict[str, Any]], None],
        *,
        buffer_size_bytes: int = DEFAULT_IPC_BUFFER_BYTES,
        wire_dtype: torch.dtype | None = torch.bfloat16,
    ) -> None:
        """`deliver(update_info)`: load one chunk into every engine and return when they are done (e.g.
        `ray.get([e.update_weights_chunk.remote(info) for e in engines], timeout=...)`)."""
        self._ipc = _vllm_ipc()
        self.deliver, self.buffer_size_bytes, self.wire_dtype = deliver, buffer_size_bytes, wire_dtype
        self.num_chunks = 0

    def _deliver(self, update_info: Any) -> None:
        self.num_chunks += 1
        self.deliver(dataclasses.asdict(update_info))

    def send(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], metadata: dict[str, list] | None = None
    ) -> dict[str, float]:
        """Share and deliver the tensors; returns `sync/seconds`, `sync/bytes`, `sync/num_chunks`.

        `metadata` (`rlvr.weight_sync.nccl.weight_metadata`), when given, sizes the buffer to fit the
        largest tensor."""
        size = self.buffer_size_bytes
        if metadata is not None:
            itemsize = {
                n: torch.empty((), dtype=getattr(torch, n)).element_size() for n in set(metadata["dtype_names"])
            }
            largest = max(
                (torch.Size(s).numel() * itemsize[d] for s, d in zip(metadata["shapes"], metadata["dtype_names"])),
                default=0,
            )
            size = max(size, largest)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tally = [0]
        self.num_chunks = 0
        args = self._ipc.IPCTrainerSendWeightsArgs(send_mode=self._deliver, packed=True, packed_buffer_size_bytes=size)
        with torch.no_grad():
            self._ipc.IPCWeightTransferEngine.trainer_send_weights(_wire(named_tensors, self.wire_dtype, tally), args)
        seconds = time.perf_counter() - t0
        return {
            "sync/seconds": seconds,
            "sync/bytes": float(tally[0]),
            "sync/num_chunks": float(self.num_chunks),
            "sync/gb_per_s": tally[0] / seconds / 1e9 if seconds > 0 else 0.0,
        }

    def close(self) -> None:
        pass
