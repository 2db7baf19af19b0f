"""Weight sync over NCCL through vLLM 0.26's weight-transfer API: learner rank 0 -> every vLLM engine worker.

The group is vLLM's stateless NCCL group (`NCCLWeightTransferEngine.trainer_init`, a `PyNcclCommunicator`
outside torch.distributed's default world). Rank 0 is learner rank 0; engine e's tensor-parallel workers
are ranks `engine_rank_offset(e, engine_tp)` .. + engine_tp - 1; world size = 1 + num_engines * engine_tp.
Building the group blocks until every member joined: construct `NcclWeightSender` concurrently with each
engine's `VLLMEngine.init_weight_transfer(addr, port, rank_offset, world_size)`.

Protocol per sync (docs/design.md, Weight transport): metadata (names, dtype names, shapes; `weight_metadata`) reaches the
engines ahead of the tensors, out of band (the driver passes it to `VLLMEngine.receive_weights_nccl`, which
runs concurrently with `send`); tensors then go in that fixed order as packed uint8 buffers
(`packed=True`: vLLM's double-buffered packed broadcast, chunks of `buffer_size_bytes`). The sender checks
every tensor against the metadata it announced: a mismatch would desynchronise the engines' unpacking.
Floating tensors are cast to `wire_dtype` (the engine's bf16) before sending, halving fp32 traffic.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

DEFAULT_BUFFER_BYTES = 1 << 30
"""vLLM's DEFAULT_PACKED_BUFFER_SIZE_BYTES (1 GiB); sender and engines must use the same value."""
DEFAULT_NUM_BUFFERS = 2


def engine_rank_offset(engine_index: int, engine_tp: int) -> int:
    """Rank of engine `engine_index`'s first TP worker in the weight-sync group (learner rank 0 is rank 0)."""
    return 1 + engine_index * engine_tp


def wire_tensor(tensor: torch.Tensor, wire_dtype: torch.dtype | None) -> torch.Tensor:
    """The tensor as it travels: floating point cast to `wire_dtype` (None: unchanged), contiguous."""
    t = tensor.detach()
    if wire_dtype is not None and t.is_floating_point() and t.dtype != wire_dtype:
        t = t.to(wire_dtype)
    return t.contiguous()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).split(".")[-1]


def weight_metadata(
    named_tensors: Iterable[tuple[str, torch.Tensor]], wire_dtype: torch.dtype | None = torch.bfloat16
) -> dict[str, list]:
    """{"names", "dtype_names", "shapes"} of the tensors as `send` will put them on the wire (in order).

    Iterating a ZeRO-3 learner's `named_weights()` gathers: call it on every learner rank (once; the
    metadata does not change between syncs)."""
    names, dtype_names, shapes = [], [], []
    for name, t in named_tensors:
        dtype = wire_dtype if (wire_dtype is not None and t.is_floating_point()) else t.dtype
        names.append(name)
        dtype_names.append(_dtype_name(dtype))
        shapes.append(list(t.shape))
    return {"names": names, "dtype_names": dtype_names, "shapes": shapes}


def _checked(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    metadata: dict[str, list] | None,
    wire_dtype: torch.dtype | None,
    device: torch.device,
    tally: list[int],
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield wire tensors on `device`, checking them against `metadata`; count bytes into tally[0]."""
    num = 0
    for i, (name, tensor) in enumerate(named_tensors):
        # vLLM packs on side streams; the tensor (a ZeRO-3 gather, an optimizer step) was written on the
        # default stream, so order the packing after it
        torch.cuda.current_stream(device).wait_stream(torch.cuda.default_stream(device))
        t = wire_tensor(tensor, wire_dtype)
        if t.device != device:
            t = t.to(device, non_blocking=True)
        if metadata is not None:
            if i >= len(metadata["names"]):
                raise ValueError(f"weight sync: more tensors than announced ({len(metadata['names'])}); extra {name!r}")
            want = (metadata["names"][i], metadata["dtype_names"][i], list(metadata["shapes"][i]))
            got = (name, _dtype_name(t.dtype), list(t.shape))
            if want != got:
                raise ValueError(f"weight sync: tensor {i} is {got}, the engines expect {want}")
        tally[0] += t.numel() * t.element_size()
        num += 1
        yield name, t
    if metadata is not None and num != len(metadata["names"]):
        raise ValueError(f"weight sync: sent {num} tensors, the engines expect {len(metadata['names'])}")


class NcclWeightSender:
    """Learner rank 0's end of the NCCL weight-sync group (the engines' end lives inside vLLM)."""

    def __init__(
        self,
        master_addr: str,
        master_port: int,
        world_size: int,
        device: torch.device | str | int | None = None,
        *,
        packed: bool = True,
        buffer_size_bytes: int = DEFAULT_BUFFER_BYTES,
        num_buffers: int = DEFAULT_NUM_BUFFERS,
        wire_dtype: torch.dtype | None = torch.bfloat16,
    ) -> None:
        """Blocks until every engine worker joined (see module docstring). `device`: this process's CUDA
        device (default: the current one); vLLM's trainer_init uses the current device, so it is set here."""
        try:
            from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine
        except ImportError as exc:
            raise ImportError("NCCL weight sync needs vllm==0.26.0: pip install 'rlvr[gpu]'") from exc
        if device is not None:
            torch.cuda.set_device(device)
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.world_size, self.packed, self.wire_dtype = world_size, packed, wire_dtype
        self.buffer_size_bytes, self.num_buffers = buffer_size_bytes, num_buffers
        self._engine_cls = NCCLWeightTransferEngine
        self.group = NCCLWeightTransferEngine.trainer_init(
            {"master_address": master_addr, "master_port": int(master_port), "world_size": int(world_size)}
        )

    def update_info(self, metadata: dict[str, list]) -> dict[str, Any]:
        """What each engine passes to `receive_weights_nccl` (metadata + the packing settings)."""
        out = dict(metadata)
        if self.packed:
            out.update(packed_buffer_size_bytes=self.buffer_size_bytes, packed_num_buffers=self.num_buffers)
        return out

    def send(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], metadata: dict[str, list] | None = None
    ) -> dict[str, float]:
        """Broadcast the tensors (in metadata order); returns `sync/seconds`, `sync/bytes`, `sync/gb_per_s`.

        Run concurrently with every engine's `receive_weights_nccl`; seconds include waiting for them."""
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerSendWeightsArgs

        torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        tally = [0]
        args = NCCLTrainerSendWeightsArgs(
            group=self.group,
            packed=self.packed,
            packed_buffer_size_bytes=self.buffer_size_bytes,
            packed_num_buffers=self.num_buffers,
        )
        with torch.no_grad():
            self._engine_cls.trainer_send_weights(
                _checked(named_tensors, metadata, self.wire_dtype, self.device, tally), args
            )
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t0
        return {
            "sync/seconds": seconds,
            "sync/bytes": float(tally[0]),
            "sync/gb_per_s": tally[0] / seconds / 1e9 if seconds > 0 else 0.0,
        }

    def close(self) -> None:
        self.group = None
