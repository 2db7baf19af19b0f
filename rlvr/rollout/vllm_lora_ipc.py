"""vLLM worker side of the "lora_ipc" transport (`rlvr.weight_sync.lora_ipc`): load a LoRA adapter from the learner's
shared GPU buffer into the engine's adapter slot, in place, without a file.

`LoraIpcWorkerExtension` is vLLM's `worker_extension_cls` for rlvr's LoRA engines (`rlvr.rollout.lora.
vllm_engine_args`): vLLM mixes it into its GPU worker, and the engine calls `rlvr_load_lora_ipc` through
`AsyncLLM.collective_rpc` while generation is paused (`rlvr.rollout.vllm_weights`). What it does is vLLM 0.26's own
in-place reload (`LRUCacheWorkerLoRAManager.add_adapter` with `load_inplace`, vllm/lora/worker_manager.py) with the
disk read replaced: the same `PEFTHelper` (scaling alpha / r, rsLoRA), the same name check against the modules vLLM
serves, `LoRAModel.from_lora_tensors` with the model's weights mapper, and the adapter manager's remove -> add
(which packs q/k/v into qkv_proj and gate/up into gate_up_proj and folds the scaling into lora_B) -> activate (which
copies into the stacked slot buffers the kernels read, so CUDA graphs stay valid).

Invariants:
- The learner's buffer is copied into this worker's own buffer first (one device copy): vLLM scales lora_B in
  place when it registers an adapter, which must never write into the learner's memory; and the learner may
  overwrite its buffer as soon as this call returned (it waits for the copy to finish).
- The handle is opened once per buffer `key`; names, shapes and config are checked once per key.
vllm is imported inside functions only (this module is imported by vLLM's workers, and by tests without vllm).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from rlvr.weight_sync.lora_ipc import gpu_uuid, open_cuda_buffer

RPC_METHOD = "rlvr_load_lora_ipc"


class LoraIpcWorkerExtension:
    """Mixed into vLLM's GPU worker (`worker_extension_cls`); vLLM refuses extension names its worker already has,
    hence the `rlvr_` prefix."""

    def rlvr_load_lora_ipc(self, desc: dict[str, Any], lora_id: int) -> dict[str, float]:
        """Serve the adapter of this descriptor (`rlvr.weight_sync.transport.LoraIpcSender`) under `lora_id`."""
        slot = self.__dict__.get("_rlvr_lora_slot")
        if slot is None:
            slot = self.__dict__["_rlvr_lora_slot"] = IpcAdapterSlot()
        return slot.load(self.model_runner.lora_manager, self.device, desc, lora_id)  # type: ignore[attr-defined]


class IpcAdapterSlot:
    """One worker's view of the learner's adapter buffer: the opened handle, a local copy, tensor views into it."""

    def __init__(self) -> None:
        self.key = ""
        self.src: torch.Tensor | None = None
        self.local = torch.empty(0, dtype=torch.uint8)
        self.names: list[str] = []
        self.views: list[torch.Tensor] = []
        self.peft_helper: Any = None

    def load(self, manager: Any, device: torch.device, desc: dict[str, Any], lora_id: int) -> dict[str, float]:
        """`manager`: the worker's `LRUCacheWorkerLoRAManager` (`model_runner.lora_manager`)."""
        t0 = time.perf_counter()
        if desc["key"] != self.key:
            self._open(manager, device, desc)
        assert self.src is not None
        self.local.copy_(self.src)
        install_adapter(manager, dict(zip(self.names, self.views)), self.peft_helper, lora_id, device)
        if self.local.is_cuda:  # the learner may overwrite its buffer once this returns
            torch.cuda.current_stream(device).synchronize()
        return {"seconds": time.perf_counter() - t0}

    def _open(self, manager: Any, device: torch.device, desc: dict[str, Any]) -> None:
        here = gpu_uuid(device)
        handle = desc["handles"].get(here)
        if handle is None:
            raise ValueError(
                f"no learner rank shares the LoRA adapter on this engine's GPU {here} (the learners' GPUs: "
                f"{sorted(desc['handles'])}): colocate every engine with a learner rank (cluster.num_engines <= "
                "cluster.num_learners), or sync adapters through shared memory (RLVR_LORA_SYNC=shm)"
            )
        dtype = getattr(torch, str(desc["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"lora_ipc: unknown dtype {desc['dtype']!r}")
        names, shapes, offsets = list(desc["names"]), [list(s) for s in desc["shapes"]], list(desc["offsets"])
        if not (len(names) == len(shapes) == len(offsets)) or int(handle["nbytes"]) != int(desc["nbytes"]):
            raise ValueError("lora_ipc: malformed adapter descriptor (names, shapes, offsets or sizes disagree)")
        peft_helper = check_adapter(manager, names, desc["config"])
        index = device.index if device.index is not None else 0
        src = open_cuda_buffer(handle, index)
        local = torch.empty_like(src)
        flat = local.view(dtype)
        views = []
        for o, s in zip(offsets, shapes):
            n = math.prod(s)
            if o < 0 or o + n > flat.numel():
                raise ValueError(f"lora_ipc: tensor at offset {o} of {n} elements is outside the buffer")
            views.append(flat[o : o + n].view(s))
        self.key, self.src, self.local = str(desc["key"]), src, local
        self.names, self.views, self.peft_helper = names, views, peft_helper


def _weights_mapper(model: Any) -> Any:
    """The model's HF -> vLLM name mapper without its q/k/v and gate/up fusion (as `WorkerLoRAManager._load_adapter`):
    the adapter manager packs the constituent modules itself."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    return mapper.get_unstacked_mapper() if mapper is not None else None


def check_adapter(manager: Any, names: list[str], config: dict[str, Any]) -> Any:
    """The adapter's `PEFTHelper`, after vLLM's own checks (`WorkerLoRAManager._load_adapter` and
    `LoRAModel.from_local_checkpoint`): a legal config for this engine, and only modules vLLM serves LoRA on."""
    from vllm.lora.peft_helper import PEFTHelper
    from vllm.lora.utils import parse_fine_tuned_lora_name

    helper = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": manager.max_position_embeddings})
    helper.validate_legal(manager.lora_config)
    mgr = manager._adapter_manager
    expected: set[str] = set()
    for module in mgr.supported_lora_modules:
        expected.update(mgr.packed_modules_mapping.get(module, [module]))
        if module == "experts":
            expected.add(module)
    mapper = _weights_mapper(mgr.model)
    bad = [n for n in names if parse_fine_tuned_lora_name(n, mapper)[0].rsplit(".", 1)[-1] not in expected]
    if bad:
        raise ValueError(f"lora_ipc: vLLM serves LoRA on {sorted(expected)}, not on {bad[:3]}")
    return helper


def install_adapter(
    manager: Any, tensors: dict[str, torch.Tensor], peft_helper: Any, lora_id: int, device: torch.device
) -> None:
    """Replace the adapter `lora_id` with these tensors (PEFT on-disk names), as vLLM's in-place reload does."""
    from vllm.lora.lora_model import LoRAModel

    mgr = manager._adapter_manager
    model = mgr.model
    lora = LoRAModel.from_lora_tensors(
        lora_id,
        tensors,
        peft_helper,
        device=device,
        dtype=manager.lora_config.lora_dtype,
        model_vocab_size=manager.vocab_size,
        weights_mapper=_weights_mapper(model),
        skip_prefixes=getattr(model, "lora_skip_prefixes", None),
    )
    # LRUCacheWorkerLoRAManager.add_adapter with load_inplace (vllm 0.26), minus the disk read
    mgr.remove_adapter(lora.id)
    if len(mgr) + 1 > mgr.capacity:
        mgr.remove_oldest_adapter()
    mgr.add_adapter(lora)
    mgr.activate_adapter(lora.id)
