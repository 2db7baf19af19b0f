"""The weight-transport interface (rlvr.weight_sync.transport) and the driver's sync sequence
(rlvr.orchestration.weight_updates.WeightUpdater) for every kind, in process: fake learner and engine actors run the
real senders and receivers (a real gloo group on localhost; NCCL, CUDA IPC and the adapter store faked below them)
behind a fake Ray whose `.remote` calls run on threads. Checked: the order of gather, send, pause, load, version stamp
and resume (and, for sleeping colocated engines, wake weights -> update -> wake KV cache), what every engine ends
holding, which metrics come back, and that an engine dying mid-update names it. For "lora_ipc" the CUDA IPC handles
are an in-process registry of CPU buffers, one per learner rank's "GPU"; each engine reads the one on its own."""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import ray
import torch

from rlvr.launch.local_cluster import free_port
from rlvr.orchestration import actors as actors_module
from rlvr.orchestration import weight_updates
from rlvr.orchestration.health import EngineFailure
from rlvr.rollout.lora import read_adapter_dir, write_adapter_dir
from rlvr.weight_sync import transport
from rlvr.weight_sync.nccl import weight_metadata
from rlvr.weight_sync.transport import (
    HANDOFF,
    KINDS,
    AdapterDirReceiver,
    AdapterIpcReceiver,
    IpcReceiver,
    IpcSender,
    LoraIpcSender,
    NcclReceiver,
    NcclSender,
    ShmSender,
    WeightReceiver,
    WeightSender,
    make_receiver,
    make_sender,
    pick_kind,
    send_all,
)

VERSION = 3
NUM_ENGINES = 2


class Log:
    def __init__(self) -> None:
        self.events: list[str] = []
        self.lock = threading.Lock()

    def add(self, event: str) -> None:
        with self.lock:
            self.events.append(event)

    def index(self, event: str) -> int:
        return self.events.index(event)

    def first(self, prefix: str) -> int:
        return next(i for i, e in enumerate(self.events) if e.startswith(prefix))

    def last(self, prefix: str) -> int:
        return max(i for i, e in enumerate(self.events) if e.startswith(prefix))


def weights() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(f"layer{i}.lora_A.weight", torch.randn(2, 3 + i, generator=g)) for i in range(3)]


class FakeWorker:
    """A learner rank: iterating its weights is the (collective) gather, logged per tensor."""

    def __init__(self, rank: int, log: Log) -> None:
        self.rank, self.log = rank, log

    def named_weights(self):
        for name, t in weights():
            self.log.add(f"r{self.rank} gather {name}")
            yield name, t


class FakeEngine:
    """The engine calls a receiver makes, logged; `held` is what the engine ended up loading."""

    def __init__(self, index: int, log: Log, bus: dict) -> None:
        self.i, self.log, self.bus = index, log, bus
        self.version, self.held = 0, {}
        self.die = False

    def _stamp(self, version: int) -> None:
        self.version = version
        self.log.add(f"e{self.i} version {version}")
        self.log.add(f"e{self.i} resume")

    # transformers engine, gloo
    def load_weights(self, named, version: int) -> None:
        self.log.add(f"e{self.i} pause")
        for name, t in named:
            self.held[name] = t.clone()
            self.log.add(f"e{self.i} load {name}")
        self._stamp(version)

    load_adapter = load_weights

    # shm
    def load_adapter_dir(self, path: str, version: int) -> None:
        _, tensors = read_adapter_dir(path)
        self.load_weights(tensors.items(), version)

    # lora_ipc: the buffer on this engine's "GPU" (gpu-<index>), read through the descriptor's layout
    def load_adapter_ipc(self, desc: dict, version: int) -> dict[str, float]:
        self.log.add(f"e{self.i} pause")
        flat = SHARED[desc["handles"][f"gpu-{self.i}"]["handle"]].view(getattr(torch, desc["dtype"]))
        for name, shape, offset in zip(desc["names"], desc["shapes"], desc["offsets"]):
            self.held[name] = flat[offset : offset + torch.Size(shape).numel()].view(shape).clone()
            self.log.add(f"e{self.i} load {name}")
        self._stamp(version)
        return {"sync/pause_s": 0.01, "sync/receive_load_s": 0.02}

    # vLLM weight transfer
    def init_weight_transfer(self, addr, port, rank, world_size, timeout_s) -> None:
        self.log.add(f"e{self.i} join rank {rank}")

    def receive_weights_nccl(self, info: dict, version: int) -> dict[str, float]:
        if self.die:
            raise ray.exceptions.RayActorError()
        assert info == self.bus["engine_info"]
        self.load_weights(((n, self.bus["wire"][self.i].get(timeout=10)[1]) for n in info["names"]), version)
        return {"sync/pause_s": 0.01, "sync/receive_load_s": 0.02, "sync/finish_s": 0.03}

    def begin_weight_update(self) -> float:
        self.log.add(f"e{self.i} pause")
        return 0.01

    def update_weights_chunk(self, info: dict) -> None:
        for name, t in info["tensors"]:
            self.held[name] = t.clone()
            self.log.add(f"e{self.i} load {name}")

    def finish_weight_update(self, version: int) -> dict[str, float]:
        self._stamp(version)
        return {"sync/finish_s": 0.02}

    # colocated sleep
    def sleep(self, level: int) -> None:
        self.log.add(f"e{self.i} sleep {level}")

    def wake_up(self, tags: list[str]) -> None:
        self.log.add(f"e{self.i} wake {','.join(tags)}")


class FakeNcclWeightSender:
    """NcclWeightSender's contract: engine info = metadata; send puts each tensor on every engine's wire."""

    def __init__(self, bus: dict, log: Log) -> None:
        self.bus, self.log = bus, log

    def update_info(self, meta: dict) -> dict:
        return dict(meta)

    def send(self, named, meta: dict) -> dict[str, float]:
        total = 0
        for name, t in named:
            for q in self.bus["wire"]:
                q.put((name, t))
            self.log.add(f"send {name}")
            total += t.numel() * t.element_size()
        return {"sync/seconds": 0.1, "sync/bytes": float(total)}

    def close(self) -> None:
        pass


class FakeIpcWeightSender:
    """IpcWeightSender's contract: one chunk per tensor handed to `deliver`, which returns once every engine loaded."""

    def __init__(self, deliver, log: Log) -> None:
        self.deliver, self.log = deliver, log

    def send(self, named, meta: dict) -> dict[str, float]:
        n = 0
        for name, t in named:
            self.log.add(f"send {name}")
            self.deliver({"tensors": [(name, t)]})
            n += 1
        return {"sync/seconds": 0.1, "sync/num_chunks": float(n)}


class FakeAdapters:
    """SharedMemoryAdapters without peft: PEFT directories under a temporary root."""

    def __init__(self, root: Path, log: Log) -> None:
        self.root, self.log, self.closed = root, log, False

    def write(self, named, version: int) -> Path:
        path = write_adapter_dir(named, {"r": 2, "lora_alpha": 4}, self.root / f"v{version}")
        self.log.add(f"write v{version}")
        return path

    def close(self) -> None:
        self.closed = True


SHARED: dict[bytes, torch.Tensor] = {}
"""The fake CUDA IPC: handle -> the shared buffer (one process, so the buffer itself)."""


def fake_share(buf: torch.Tensor) -> dict[str, Any]:
    key = f"buf{len(SHARED)}".encode()
    SHARED[key] = buf
    return {"nbytes": buf.numel(), "handle": key}


class FakeAllGather:
    """torch.distributed.all_gather_object over `n` learner ranks running on threads."""

    def __init__(self, n: int) -> None:
        self.got: list[dict] = []
        self.barrier = threading.Barrier(n, timeout=30)

    def __call__(self, mine: dict) -> list[dict]:
        self.got.append(mine)
        self.barrier.wait()
        return list(self.got)


# ------------------------------------------------------------------ fake Ray actors and a fake `ray` to call them
class FakeLearnerActor:
    """LearnerActor.send_weights without Ray: deliver IPC chunks to every engine, `send_all`."""

    def __init__(self, rank: int, log: Log, sender: WeightSender) -> None:
        self.worker, self.sender = FakeWorker(rank, log), sender

    def send_weights(self, engines: list, version: int) -> dict[str, Any]:
        def deliver(info: dict) -> None:
            FakeRay.get([e.update_weights_chunk.remote(info) for e in engines], timeout=60)

        return send_all(self.sender, self.worker.named_weights(), version, deliver)


class FakeEngineActor:
    """EngineActor's weight-sync methods without Ray: everything through its receiver."""

    def __init__(self, engine: FakeEngine, receiver: WeightReceiver) -> None:
        self.engine, self.receiver = engine, receiver

    def begin_weight_sync(self) -> float:
        return self.receiver.begin()

    def receive_weights(self, version: int, info: Any = None) -> dict[str, float]:
        return self.receiver.receive(version, info)

    def update_weights_chunk(self, info: dict) -> None:
        self.engine.update_weights_chunk(info)

    def sleep(self, level: int) -> None:
        self.engine.sleep(level)

    def wake_up(self, tags: list[str]) -> None:
        self.engine.wake_up(tags)


POOL = ThreadPoolExecutor(max_workers=16)


class Handle:
    """`handle.method.remote(*args)` runs the method on a thread and returns its Future (Ray's concurrency)."""

    def __init__(self, obj: Any) -> None:
        self._obj = obj

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._obj, name)
        return SimpleNamespace(remote=lambda *args: POOL.submit(method, *args))


class FakeRay:
    exceptions = ray.exceptions
    ObjectRef = ray.ObjectRef

    @staticmethod
    def get(refs: Any, timeout: float | None = None) -> Any:
        if isinstance(refs, Future):
            return refs.result(timeout)
        return [f.result(timeout) for f in refs]

    @staticmethod
    def cancel(ref: Any, force: bool = False) -> None:
        pass


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weight_updates, "ray", FakeRay)
    monkeypatch.setattr(actors_module, "ray", FakeRay)


def build(kind: str, log: Log, tmp_path: Path, num_learners: int = 2) -> tuple[SimpleNamespace, list[FakeEngine], dict]:
    """Learners and engines connected over `kind` (what ActorFactory.connect_weight_sync does)."""
    import queue

    bus: dict[str, Any] = {"wire": [queue.Queue() for _ in range(NUM_ENGINES)]}
    engines = [FakeEngine(i, log, bus) for i in range(NUM_ENGINES)]
    meta = weight_metadata(weights(), wire_dtype=None)
    if kind == "gloo":  # the real group: rank 0's store waits for every engine, so connect them concurrently
        port, world = free_port(), 1 + NUM_ENGINES
        futs = [
            POOL.submit(make_sender, "gloo", rank=r, addr="127.0.0.1", port=port, world_size=world, timeout_s=30)
            for r in range(num_learners)
        ]
        recv = [
            POOL.submit(
                make_receiver,
                "gloo",
                e,
                addr="127.0.0.1",
                port=port,
                rank=1 + e.i,
                world_size=world,
                timeout_s=30,
                lora=True,
            )
            for e in engines
        ]
        senders, receivers = [f.result(60) for f in futs], [f.result(60) for f in recv]
    elif kind == "nccl":
        senders = [NcclSender(r, meta, FakeNcclWeightSender(bus, log) if r == 0 else None) for r in range(num_learners)]
        receivers = [make_receiver("nccl", e, rank=1 + e.i, world_size=1 + NUM_ENGINES) for e in engines]
    elif kind == "ipc":
        senders = [
            IpcSender(r, meta, make=lambda deliver: FakeIpcWeightSender(deliver, log)) for r in range(num_learners)
        ]
        receivers = [make_receiver("ipc", e) for e in engines]
    elif kind == "lora_ipc":
        gather = FakeAllGather(num_learners)
        senders = [
            LoraIpcSender(r, {"r": 2}, share=fake_share, device_id=lambda d, r=r: f"gpu-{r}", all_gather=gather)
            for r in range(num_learners)
        ]
        receivers = [make_receiver("lora_ipc", e) for e in engines]
    else:
        senders = [ShmSender(r, FakeAdapters(tmp_path, log) if r == 0 else None) for r in range(num_learners)]
        receivers = [make_receiver("shm", e) for e in engines]
    bus["engine_info"] = senders[0].engine_info()
    assert all(isinstance(s, WeightSender) for s in senders) and all(isinstance(r, WeightReceiver) for r in receivers)
    factory = SimpleNamespace(transport="gloo", sync_transport=kind, sync_info=bus["engine_info"], colocated=True)
    actors = SimpleNamespace(
        learners=[Handle(FakeLearnerActor(r, log, s)) for r, s in enumerate(senders)],
        engines=[Handle(FakeEngineActor(e, rc)) for e, rc in zip(engines, receivers)],
        factory=factory,
    )
    return actors, engines, bus


@pytest.mark.parametrize("asleep", [False, True], ids=["awake", "asleep"])
@pytest.mark.parametrize("kind", KINDS)
def test_sync_order_and_result(kind: str, asleep: bool, fake_ray: None, tmp_path: Path) -> None:
    log = Log()
    actors, engines, _ = build(kind, log, tmp_path)
    updater = weight_updates.WeightUpdater(actors, timeout_s=60)
    if asleep:
        updater.sleep_engines()
    out = updater.sync(VERSION)

    want = dict(weights())
    for e in engines:
        assert e.version == VERSION
        assert e.held.keys() == want.keys() and all(torch.equal(e.held[n], want[n]) for n in want)
        i = e.i
        first_load, last_load = log.first(f"e{i} load "), log.last(f"e{i} load ")
        # pause -> load -> version stamp -> resume, each tensor loaded after learner rank 0 gathered it
        assert (
            log.index(f"e{i} pause")
            < first_load
            < last_load
            < log.index(f"e{i} version {VERSION}")
            < log.index(f"e{i} resume")
        )
        for name in want:
            assert log.index(f"r0 gather {name}") < log.index(f"e{i} load {name}")
        if kind == "ipc":  # engines paused before the learners start gathering
            assert log.index(f"e{i} pause") < log.first("r0 gather")
        if asleep:
            assert log.index(f"e{i} sleep 1") < log.index(f"e{i} wake weights") < log.index(
                f"e{i} pause"
            ) and log.index(f"e{i} resume") < log.index(f"e{i} wake kv_cache")
        else:
            assert not any("wake" in ev for ev in log.events)
    # every learner rank took part in the gathers (ZeRO-3 collectives), rank 1 included
    assert all(f"r1 gather {name}" in log.events for name in want)
    if kind == "shm":
        assert log.index(f"write v{VERSION}") < min(log.first(f"e{i} load ") for i in range(NUM_ENGINES))
    assert not updater.engines_asleep
    assert HANDOFF not in out and not any(isinstance(v, str) for v in out.values())
    assert "sync/seconds" in out
    if kind in ("gloo", "shm"):
        assert out["sync/engine_load_s_max"] >= 0
    if kind == "nccl":
        assert out["sync/engine_pause_s_max"] == 0.01 and out["sync/engine_load_s_max"] == 0.0
    if kind == "ipc":
        assert out["sync/num_chunks"] == len(want) and out["sync/engine_finish_s_max"] == 0.02
    if kind == "lora_ipc":
        assert out["sync/engine_receive_load_s_max"] == 0.02 and out["sync/engine_load_s_max"] >= 0


def test_engine_dying_mid_update_is_named(fake_ray: None, tmp_path: Path) -> None:
    log = Log()
    actors, engines, _ = build("nccl", log, tmp_path, num_learners=1)
    engines[1].die = True
    with pytest.raises(EngineFailure) as err:
        weight_updates.WeightUpdater(actors, timeout_s=60).sync(VERSION)
    assert err.value.index == 1 and "weight sync" in str(err.value)


def test_send_all_drains_the_gathers_when_the_send_fails() -> None:
    log = Log()

    class Broken:
        def send(self, named, version, deliver=None):
            next(iter(named))
            raise RuntimeError("link down")

    with pytest.raises(RuntimeError, match="link down"):
        send_all(Broken(), FakeWorker(0, log).named_weights(), VERSION)
    assert [e for e in log.events if "gather" in e] == [f"r0 gather {n}" for n, _ in weights()]


def test_ranks_above_zero_send_nothing(tmp_path: Path) -> None:
    meta = weight_metadata(weights(), wire_dtype=None)
    for sender in (
        NcclSender(1, meta),
        IpcSender(1, meta, make=lambda d: FakeIpcWeightSender(d, Log())),
        ShmSender(1),
        transport.GlooSender(1),
    ):
        got = send_all(sender, weights(), VERSION)
        assert got == {} or "sync/seconds" in got  # IPC: every rank shares its own GPU's tensors
        assert sender.engine_info() is None


def test_ipc_rank_zero_needs_delivery() -> None:
    sender = IpcSender(0, {}, make=lambda d: FakeIpcWeightSender(d, Log()))
    with pytest.raises(ValueError, match="deliver"):
        sender.send(weights(), VERSION)


def test_reconnect_keeps_the_adapter_store(tmp_path: Path) -> None:
    old = ShmSender(0, FakeAdapters(tmp_path, Log()))
    assert make_sender("shm", rank=0, previous=old) is old
    shared = LoraIpcSender(0, {}, share=fake_share, device_id=lambda d: "gpu-0")
    assert make_sender("lora_ipc", rank=0, previous=shared) is shared  # the engines keep its handles


def test_lora_ipc_shares_its_buffer_once_and_hands_over_only_a_descriptor() -> None:
    shares: list[torch.Tensor] = []

    def share(buf: torch.Tensor) -> dict[str, Any]:
        shares.append(buf)
        return fake_share(buf)

    sender = LoraIpcSender(0, {"r": 2}, share=share, device_id=lambda d: "gpu-0")
    first = sender.send(weights(), 1)
    changed = [(n, t + 1) for n, t in weights()]
    second = sender.send(changed, 2)
    assert len(shares) == 1  # one buffer, shared once; a sync only refills it
    d1, d2 = first[HANDOFF], second[HANDOFF]
    assert d1["key"] == d2["key"] and d1["handles"] == d2["handles"] and d2["version"] == 2
    assert d2["names"] == [n for n, _ in weights()] and d2["shapes"] == [list(t.shape) for _, t in weights()]
    flat = SHARED[d2["handles"]["gpu-0"]["handle"]].view(torch.float32)
    assert torch.equal(flat, torch.cat([t.reshape(-1) for _, t in changed]))
    assert second["sync/bytes"] == sum(t.numel() * 4 for _, t in weights())
    with pytest.raises(ValueError, match="changed names or shapes"):
        sender.send(weights()[:2], 3)


def test_factories_know_every_kind_and_refuse_others() -> None:
    for kind in KINDS:
        assert transport.steps(kind) in transport.STEPS.values()
    assert transport.steps("ipc").begin and not transport.steps("shm").concurrent
    for make in (
        lambda: make_sender("tcp", rank=0),
        lambda: make_receiver("tcp", object()),
        lambda: transport.steps("tcp"),
    ):
        with pytest.raises(ValueError, match="unknown weight-sync transport 'tcp'"):
            make()
    engine = FakeEngine(0, Log(), {})
    assert isinstance(make_receiver("nccl", engine), NcclReceiver)
    assert isinstance(make_receiver("ipc", engine), IpcReceiver)
    assert isinstance(make_receiver("shm", engine), AdapterDirReceiver)
    assert isinstance(make_receiver("lora_ipc", engine), AdapterIpcReceiver)
    assert transport.ranks_per_engine("lora_ipc", 1) == 1 and not transport.steps("lora_ipc").concurrent
    assert transport.ranks_per_engine("nccl", 4) == 4 and transport.ranks_per_engine("ipc", 4) == 1


@pytest.mark.parametrize(
    "gpu,vllm,lora,colocate,one_host,want",
    [
        (False, False, False, False, False, "gloo"),
        (True, False, False, False, False, "gloo"),
        (True, True, False, False, False, "nccl"),
        (True, True, False, True, False, "ipc"),
        (True, True, True, True, False, "lora_ipc"),
        (True, True, True, True, True, "lora_ipc"),
        (True, False, True, True, True, "shm"),  # the transformers engine: no CUDA IPC loader
        (True, True, True, False, False, "gloo"),
        (True, True, True, False, True, "shm"),
        (False, False, True, False, True, "shm"),
    ],
)
def test_pick_kind(gpu: bool, vllm: bool, lora: bool, colocate: bool, one_host: bool, want: str) -> None:
    assert pick_kind(gpu=gpu, vllm=vllm, lora=lora, colocate=colocate, one_host=one_host) == want


def test_lora_sync_env_selects_the_shared_memory_path(monkeypatch: pytest.MonkeyPatch) -> None:
    args = {"gpu": True, "vllm": True, "lora": True, "colocate": True}
    monkeypatch.setenv(transport.LORA_SYNC_ENV, "shm")
    assert pick_kind(**args, one_host=True) == "shm" and pick_kind(**args) == "gloo"
    assert pick_kind(gpu=True, vllm=True, lora=False, colocate=True) == "ipc"  # full weights: unaffected
    monkeypatch.setenv(transport.LORA_SYNC_ENV, "disk")
    with pytest.raises(ValueError, match="RLVR_LORA_SYNC='disk'"):
        pick_kind(**args)


def test_learner_get_names_the_rank_that_died(fake_ray: None) -> None:
    from rlvr.orchestration.health import LearnerFailure

    def die() -> None:
        raise ray.exceptions.RayActorError()

    refs = [POOL.submit(lambda: {}), POOL.submit(die)]
    with pytest.raises(LearnerFailure) as err:
        weight_updates.learner_get(refs, "send_weights", 10)
    assert err.value.index == 1 and "died during send_weights" in str(err.value)
