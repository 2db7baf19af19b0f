"""One weight-transport interface: learner ranks hold a `WeightSender`, engines a `WeightReceiver`, both made by
`make_sender(kind, ...)` / `make_receiver(kind, ...)` for every kind in `KINDS`:

- "gloo": CPU tensors broadcast over a dedicated gloo group (`rlvr.weight_sync.gloo`); CPU runs and LoRA across hosts.
- "nccl": vLLM's NCCL weight-transfer group (`rlvr.weight_sync.nccl`); engines get the metadata ahead (`engine_info`).
- "ipc": colocated CUDA IPC chunks (`rlvr.weight_sync.ipc`); learner rank 0 delivers each chunk to every engine.
- "shm": LoRA with every engine on learner rank 0's host: rank 0 writes a PEFT adapter directory to shared memory
  (`rlvr.rollout.lora.SharedMemoryAdapters`) and hands its path over; each engine loads it from there.
- "lora_ipc": LoRA with vLLM engines colocated on the learners' GPUs: every rank copies the adapter into one GPU buffer
  shared once through CUDA IPC (`rlvr.weight_sync.lora_ipc`); each engine loads it from there into its adapter slot
  (`rlvr.rollout.vllm_lora_ipc`). No disk, no state dict. `RLVR_LORA_SYNC=shm` picks "shm" instead.

One sync, for every kind (the driver's side is `rlvr.orchestration.weight_updates.WeightUpdater`, which follows
`STEPS[kind]`): [engines `begin()`: pause before the send, where `steps.begin`] -> every learner rank `send(named,
version, deliver)` (every rank consumes `named`: ZeRO-3 gathers are collectives; rank 0 transfers) -> every engine
`receive(version, info)`: concurrently with the send where `steps.concurrent` (a collective; `info` is learner rank
0's `engine_info()`), else after it (`info` is the `HANDOFF` entry of rank 0's result) -> the engine has paused,
loaded, stamped `policy_version = version` and resumed when `receive` returns. Senders return `sync/*` metrics,
receivers `sync/*` seconds (`sync/load_s` where the engine loads).

No Ray here and no vllm at import: the NCCL and IPC classes import vllm when built (GPU only). Below the receivers:
the transformers engine copies tensors in with `rlvr.rollout.weights.copy_named_tensors`, the vLLM engine's side is
`rlvr.rollout.vllm_weights`, LoRA adapter files are `rlvr.rollout.lora`.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

Named = Iterable[tuple[str, torch.Tensor]]
Deliver = Callable[[dict[str, Any]], None]
"""`deliver(chunk_info)`: load one IPC chunk into every engine, returning once all have (rank 0's sender calls it)."""

KINDS = ("gloo", "nccl", "ipc", "shm", "lora_ipc")
LORA_SYNC_ENV = "RLVR_LORA_SYNC"
"""`shm`: LoRA syncs to colocated vLLM engines go through adapter directories in shared memory (the path before
"lora_ipc", kept for comparison and as a fallback); `auto` (default): CUDA IPC where the engines are colocated."""
HANDOFF = "handoff"
"""Key of a sender's result carrying what every engine's `receive` gets (the adapter directory for "shm", the
shared buffer's descriptor for "lora_ipc")."""


@dataclass(frozen=True)
class Steps:
    """How the driver orders one sync of a kind."""

    begin: bool
    """Engines pause (start a weight-update session) before the learners send: chunks load as they arrive."""
    concurrent: bool
    """Engines receive while learner rank 0 sends (a collective), else after it, from the sender's `HANDOFF`."""


STEPS = {
    "gloo": Steps(begin=False, concurrent=True),
    "nccl": Steps(begin=False, concurrent=True),
    "ipc": Steps(begin=True, concurrent=False),
    "shm": Steps(begin=False, concurrent=False),
    "lora_ipc": Steps(begin=False, concurrent=False),
}


def steps(kind: str) -> Steps:
    _check_kind(kind)
    return STEPS[kind]


def pick_kind(*, gpu: bool, vllm: bool, lora: bool, colocate: bool, one_host: bool = False) -> str:
    """gloo on CPU (and for the transformers engine); CUDA IPC when vLLM engines share the learners' GPUs; else NCCL
    through vLLM's weight-transfer API. LoRA moves only the adapter (about 1% of the weights), never through vLLM's
    weight-transfer API: "lora_ipc" when vLLM engines share the learners' GPUs (unless `RLVR_LORA_SYNC=shm`), else
    "shm" where every engine shares learner rank 0's host (`one_host`), else gloo."""
    if lora:
        mode = os.environ.get(LORA_SYNC_ENV, "auto")
        if mode not in ("auto", "shm"):
            raise ValueError(f"{LORA_SYNC_ENV}={mode!r}: choose auto (CUDA IPC where colocated) or shm")
        if mode == "auto" and gpu and vllm and colocate:
            return "lora_ipc"
        return "shm" if one_host else "gloo"
    if not gpu or not vllm:
        return "gloo"
    return "ipc" if colocate else "nccl"


def ranks_per_engine(kind: str, engine_tp: int) -> int:
    """Ranks an engine takes in the group: one per tensor-parallel worker for "nccl" (vLLM's workers join
    themselves), else one."""
    _check_kind(kind)
    return engine_tp if kind == "nccl" else 1


@runtime_checkable
class WeightSender(Protocol):
    """A learner rank's end of the transport (every rank holds one; ranks > 0 only take part in the gathers)."""

    def engine_info(self) -> dict[str, Any] | None:
        """What every engine's `receive` needs ahead of the tensors (learner rank 0, "nccl"), else None."""
        ...

    def send(self, named: Named, version: int, deliver: Deliver | None = None) -> dict[str, Any]:
        """Rank 0 moves the tensors (the caller drains `named` afterwards on every rank); `sync/*` metrics, plus
        `HANDOFF` for a kind whose engines receive after the send. Ranks > 0 return {}."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class WeightReceiver(Protocol):
    """An engine's end of the transport, around a plain engine (rlvr.rollout)."""

    def begin(self) -> float:
        """Pause the engine ahead of a send (kinds whose `Steps.begin` is set); seconds taken."""
        ...

    def receive(self, version: int, info: Any = None) -> dict[str, float]:
        """receive -> pause -> load -> policy_version = version -> resume; `sync/*` seconds."""
        ...

    def close(self) -> None: ...


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown weight-sync transport {kind!r}; choose one of {', '.join(KINDS)}")


def send_all(
    sender: WeightSender, named: Iterable[tuple[str, torch.Tensor]], version: int, deliver: Deliver | None = None
) -> dict[str, Any]:
    """A learner rank's part of one sync: `sender.send`, then the rest of `named` drained, even when the send failed
    midway: a ZeRO-3 learner's tensors are gathered (collectives) as they are iterated, and the other ranks would
    otherwise wait in the next bucket's gather (a no-op when the sender consumed everything)."""
    named = iter(named)
    try:
        return sender.send(named, version, deliver)
    finally:
        for _ in named:
            pass


# ------------------------------------------------------------------ senders (learner side)
class GlooSender:
    """Rank 0 broadcasts over the gloo group (it hosts the group's store)."""

    def __init__(self, rank: int, group: Any = None) -> None:
        self.rank, self.group = rank, group

    def engine_info(self) -> None:
        return None

    def send(self, named: Named, version: int, deliver: Deliver | None = None) -> dict[str, Any]:
        return self.group.send(named) if self.rank == 0 else {}

    def close(self) -> None:
        if self.group is not None:
            self.group.close()


class NcclSender:
    """Every rank computed the metadata (collective gathers); rank 0 sends through vLLM's NCCL group."""

    def __init__(self, rank: int, meta: dict[str, list], sender: Any = None) -> None:
        self.rank, self.meta, self.sender = rank, meta, sender

    def engine_info(self) -> dict[str, Any] | None:
        return self.sender.update_info(self.meta) if self.sender is not None else None

    def send(self, named: Named, version: int, deliver: Deliver | None = None) -> dict[str, Any]:
        return self.sender.send(named, self.meta) if self.sender is not None else {}

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()


class IpcSender:
    """Every rank shares its GPU's tensors (each engine worker finds its own GPU's handle); rank 0 delivers."""

    def __init__(self, rank: int, meta: dict[str, list], make: Callable[[Deliver], Any] | None = None) -> None:
        self.rank, self.meta = rank, meta
        self.make = make or _ipc_weight_sender

    def engine_info(self) -> None:
        return None

    def send(self, named: Named, version: int, deliver: Deliver | None = None) -> dict[str, Any]:
        if self.rank == 0 and deliver is None:
            raise ValueError("the ipc transport needs `deliver` on learner rank 0")
        return self.make(deliver if self.rank == 0 else _no_delivery).send(named, self.meta)

    def close(self) -> None:
        pass


def _ipc_weight_sender(deliver: Deliver) -> Any:
    from rlvr.weight_sync.ipc import IpcWeightSender

    return IpcWeightSender(deliver)


def _no_delivery(info: dict[str, Any]) -> None:
    pass


class ShmSender:
    """LoRA on one host: rank 0 writes the adapter directory; its path is the handoff."""

    def __init__(self, rank: int, adapters: Any = None) -> None:
        self.rank, self.adapters = rank, adapters

    def engine_info(self) -> None:
        return None

    def send(self, named: Named, version: int, deliver: Deliver | None = None) -> dict[str, Any]:
        if self.rank != 0:
            return {}
        from rlvr.rollout.lora import WEIGHTS_FILE

        t0 = time.perf_counter()
        path = self.adapters.write(named, version)
        return {
            HANDOFF: str(path),
            "sync/seconds": time.perf_counter() - t0,
            "sync/bytes": float(path.joinpath(WEIGHTS_FILE).stat().st_size),
        }

    def close(self) -> None:
        if self.adapters is not None:
            self.adapters.close()


class LoraIpcSender:
    """A learner rank's end of "lora_ipc" (`rlvr.weight_sync.transport.WeightSender`): every rank fills its own
    buffer (each engine reads the one on its GPU); rank 0 returns the descriptor as the handoff."""

    def __init__(
        self,
        rank: int,
        config: dict[str, Any],
        *,
        share: Callable[[torch.Tensor], dict[str, Any]] | None = None,
        device_id: Callable[[torch.device], str] | None = None,
        all_gather: Callable[[dict[str, Any]], list[dict[str, Any]]] | None = None,
    ) -> None:
        """`config`: the adapter_config dict (`rlvr.rollout.lora.adapter_config_dict`); `share`, `device_id`,
        `all_gather` (this rank's handles -> every rank's): CUDA IPC and torch.distributed unless given (tests pass an
        in-process registry)."""
        from rlvr.weight_sync.lora_ipc import all_gather_handles, gpu_uuid, share_cuda_buffer

        self.rank, self.config = rank, config
        self.share, self.device_id = share or share_cuda_buffer, device_id or gpu_uuid
        self.all_gather = all_gather or all_gather_handles
        self.buffer: Any = None  # a rlvr.weight_sync.lora_ipc.AdapterBuffer, from the first send
        self.handles: dict[str, Any] = {}
        self.key = ""

    def engine_info(self) -> None:
        return None

    def send(self, named: Named, version: int, deliver: Deliver | None = None) -> dict[str, Any]:
        t0 = time.perf_counter()
        live = named.live() if hasattr(named, "live") else list(named)  # an AdapterSnapshot: no host copy
        if not live:
            raise ValueError("lora_ipc: the learner sent no adapter tensors")
        if self.buffer is None:  # the first sync: every rank at once (the all-gather is a collective)
            dtype = getattr(named, "dtype", live[0][1].dtype)
            from rlvr.weight_sync.lora_ipc import AdapterBuffer

            self.buffer = AdapterBuffer(live, dtype, live[0][1].device)
            mine = {self.device_id(self.buffer.raw.device): self.share(self.buffer.raw)}
            self.handles = {k: v for h in self.all_gather(mine) for k, v in h.items()}
            self.key = uuid.uuid4().hex
        self.buffer.fill(live)
        if self.rank != 0:
            return {}
        return {
            HANDOFF: {"key": self.key, "version": version, "handles": self.handles, "config": self.config}
            | self.buffer.layout(),
            "sync/seconds": time.perf_counter() - t0,
            "sync/bytes": float(self.buffer.raw.numel()),
        }

    def close(self) -> None:
        self.buffer = None


def make_sender(
    kind: str,
    *,
    rank: int,
    addr: str = "",
    port: int = 0,
    world_size: int = 1,
    timeout_s: float = 300.0,
    named_weights: Callable[[], Named] | None = None,
    lora: Any = None,
    model_path: str = "",
    previous: WeightSender | None = None,
) -> WeightSender:
    """A learner rank's sender. `addr:port`: the group's rendezvous on learner rank 0 (world = 1 + the engines' ranks);
    `named_weights()`: the learner's tensors in send order (iterated once here, on every rank, for "nccl"/"ipc"
    metadata); `lora`/`model_path`: the adapter's `LoraSpec` and base model (for "shm"). Blocks, for "gloo"/"nccl"
    on rank 0, until every engine joined: build concurrently with the engines' `make_receiver`. `previous`: this
    rank's sender before a reconnect (an engine replaced); "shm" keeps it, and its directories, which the engines'
    requests name; "lora_ipc" keeps it, and its shared buffer."""
    _check_kind(kind)
    if kind == "shm" and isinstance(previous, ShmSender) and previous.rank == rank:
        return previous
    if kind == "lora_ipc":
        if isinstance(previous, LoraIpcSender) and previous.rank == rank:
            return previous  # its buffer and handles stay valid; a replaced engine opens them at its first load
        from rlvr.rollout.lora import plain_adapter_config

        return LoraIpcSender(rank, plain_adapter_config(lora, model_path))
    if kind == "gloo":
        from rlvr.weight_sync.gloo import GlooWeightGroup

        return GlooSender(rank, GlooWeightGroup(addr, port, 0, world_size, timeout_s) if rank == 0 else None)
    if kind == "shm":
        from rlvr.rollout.lora import SharedMemoryAdapters

        return ShmSender(rank, SharedMemoryAdapters(lora, model_path, "learner") if rank == 0 else None)
    from rlvr.weight_sync.nccl import weight_metadata

    if named_weights is None:
        raise ValueError(f"the {kind} transport needs named_weights (its metadata pass)")
    meta = weight_metadata(named_weights())
    if kind == "ipc":
        return IpcSender(rank, meta)
    if rank != 0:
        return NcclSender(rank, meta)
    from rlvr.weight_sync.nccl import NcclWeightSender

    return NcclSender(rank, meta, NcclWeightSender(addr, port, world_size))


# ------------------------------------------------------------------ receivers (engine side)
class TensorReceiver:
    """Tensors arrive in this process (a gloo broadcast), then `load(named, version)` on the engine: the transformers
    engine's `load_weights`, or `load_adapter` (both engines) for a LoRA adapter."""

    def __init__(self, group: Any, load: Callable[[Named, int], None]) -> None:
        self.group, self.load = group, load

    def begin(self) -> float:
        return 0.0

    def receive(self, version: int, info: Any = None) -> dict[str, float]:
        t0 = time.perf_counter()
        named = list(self.group.receive())
        t1 = time.perf_counter()
        self.load(named, version)
        return {"sync/receive_s": t1 - t0, "sync/load_s": time.perf_counter() - t1}

    def close(self) -> None:
        self.group.close()


class NcclReceiver:
    """vLLM receives and loads the broadcast itself (`receive_weights_nccl`, given the sender's `engine_info`)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def begin(self) -> float:
        return 0.0

    def receive(self, version: int, info: Any = None) -> dict[str, float]:
        t0 = time.perf_counter()
        phases = self.engine.receive_weights_nccl(info, version)  # pause / receive+load / finish seconds
        return {**phases, "sync/receive_s": time.perf_counter() - t0, "sync/load_s": 0.0}

    def close(self) -> None:
        pass


class IpcReceiver:
    """`begin` opens vLLM's update session (paused); chunks load as learner rank 0 delivers them
    (`update_weights_chunk`); `receive` finishes the session, stamps the version and resumes."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def begin(self) -> float:
        return self.engine.begin_weight_update()

    def receive(self, version: int, info: Any = None) -> dict[str, float]:
        return self.engine.finish_weight_update(version)

    def close(self) -> None:
        pass


class AdapterDirReceiver:
    """ "shm": the engine loads the adapter directory at the handed-over path (on this host)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def begin(self) -> float:
        return 0.0

    def receive(self, version: int, info: Any = None) -> dict[str, float]:
        t0 = time.perf_counter()
        self.engine.load_adapter_dir(str(info), version)
        return {"sync/load_s": time.perf_counter() - t0}

    def close(self) -> None:
        pass


class AdapterIpcReceiver:
    """ "lora_ipc": the vLLM engine loads the adapter from the learners' shared GPU buffers (the handed-over
    descriptor)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def begin(self) -> float:
        return 0.0

    def receive(self, version: int, info: Any = None) -> dict[str, float]:
        t0 = time.perf_counter()
        phases = self.engine.load_adapter_ipc(info, version)  # pause / load / finish seconds
        return {**phases, "sync/load_s": time.perf_counter() - t0}

    def close(self) -> None:
        pass


def make_receiver(
    kind: str,
    engine: Any,
    *,
    addr: str = "",
    port: int = 0,
    rank: int = 1,
    world_size: int = 2,
    timeout_s: float = 300.0,
    lora: bool = False,
) -> WeightReceiver:
    """An engine's receiver: joins learner rank 0's group at `addr:port` as `rank` (the first of its tensor-parallel
    workers for "nccl"); `lora`: the learner sends a LoRA adapter, not full weights."""
    _check_kind(kind)
    if kind == "gloo":
        from rlvr.weight_sync.gloo import GlooWeightGroup

        return TensorReceiver(
            GlooWeightGroup(addr, port, rank, world_size, timeout_s),
            engine.load_adapter if lora else engine.load_weights,
        )
    if kind == "shm":
        return AdapterDirReceiver(engine)
    if kind == "lora_ipc":
        return AdapterIpcReceiver(engine)
    engine.init_weight_transfer(addr, port, rank, world_size, timeout_s)  # NCCL: blocks until the group is whole
    return NcclReceiver(engine) if kind == "nccl" else IpcReceiver(engine)
