"""LoRA adapters learner -> colocated vLLM engines through CUDA IPC (transport "lora_ipc", whose sender is
`rlvr.weight_sync.transport.LoraIpcSender`): no disk, no state dict.

Every learner rank keeps one flat GPU buffer for the adapter (allocated at its first sync, in the base weights'
dtype) and shares a CUDA IPC handle to it once; a sync copies the live adapter parameters into it (one batched
copy) and hands the engines a small descriptor: the buffer's handles by GPU UUID, the tensors' PEFT names, shapes
and offsets, and the adapter config. Each engine worker opens the handle of its own GPU once and, at every sync,
copies the buffer into its own memory and loads it into its adapter slot in place
(`rlvr.rollout.vllm_lora_ipc`). With several learner ranks (data parallel: every rank holds the same adapter) the
handles are all-gathered at the first sync, so that each engine finds the learner rank on its GPU.

Invariants:
- The descriptor is plain data (str, int, bool, bytes, lists, dicts): vLLM's RPC carries it without pickle, so no
  VLLM_ALLOW_INSECURE_SERIALIZATION is needed.
- The buffer is written only during `send`, which returns after the copy completed on the GPU; the engines read it
  only while they load, and the next `send` starts after every engine has loaded (syncs are sequential). So an
  engine never reads a half-written adapter and the learner never overwrites one being read.
- `key` names one buffer: the same key means the same handles, layout and config, so engines open it once.
"""

from __future__ import annotations

from typing import Any

import torch


def gpu_uuid(device: torch.device) -> str:
    """The physical GPU's UUID (what vLLM's IPC weight transfer keys handles by: CUDA_VISIBLE_DEVICES differ)."""
    return str(torch.cuda.get_device_properties(device).uuid)


def share_cuda_buffer(buf: torch.Tensor) -> dict[str, Any]:
    """A CUDA IPC handle to `buf` (a contiguous uint8 tensor at offset 0 of its storage), as the fields
    `torch.multiprocessing.reductions.reduce_tensor` produces, in plain data."""
    assert buf.dtype == torch.uint8 and buf.is_contiguous() and buf.storage_offset() == 0
    (
        _device,
        handle,
        storage_size_bytes,
        storage_offset_bytes,
        ref_counter_handle,
        ref_counter_offset,
        event_handle,
        event_sync_required,
    ) = buf.untyped_storage()._share_cuda_()
    return {
        "nbytes": buf.numel(),
        "handle": bytes(handle),
        "storage_size_bytes": int(storage_size_bytes),
        "storage_offset_bytes": int(storage_offset_bytes),
        "ref_counter_handle": bytes(ref_counter_handle),
        "ref_counter_offset": int(ref_counter_offset),
        "event_handle": bytes(event_handle) if event_handle else b"",
        "event_sync_required": bool(event_sync_required),
    }


def open_cuda_buffer(h: dict[str, Any], device_index: int) -> torch.Tensor:
    """The uint8 tensor a `share_cuda_buffer` handle names, mapped on this process's `device_index` (the same
    physical GPU); what vLLM's `packed_ipc_consumer` does with the pickled form of these fields."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    return rebuild_cuda_tensor(
        torch.Tensor,
        torch.Size([int(h["nbytes"])]),
        (1,),
        0,
        torch.storage.TypedStorage,
        torch.uint8,
        device_index,
        bytes(h["handle"]),
        int(h["storage_size_bytes"]),
        int(h["storage_offset_bytes"]),
        False,
        bytes(h["ref_counter_handle"]),
        int(h["ref_counter_offset"]),
        bytes(h["event_handle"]) or None,
        bool(h["event_sync_required"]),
    )


def _copy(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    if hasattr(torch, "_foreach_copy_"):  # one multi-tensor op (a per-tensor loop where dtypes differ)
        torch._foreach_copy_(dst, src)
    else:
        for d, s in zip(dst, src):
            d.copy_(s)


class AdapterBuffer:
    """One flat buffer holding adapter tensors back to back, in a fixed layout (names, shapes, element offsets)."""

    def __init__(self, named: list[tuple[str, torch.Tensor]], dtype: torch.dtype, device: torch.device) -> None:
        self.names = [n for n, _ in named]
        self.shapes = [list(t.shape) for _, t in named]
        numels = [t.numel() for _, t in named]
        self.offsets = [sum(numels[:i]) for i in range(len(numels))]
        self.dtype = dtype
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.raw = torch.empty(sum(numels) * itemsize, dtype=torch.uint8, device=device)
        flat = self.raw.view(dtype)
        self.views = [flat[o : o + n].view(s) for o, n, s in zip(self.offsets, numels, self.shapes)]

    def fill(self, named: list[tuple[str, torch.Tensor]]) -> None:
        """Copy these tensors in (same names and shapes as the layout: ValueError otherwise), then wait for the copy:
        another process reads the buffer next."""
        if [n for n, _ in named] != self.names or [list(t.shape) for _, t in named] != self.shapes:
            raise ValueError("the adapter's tensors changed names or shapes since the first sync (LoRA settings?)")
        with torch.no_grad():
            _copy(self.views, [t for _, t in named])
        if self.raw.is_cuda:
            torch.cuda.current_stream(self.raw.device).synchronize()

    def layout(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "shapes": [list(s) for s in self.shapes],
            "offsets": list(self.offsets),
            "dtype": str(self.dtype).removeprefix("torch."),
            "nbytes": self.raw.numel(),
        }


def all_gather_handles(mine: dict[str, Any]) -> list[dict[str, Any]]:
    """Every learner rank's {gpu uuid: handle} (torch.distributed's default group, when there is one)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [mine]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return [g for g in gathered if g]
