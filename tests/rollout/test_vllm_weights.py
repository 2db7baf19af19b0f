"""The vLLM engine's weight updates (rlvr.rollout.vllm_weights, mixed into VLLMEngine) without a GPU: a fake `vllm`
package (only the names the engine imports) stands in sys.modules for this test, and a fake AsyncLLM logs what the
engine asks of it. Checked: pause -> start session -> update -> finish session -> version stamp -> resume for NCCL and
CUDA IPC, the IPC handles pickled for vLLM's RPC, LoRA adapters added in place under one id (from a directory with
`add_lora`, or from the learner's shared GPU buffer through rlvr's worker extension and `collective_rpc`), a failed
update marking the engine failed, and that the engine no longer offers `load_weights` (full weights only through vLLM's API)."""

from __future__ import annotations

import base64
import pickle
import sys
import types
from typing import Any

import pytest
import torch

from rlvr.config import ExperimentConfig
from rlvr.rollout.base import EngineError


class _Req:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.__dict__.update(kwargs)


class FakeLoRARequest:
    def __init__(self, name: str, lora_id: int, path: str, load_inplace: bool = False) -> None:
        self.name, self.lora_id, self.path, self.load_inplace = name, lora_id, path, load_inplace


class FakeAsyncLLM:
    log: list[str] = []
    fail_update = False

    @classmethod
    def from_engine_args(cls, args: Any, stat_loggers: Any = None) -> FakeAsyncLLM:
        llm = cls()
        llm.args, llm.updates, llm.loras, llm.inits, llm.rpcs = args, [], [], [], []
        return llm

    async def pause_generation(self, mode: str, clear_cache: bool) -> None:
        self.log.append(f"pause {mode}")

    async def start_weight_update(self) -> None:
        self.log.append("start")

    async def update_weights(self, request: Any) -> None:
        if self.fail_update:
            raise RuntimeError("transfer broke")
        self.updates.append(request.update_info)
        self.log.append("update")

    async def finish_weight_update(self) -> None:
        self.log.append("finish")

    async def reset_prefix_cache(self) -> None:
        self.log.append("reset prefix cache")

    async def resume_generation(self) -> None:
        self.log.append("resume")

    async def add_lora(self, request: FakeLoRARequest) -> bool:
        self.loras.append(request)
        self.log.append("add_lora")
        return True

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (), kwargs: Any = None):
        if self.fail_update:
            raise RuntimeError("worker broke")
        self.rpcs.append((method, args))
        self.log.append(f"rpc {method}")
        return [{"seconds": 0.001}]  # one worker's result

    async def sleep(self, level: int, mode: str) -> None:
        self.log.append(f"sleep {level} {mode}")
        self.sleeping = True

    async def wake_up(self, tags: Any) -> None:
        self.log.append(f"wake {tags}")
        self.sleeping = tags is not None and "kv_cache" not in tags

    async def is_sleeping(self) -> bool:
        return bool(getattr(self, "sleeping", False))

    async def init_weight_transfer_engine(self, request: Any) -> None:
        self.inits.append(request.init_info)

    def shutdown(self) -> None:
        self.log.append("shutdown")


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> type[FakeAsyncLLM]:
    FakeAsyncLLM.log, FakeAsyncLLM.fail_update = [], False

    def mod(name: str, **attrs: Any) -> None:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, m)

    for name in (
        "vllm",
        "vllm.engine",
        "vllm.v1",
        "vllm.v1.engine",
        "vllm.distributed",
        "vllm.distributed.weight_transfer",
        "vllm.lora",
    ):
        mod(name)
    mod("vllm.config", WeightTransferConfig=_Req)
    mod("vllm.engine.arg_utils", AsyncEngineArgs=_Req)
    mod("vllm.v1.engine.async_llm", AsyncLLM=FakeAsyncLLM)
    mod("vllm.distributed.weight_transfer.base", WeightTransferInitRequest=_Req, WeightTransferUpdateRequest=_Req)
    mod("vllm.lora.request", LoRARequest=FakeLoRARequest)
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)
    return FakeAsyncLLM


def make_engine(inflight: bool = True, lora_rank: int = 0, staged: bool = False, **kwargs: Any) -> Any:
    from rlvr.rollout.vllm_engine import VLLMEngine

    cfg = ExperimentConfig()
    cfg.rollout.backend = "vllm"
    cfg.rollout.inflight_updates = inflight
    cfg.rollout.vllm_staged_sync = staged
    cfg.rollout.vllm_enable_prefix_caching = True
    cfg.learner.lora_rank = lora_rank
    return VLLMEngine("/nonexistent/model", 0, cfg=cfg, max_model_len=128, startup_timeout_s=30, **kwargs)


@pytest.mark.parametrize("inflight", [True, False], ids=["inflight", "drain"])
def test_nccl_update_order(fake_vllm: type[FakeAsyncLLM], inflight: bool) -> None:
    from rlvr.weight_sync.transport import make_receiver

    engine = make_engine(inflight)
    try:
        receiver = make_receiver("nccl", engine, addr="10.0.0.1", port=1234, rank=3, world_size=5)
        assert engine._llm.inits == [
            {"master_address": "10.0.0.1", "master_port": 1234, "rank_offset": 3, "world_size": 5}
        ]
        meta = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2]]}
        out = receiver.receive(7, meta)
        want = (
            ["pause keep", "start", "update", "finish", "resume"]
            if inflight
            else ["pause wait", "start", "update", "finish", "reset prefix cache", "resume"]
        )
        assert fake_vllm.log == want
        assert engine._llm.updates == [{**meta, "packed": True}]
        assert engine.policy_version == 7 and engine.stats()["num_updates"] == 1
        assert {
            "sync/pause_s",
            "sync/receive_load_s",
            "sync/finish_s",
            "sync/engine_total_s",
            "sync/load_s",
        } <= out.keys()
    finally:
        engine.shutdown()


def test_ipc_chunks_travel_pickled(fake_vllm: type[FakeAsyncLLM]) -> None:
    import os

    from rlvr.weight_sync.transport import make_receiver

    engine = make_engine(weight_transfer_backend="ipc")
    try:
        assert os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"  # set before vLLM spawns its workers
        receiver = make_receiver("ipc", engine)
        assert engine._llm.inits == [{}]
        receiver.begin()
        handles = {"gpu-uuid": ("rebuild", (torch.float32, 3))}
        engine.update_weights_chunk({"names": ["w"], "ipc_handles": handles, "packed": True})
        receiver.receive(2)
        assert fake_vllm.log == ["pause keep", "start", "update", "finish", "resume"]
        info = engine._llm.updates[0]
        assert "ipc_handles" not in info and pickle.loads(base64.b64decode(info["ipc_handles_pickled"])) == handles
        assert engine.policy_version == 2
    finally:
        engine.shutdown()


def test_lora_adapter_replaced_in_place(fake_vllm: type[FakeAsyncLLM]) -> None:
    pytest.importorskip("peft")
    from rlvr.rollout.lora import read_adapter_dir
    from rlvr.rollout.vllm_weights import LORA_ID

    engine = make_engine(lora_rank=4)
    try:
        named = [
            ("base_model.model.q.lora_A.weight", torch.ones(4, 8)),
            ("base_model.model.q.lora_B.weight", torch.zeros(8, 4)),
        ]
        engine.load_adapter(named, 4)
        assert fake_vllm.log == ["pause keep", "add_lora", "resume"]  # no weight-transfer session for an adapter
        req = engine._llm.loras[0]
        assert req.lora_id == LORA_ID and req.load_inplace
        _, tensors = read_adapter_dir(req.path)
        assert torch.equal(tensors["base_model.model.q.lora_A.weight"], named[0][1])
        assert engine.policy_version == 4 and engine._lora_request.path == req.path
        assert not engine._lora_request.load_inplace  # requests never carry load_inplace
    finally:
        engine.shutdown()


def test_lora_adapter_from_shared_gpu_memory(fake_vllm: type[FakeAsyncLLM]) -> None:
    import os

    from rlvr.rollout.vllm_lora_ipc import RPC_METHOD
    from rlvr.rollout.vllm_weights import LORA_ID
    from rlvr.weight_sync.transport import make_receiver

    engine = make_engine(lora_rank=4)
    try:
        assert engine._llm.args.worker_extension_cls == "rlvr.rollout.vllm_lora_ipc.LoraIpcWorkerExtension"
        receiver = make_receiver("lora_ipc", engine)
        assert engine._llm.inits == []  # no weight-transfer group for adapters
        desc = {"key": "k1", "version": 5, "names": ["base_model.model.q.lora_A.weight"], "handles": {}}
        out = receiver.receive(5, desc)
        assert fake_vllm.log == ["pause keep", f"rpc {RPC_METHOD}", "resume"]  # no session, no add_lora
        assert engine._llm.rpcs == [(RPC_METHOD, (desc, LORA_ID))] and engine._llm.loras == []
        assert engine.policy_version == 5 and engine.stats()["num_updates"] == 1
        req = engine._lora_request  # what requests carry from now on: the adapter id vLLM holds
        assert req.lora_id == LORA_ID and not req.load_inplace and not os.path.exists(req.path)
        keys = {"sync/pause_s", "sync/receive_load_s", "sync/worker_load_s", "sync/finish_s", "sync/engine_total_s"}
        assert keys | {"sync/load_s"} <= out.keys() and out["sync/worker_load_s"] == 0.001
        receiver.receive(6, desc)
        assert engine._lora_request is req and engine.policy_version == 6

        class Core:  # AsyncLLM.engine_core: the scheduler pause without pause_generation's 20 ms settling sleep
            async def pause_scheduler_async(self, mode: str, clear_cache: bool) -> None:
                fake_vllm.log.append(f"pause scheduler {mode}")

        engine._llm.engine_core = Core()
        fake_vllm.log.clear()
        receiver.receive(7, desc)
        assert fake_vllm.log == ["pause scheduler keep", f"rpc {RPC_METHOD}", "resume"]
        fake_vllm.fail_update = True
        with pytest.raises(RuntimeError, match="worker broke"):
            receiver.receive(8, desc)
        with pytest.raises(EngineError, match="worker broke"):
            engine.poll()
        assert engine.policy_version == 7
    finally:
        engine.shutdown()


def test_lora_ipc_update_drains_with_vllms_own_pause(fake_vllm: type[FakeAsyncLLM]) -> None:
    from rlvr.rollout.vllm_lora_ipc import RPC_METHOD

    engine = make_engine(inflight=False, lora_rank=4)
    try:
        engine._llm.engine_core = types.SimpleNamespace(pause_scheduler_async=None)  # draining: never used to pause
        engine.load_adapter_ipc({"key": "k"}, 3)
        assert fake_vllm.log == ["pause wait", f"rpc {RPC_METHOD}", "reset prefix cache", "resume"]
    finally:
        engine.shutdown()


def test_no_load_weights_and_adapters_need_lora(fake_vllm: type[FakeAsyncLLM]) -> None:
    from rlvr.rollout.vllm_engine import VLLMEngine

    assert not hasattr(VLLMEngine, "load_weights")
    engine = make_engine()
    try:
        with pytest.raises(ValueError, match="needs LoRA"):
            engine.load_adapter([], 1)
        with pytest.raises(ValueError, match="needs LoRA"):
            engine.load_adapter_ipc({}, 1)
    finally:
        engine.shutdown()


def test_failed_update_marks_the_engine_failed(fake_vllm: type[FakeAsyncLLM]) -> None:
    engine = make_engine()
    try:
        fake_vllm.fail_update = True
        with pytest.raises(RuntimeError, match="transfer broke"):
            engine.receive_weights_nccl({"names": []}, 1)
        with pytest.raises(EngineError, match="transfer broke"):
            engine.poll()
        assert engine.policy_version == 0
    finally:
        engine.shutdown()


def test_draining_pause_waits_for_our_samples_not_a_fixed_sleep(fake_vllm: type[FakeAsyncLLM]) -> None:
    """Wait mode: the scheduler pause, then `_settle` until no sample of ours is in flight (their final outputs
    are stamped with the old version), bounded: a sample that never finishes costs at most the limit."""
    import asyncio

    from rlvr.rollout.vllm_lora_ipc import RPC_METHOD

    engine = make_engine(inflight=False, lora_rank=4)
    try:

        class Core:
            async def pause_scheduler_async(self, mode: str, clear_cache: bool) -> None:
                fake_vllm.log.append(f"pause scheduler {mode}")

        engine._llm.engine_core = Core()
        engine.load_adapter_ipc({"key": "k"}, 3)
        assert fake_vllm.log == ["pause scheduler wait", f"rpc {RPC_METHOD}", "reset prefix cache", "resume"]

        async def finishing_sample() -> int:
            engine._num_inflight = 1
            loop = asyncio.get_running_loop()
            loop.call_later(0.005, lambda: setattr(engine, "_num_inflight", 0))  # its final output arrives
            await engine._settle(60.0)
            return engine._num_inflight

        assert asyncio.run(finishing_sample()) == 0  # returned only once the sample was done

        async def stuck_sample() -> int:
            engine._num_inflight = 1
            await engine._settle(0.01)  # bounded: returns although the sample never finishes
            return engine._num_inflight

        assert asyncio.run(stuck_sample()) == 1
        engine._num_inflight = 0
    finally:
        engine.shutdown()


def test_stats_busy_s_counts_the_open_busy_period(fake_vllm: type[FakeAsyncLLM]) -> None:
    """An engine that always has requests in flight never closes a busy period: `busy_s` (what the driver's
    perf/engine_busy_frac is built from) must still grow with it, not stay at the last closed period's total."""
    import time

    engine = make_engine()
    try:
        assert engine.stats()["busy_s"] == 0.0
        engine._busy(+1)
        time.sleep(0.05)
        first = engine.stats()["busy_s"]
        time.sleep(0.05)
        second = engine.stats()["busy_s"]
        assert 0.05 <= first < second
        engine._busy(-1)
        closed = engine.stats()["busy_s"]
        time.sleep(0.05)
        assert closed >= second and engine.stats()["busy_s"] == closed  # idle time does not count
    finally:
        engine.shutdown()


def test_stats_busy_s_leaves_out_sleep(fake_vllm: type[FakeAsyncLLM]) -> None:
    """Colocated with sleep mode: requests frozen through the sleep are in flight but not generating, so the time
    asleep is not busy; once the KV cache is back they count again."""
    import time

    engine = make_engine(enable_sleep_mode=True)
    try:
        engine._busy(+1)
        time.sleep(0.03)
        engine.sleep(1)
        before = engine.stats()["busy_s"]
        time.sleep(0.05)
        assert engine.stats()["busy_s"] == before  # asleep: the counter stands still
        engine._busy(+1)  # a prompt admitted while asleep does not open a period either
        engine.wake_up(["weights"])
        assert engine.stats()["busy_s"] == before  # weights back, no KV cache yet: still asleep
        engine.wake_up(["kv_cache"])
        time.sleep(0.03)
        assert engine.stats()["busy_s"] >= before + 0.03
        assert fake_vllm.log[-3:] == ["sleep 1 keep", "wake ['weights']", "wake ['kv_cache']"]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("lean", [False, True], ids=["vllm_text", "lean_outputs"])
def test_sampling_params_ask_for_flat_logprobs_when_lean(
    fake_vllm: type[FakeAsyncLLM], monkeypatch: pytest.MonkeyPatch, lean: bool
) -> None:
    """The sampled token's log-prob, output only when a request finishes; with --rollout.vllm-lean-outputs in vLLM's
    flat layout (few objects per request, not one dict per token) and not detokenized by vLLM."""
    from rlvr.types import SamplingParams as RlvrSamplingParams

    final_only = object()
    monkeypatch.setattr(sys.modules["vllm"], "SamplingParams", _Req, raising=False)
    kinds = types.ModuleType("vllm.sampling_params")
    kinds.RequestOutputKind = types.SimpleNamespace(FINAL_ONLY=final_only)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", kinds)
    engine = make_engine()
    engine.cfg.rollout.vllm_lean_outputs = lean
    engine._tokenizer = object() if lean else None  # as if loaded (make_engine's model path has none; next tests)
    try:
        p = engine._vllm_params(RlvrSamplingParams(max_new_tokens=7, seed=3), 2)
        assert p.flat_logprobs is lean and p.detokenize is not lean and p.logprobs == 0 and p.output_kind is final_only
        assert p.max_tokens == 7 and p.seed == 5 and p.n == 1
    finally:
        engine.shutdown()


def test_lean_outputs_without_a_tokenizer_let_vllm_detokenize(
    fake_vllm: type[FakeAsyncLLM], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Lean outputs are the default: where the tokenizer does not load at start-up, the engine says so once and
    vLLM keeps detokenizing (flat log-probs still on), instead of every finished sample failing mid-run."""
    import logging

    from rlvr.rollout.vllm_engine import _Job
    from rlvr.types import PromptRequest
    from rlvr.types import SamplingParams as RlvrSamplingParams

    monkeypatch.setattr(sys.modules["vllm"], "SamplingParams", _Req, raising=False)
    kinds = types.ModuleType("vllm.sampling_params")
    kinds.RequestOutputKind = types.SimpleNamespace(FINAL_ONLY="final")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", kinds)
    with caplog.at_level(logging.WARNING, logger="rlvr.rollout.vllm_engine"):
        engine = make_engine()  # lean outputs by default; "/nonexistent/model" has no tokenizer
    try:
        assert engine.cfg.rollout.vllm_lean_outputs and engine._tokenizer is None
        assert any(
            "/nonexistent/model" in r.getMessage() and "vLLM detokenizes" in r.getMessage() for r in caplog.records
        )
        plain = RlvrSamplingParams(max_new_tokens=8)
        p = engine._vllm_params(plain, 0)
        assert p.detokenize is True and p.flat_logprobs is True
        comp = types.SimpleNamespace(
            token_ids=[5, 6],
            logprobs=[{t: types.SimpleNamespace(logprob=-0.5)} for t in (5, 6)],
            text="vLLM text",
            finish_reason="length",
        )
        sample = engine._to_sample(_Job(0, PromptRequest("p", [1, 2], 1, plain)), 0, comp, 0)
        assert sample.completion_text == "vLLM text"
    finally:
        engine.shutdown()


def test_lean_outputs_decode_text_once_unless_stop_strings_need_vllms(
    fake_vllm: type[FakeAsyncLLM], monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """--rollout.vllm-lean-outputs: vLLM detokenizes only requests with stop strings (it needs the text to find
    them); every other completion's text is the tokenizer's decode of its ids with special tokens skipped, as the
    transformers engine gives it."""
    from transformers import AutoTokenizer

    from rlvr.config.sections import ModelConfig
    from rlvr.data import builtin_corpus
    from rlvr.models.tiny import build_tiny_model_dir
    from rlvr.rollout.vllm_engine import VLLMEngine, _Job
    from rlvr.types import PromptRequest
    from rlvr.types import SamplingParams as RlvrSamplingParams

    model = build_tiny_model_dir(ModelConfig(), builtin_corpus("copy4"), tmp_path / "tiny", 0)
    tok = AutoTokenizer.from_pretrained(model)
    monkeypatch.setattr(sys.modules["vllm"], "SamplingParams", _Req, raising=False)
    kinds = types.ModuleType("vllm.sampling_params")
    kinds.RequestOutputKind = types.SimpleNamespace(FINAL_ONLY="final")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", kinds)
    cfg = ExperimentConfig()
    cfg.rollout.backend = "vllm"
    cfg.rollout.vllm_lean_outputs = True
    engine = VLLMEngine(str(model), 0, cfg=cfg, max_model_len=128, startup_timeout_s=30)
    assert engine._tokenizer is not None  # loaded at start-up, not when the first batch ends
    try:
        ids = tok.encode("abc") + [tok.eos_token_id]
        comp = types.SimpleNamespace(
            token_ids=ids,
            logprobs=[{t: types.SimpleNamespace(logprob=-0.5)} for t in ids],
            text="",
            finish_reason="stop",
        )
        plain = RlvrSamplingParams(max_new_tokens=8)
        stops = RlvrSamplingParams(max_new_tokens=8, stop_strings=["c"])
        assert engine._vllm_params(plain, 0).detokenize is False
        assert engine._vllm_params(stops, 0).detokenize is True
        sample = engine._to_sample(_Job(0, PromptRequest("p", [1, 2], 1, plain)), 0, comp, 0)
        assert sample.completion_text == tok.decode(ids, skip_special_tokens=True) == "abc"
        assert sample.logprobs == [-0.5] * len(ids) and sample.finish_reason == "stop"
        comp.text = "ab c"  # vLLM's own text, kept where it had to detokenize
        assert engine._to_sample(_Job(1, PromptRequest("q", [1], 1, stops)), 0, comp, 0).completion_text == "ab c"
    finally:
        engine.shutdown()
