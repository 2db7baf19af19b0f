"""The "lora_ipc" LoRA sync (rlvr.weight_sync.lora_ipc, rlvr.rollout.vllm_lora_ipc) on CPU: a real learner (tiny model,
real peft, bf16 base) fills the shared buffer from its live parameters without a host copy; the vLLM worker side
opens it, copies it out and installs it through vLLM's LoRA classes, here small fakes with vLLM 0.26's semantics
(scaling alpha / r folded into lora_B in place when an adapter is registered, the slot filled at activation). The
CUDA IPC handle is an in-process registry. Checked: the slot computes what the learner's adapter computes (the
per-module delta scaling * B @ A), again after the adapter changed, with the handle opened once; the learner's buffer
is never written by the engine; the checks vLLM makes on a directory (legal config, served modules) and a missing
GPU handle fail with the reason. The real vLLM path is tests/gpu/test_gpu_lora_ipc.py."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from rlvr.config import default_config, from_dict
from rlvr.data import builtin_corpus
from rlvr.models.tiny import build_tiny_model_dir
from rlvr.rollout import lora
from rlvr.rollout import vllm_lora_ipc as worker_side
from rlvr.weight_sync.transport import HANDOFF, LoraIpcSender, send_all

pytest.importorskip("peft")

RANK, ALPHA = 4, 8
SHARED: dict[bytes, torch.Tensor] = {}
OPENED: list[bytes] = []


def fake_share(buf: torch.Tensor) -> dict[str, Any]:
    key = f"buf{len(SHARED)}".encode()
    SHARED[key] = buf
    return {"nbytes": buf.numel(), "handle": key}


def fake_open(h: dict[str, Any], device_index: int) -> torch.Tensor:
    OPENED.append(h["handle"])
    return SHARED[h["handle"]]


# ------------------------------------------------------------------ vLLM 0.26's LoRA classes, reduced to their semantics
class FakePEFTHelper:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.r, self.lora_alpha = int(cfg["r"]), int(cfg["lora_alpha"])
        self.scaling = self.lora_alpha / (self.r**0.5 if cfg.get("use_rslora") else self.r)
        self.max_position_embeddings = cfg["vllm_max_position_embeddings"]

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> FakePEFTHelper:
        return cls(cfg)

    def validate_legal(self, lora_config: Any) -> None:
        if self.r > lora_config.max_lora_rank:
            raise ValueError(f"LoRA rank {self.r} is greater than max_lora_rank {lora_config.max_lora_rank}.")


def parse_fine_tuned_lora_name(name: str, weights_mapper: Any = None) -> tuple[str, bool]:
    parts = name.removeprefix("base_model.model.").split(".")
    assert parts[-1] == "weight" and parts[-2] in ("lora_A", "lora_B"), name
    return ".".join(parts[:-2]), parts[-2] == "lora_A"


class FakeLoRAModel:
    def __init__(self, lora_id: int, loras: dict[str, dict[str, Any]]) -> None:
        self.id, self.loras = lora_id, loras

    @classmethod
    def from_lora_tensors(cls, lora_model_id, tensors, peft_helper, device, dtype, **kwargs) -> FakeLoRAModel:
        loras: dict[str, dict[str, Any]] = {}
        for name, t in tensors.items():
            module, is_a = parse_fine_tuned_lora_name(name)
            entry = loras.setdefault(module, {"scaling": peft_helper.scaling})
            entry["a" if is_a else "b"] = t.to(device=device, dtype=dtype)  # no copy when both match, as in vLLM
        return cls(lora_model_id, loras)


class FakeAdapterManager:
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, supported: list[str]) -> None:
        self.supported_lora_modules = supported
        self.model = SimpleNamespace()
        self.capacity = 1
        self.registered: dict[int, FakeLoRAModel] = {}
        self.slot: dict[str, torch.Tensor] = {}
        self.calls: list[str] = []

    def __len__(self) -> int:
        return len(self.registered)

    def remove_adapter(self, lora_id: int) -> bool:
        self.calls.append("remove")
        return self.registered.pop(lora_id, None) is not None

    def remove_oldest_adapter(self) -> bool:
        self.registered.pop(next(iter(self.registered)))
        return True

    def add_adapter(self, model: FakeLoRAModel) -> bool:
        self.calls.append("add")
        for entry in model.loras.values():  # LoRALayerWeights.optimize: lora_b *= scaling, in place
            entry["b"] *= entry["scaling"]
        self.registered[model.id] = model
        return True

    def activate_adapter(self, lora_id: int) -> bool:
        self.calls.append("activate")
        self.slot = {m: (e["b"].float() @ e["a"].float()) for m, e in self.registered[lora_id].loras.items()}
        return True


def worker_manager(supported: list[str] | None = None, max_rank: int = 16) -> Any:
    mgr = FakeAdapterManager(supported or ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"])
    return SimpleNamespace(
        _adapter_manager=mgr,
        lora_config=SimpleNamespace(max_lora_rank=max_rank, lora_dtype=torch.bfloat16),
        max_position_embeddings=2048,
        vocab_size=14,
    )


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    def mod(name: str, **attrs: Any) -> None:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, m)

    for name in ("vllm", "vllm.lora"):
        mod(name)
    mod("vllm.lora.peft_helper", PEFTHelper=FakePEFTHelper)
    mod("vllm.lora.utils", parse_fine_tuned_lora_name=parse_fine_tuned_lora_name)
    mod("vllm.lora.lora_model", LoRAModel=FakeLoRAModel)
    monkeypatch.setattr(worker_side, "open_cuda_buffer", fake_open)
    monkeypatch.setattr(worker_side, "gpu_uuid", lambda device: "gpu-0")
    OPENED.clear()


# ------------------------------------------------------------------ a real learner
@pytest.fixture(scope="module")
def learner(tmp_path_factory) -> Any:
    from rlvr.learner.worker import LearnerWorker

    learner_cfg = {"lora_rank": RANK, "lora_alpha": ALPHA, "backend": "torch", "warmup_steps": 0}
    cfg = from_dict(
        {"learner": learner_cfg, "model": {"dtype": "bfloat16"}, "data": {"datasets": ["builtin:copy"]}},
        base=default_config(),
    )
    model_dir = build_tiny_model_dir(cfg.model, builtin_corpus("copy"), tmp_path_factory.mktemp("m"), cfg.seed)
    return LearnerWorker(cfg, str(model_dir), 0, 1, "127.0.0.1", 0, "cpu", num_threads=1)


def perturb(w: Any, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in w.model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def learner_deltas(w: Any) -> dict[str, torch.Tensor]:
    """scaling * B @ A per adapted module, from the learner's live parameters in the base dtype (what peft adds)."""
    t = {n: v.to(torch.bfloat16).float() for n, v in lora.adapter_tensors(w.model).items()}
    out = {}
    for name, a in t.items():
        if ".lora_A." in name:
            module = name.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            out[module] = (ALPHA / RANK) * t[name.replace(".lora_A.", ".lora_B.")] @ a
    return out


def sender() -> LoraIpcSender:
    return LoraIpcSender(0, {"r": RANK, "lora_alpha": ALPHA}, share=fake_share, device_id=lambda d: "gpu-0")


def test_snapshot_iterates_host_copies_and_hands_live_tensors_to_the_ipc_sender(learner, monkeypatch) -> None:
    perturb(learner, 0)
    want = {n: v.to(torch.bfloat16) for n, v in lora.adapter_tensors(learner.model).items()}
    got = list(learner.named_weights())  # what gloo and shm send: host copies in the base dtype, peft's names
    assert [n for n, _ in got] == list(want) and all(torch.equal(t, want[n]) for n, t in got)
    assert all(t.dtype == torch.bfloat16 for _, t in got)

    def no_host_copy(self: Any) -> None:
        raise AssertionError("the CUDA IPC sender must not make a host copy")

    monkeypatch.setattr(lora.AdapterParams, "host_copy", no_host_copy)
    s = sender()
    out = send_all(s, learner.named_weights(), 1)  # send_all drains the snapshot afterwards: nothing left to copy
    desc = out[HANDOFF]
    assert desc["names"] == list(want) and desc["dtype"] == "bfloat16" and desc["config"]["r"] == RANK
    flat = SHARED[desc["handles"]["gpu-0"]["handle"]].view(torch.bfloat16)
    assert torch.equal(flat, torch.cat([t.reshape(-1) for t in want.values()]))
    assert out["sync/bytes"] == sum(t.numel() * 2 for t in want.values())
    assert LoraIpcSender(1, {}, share=fake_share, device_id=lambda d: "gpu-1").send(learner.named_weights(), 1) == {}


class FakeGpuWorker(worker_side.LoraIpcWorkerExtension):
    """vLLM's GPU worker as the extension sees it: `model_runner.lora_manager` and `device`."""

    def __init__(self, manager: Any) -> None:
        self.model_runner = SimpleNamespace(lora_manager=manager)
        self.device = torch.device("cpu")


def test_worker_installs_what_the_learner_computes_and_never_writes_its_buffer(learner, fake_vllm) -> None:
    s, manager = sender(), worker_manager()
    worker = FakeGpuWorker(manager)
    for version, seed in ((1, 1), (2, 2)):
        perturb(learner, seed)
        desc = s.send(learner.named_weights(), version)[HANDOFF]
        shared = SHARED[desc["handles"]["gpu-0"]["handle"]]
        before = shared.clone()
        out = getattr(worker, worker_side.RPC_METHOD)(desc, 1)  # what collective_rpc calls
        assert torch.equal(shared, before)  # vLLM scaled lora_B in the worker's copy, not in the learner's buffer
        want = learner_deltas(learner)
        got = manager._adapter_manager.slot
        assert got.keys() == want.keys()
        for module in want:
            torch.testing.assert_close(got[module], want[module], rtol=0, atol=1e-6)
        assert out["seconds"] >= 0
    assert len(OPENED) == 1  # one handle, opened at the first load
    assert manager._adapter_manager.calls == ["remove", "add", "activate"] * 2  # vLLM's in-place reload


def test_worker_refuses_what_vllm_would_refuse(learner, fake_vllm) -> None:
    desc = sender().send(learner.named_weights(), 1)[HANDOFF]
    with pytest.raises(ValueError, match="greater than max_lora_rank"):
        worker_side.IpcAdapterSlot().load(worker_manager(max_rank=2), torch.device("cpu"), desc, 1)
    with pytest.raises(ValueError, match="not on .*down_proj"):
        worker_side.IpcAdapterSlot().load(
            worker_manager(["qkv_proj", "o_proj", "gate_up_proj"]), torch.device("cpu"), desc, 1
        )
    elsewhere = {**desc, "handles": {"gpu-7": desc["handles"]["gpu-0"]}}
    with pytest.raises(ValueError, match="RLVR_LORA_SYNC=shm"):
        worker_side.IpcAdapterSlot().load(worker_manager(), torch.device("cpu"), elsewhere, 1)


def test_the_extension_is_what_vllm_mixes_into_its_worker() -> None:
    ext = lora.vllm_engine_args(lora.LoraSpec(RANK, ALPHA, 0.0, ("q_proj",)))["worker_extension_cls"]
    module, _, name = ext.rpartition(".")
    cls = getattr(sys.modules[module], name)
    assert cls is worker_side.LoraIpcWorkerExtension
    # vLLM asserts its worker has none of the extension's attributes: every public name carries rlvr_
    assert [a for a in dir(cls) if not a.startswith("__")] == [worker_side.RPC_METHOD]
