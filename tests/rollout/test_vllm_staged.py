"""The staged NCCL weight sync (`--rollout.vllm-staged-sync`, rlvr.rollout.vllm_staged) without a GPU.

Worker side: the extension runs vLLM's packed consumer on a background thread (here a stand-in that follows the same
bucket rule and blocks until the test lets the "transfer" finish), keeps the buckets instead of loading them, and
loads them bucket by bucket inside vLLM's weight-update session only when asked. Engine side (the fake AsyncLLM of
test_vllm_weights): begin -> polls while generation goes on -> pause -> load -> version -> resume, the fallback to the
paused path where the GPU lacks memory for the copy, and a failed receive failing the engine. Plus validation."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest
import torch
from test_vllm_weights import FakeAsyncLLM, fake_vllm, make_engine  # noqa: F401  (fake_vllm: a fixture)

from rlvr.config import ConfigError, ExperimentConfig, validate
from rlvr.rollout import vllm_staged
from rlvr.rollout.base import EngineError
from rlvr.rollout.vllm_staged import RPC_BEGIN, RPC_LOAD, RPC_POLL, StagedNcclWorkerExtension, StagedReceive

INFO = {
    "names": ["a", "b", "c"],
    "dtype_names": ["bfloat16", "float32", "bfloat16"],
    "shapes": [[4, 2], [3], [5]],
    "packed_buffer_size_bytes": 16,
    "packed_num_buffers": 2,
    "packed": True,
}


class FakeConsumer:
    """vLLM's packed_nccl_broadcast_consumer as far as the extension sees it: buckets closed once they pass
    `buffer_size_bytes`, each handed to `post_unpack_func`; the transfer "runs" until `release` is set."""

    def __init__(self, fail: bool = False) -> None:
        self.release, self.started, self.fail, self.calls = threading.Event(), threading.Event(), fail, []

    def __call__(self, *, iterator, group, src, post_unpack_func, buffer_size_bytes, num_buffers, device) -> None:
        self.calls.append({"group": group, "src": src, "size": buffer_size_bytes, "num": num_buffers, "device": device})
        self.started.set()
        assert self.release.wait(30)
        if self.fail:
            raise RuntimeError("NCCL error: remote process exited")
        bucket, size = [], 0
        for name, (shape, dtype) in iterator:
            bucket.append((name, torch.full(shape, float(len(name)), dtype=dtype)))
            size += math.prod(shape) * dtype.itemsize
            if size > buffer_size_bytes:
                post_unpack_func(bucket)
                bucket, size = [], 0
        if bucket:
            post_unpack_func(bucket)


class FakeWTE:
    def __init__(self) -> None:
        self.model_update_group = "the NCCL group"
        self.model = self
        self.loaded: list[list[str]] = []
        self.fail_load = False
        self.resets = 0

    def load_weights(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        if self.fail_load:
            raise RuntimeError("shape mismatch")
        self.loaded.append([name for name, _ in bucket])

    def reset_weight_update_target(self) -> None:
        self.resets += 1


class FakeWorker(StagedNcclWorkerExtension):
    """vLLM's GPU worker as far as the extension uses it."""

    def __init__(self) -> None:
        self.weight_transfer_engine = FakeWTE()
        self.device = torch.device("cpu")
        self.log: list[str] = []
        self._weight_update_active = False

    def start_weight_update(self) -> None:
        if self._weight_update_active:  # as vLLM's worker
            raise RuntimeError("start_weight_update called while a weight update is already active")
        self.log.append("start")
        self._weight_update_active = True

    def finish_weight_update(self) -> None:
        self.log.append("finish")
        self._weight_update_active = False


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> FakeConsumer:
    c = FakeConsumer()
    monkeypatch.setattr(vllm_staged, "_consumer", lambda: c)
    return c


def _wait_done(worker: FakeWorker) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while not (p := worker.rlvr_stage_poll())["done"]:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    return p


def test_worker_receives_in_the_background_and_loads_only_when_asked(consumer: FakeConsumer) -> None:
    worker = FakeWorker()
    began = worker.rlvr_stage_begin(INFO)
    assert began == {"staged": True, "need_bytes": 8 * 2 + 3 * 4 + 5 * 2, "free_bytes": began["free_bytes"]}
    assert consumer.started.wait(10)  # begin returned while the transfer is still running
    assert consumer.calls == [{"group": "the NCCL group", "src": 0, "size": 16, "num": 2, "device": worker.device}]
    assert worker.rlvr_stage_poll() == {"done": False, "error": "", "seconds": 0.0}
    assert worker.weight_transfer_engine.loaded == [] and worker.log == []  # the model is untouched meanwhile
    with pytest.raises(RuntimeError, match="never loaded"):
        worker.rlvr_stage_begin(INFO)  # one sync at a time
    consumer.release.set()
    assert _wait_done(worker)["error"] == ""
    assert worker.weight_transfer_engine.loaded == []
    out = worker.rlvr_stage_load()
    assert worker.log == ["start", "finish"] and out["seconds"] >= 0
    assert worker.weight_transfer_engine.loaded == [["a", "b"], ["c"]]  # vLLM's buckets, in order, one call each
    with pytest.raises(RuntimeError, match="nothing was staged"):
        worker.rlvr_stage_load()
    consumer.release.clear()
    worker.rlvr_stage_begin(INFO)  # the next sync stages again
    consumer.release.set()
    _wait_done(worker)
    worker.rlvr_stage_load()
    assert worker.weight_transfer_engine.loaded == [["a", "b"], ["c"]] * 2


def test_a_failed_receive_is_reported_and_loads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    c = FakeConsumer(fail=True)
    monkeypatch.setattr(vllm_staged, "_consumer", lambda: c)
    worker = FakeWorker()
    worker.rlvr_stage_begin(INFO)
    c.release.set()
    assert "remote process exited" in _wait_done(worker)["error"]
    with pytest.raises(RuntimeError, match="receive failed"):
        worker.rlvr_stage_load()
    assert worker.weight_transfer_engine.loaded == [] and worker.log == []


def test_a_failed_load_closes_vllms_update_session(consumer: FakeConsumer) -> None:
    worker = FakeWorker()
    worker.rlvr_stage_begin(INFO)
    consumer.release.set()
    _wait_done(worker)
    worker.weight_transfer_engine.fail_load = True
    with pytest.raises(RuntimeError, match="shape mismatch"):
        worker.rlvr_stage_load()
    assert worker.log == ["start"] and not worker._weight_update_active
    assert worker.weight_transfer_engine.resets == 1


def test_no_room_for_the_copy_stages_nothing(consumer: FakeConsumer, monkeypatch: pytest.MonkeyPatch) -> None:
    worker = FakeWorker()
    worker.device = torch.device("cuda", 0)
    monkeypatch.setattr(vllm_staged, "_free_bytes", lambda device: vllm_staged.HEADROOM_BYTES)
    assert worker.rlvr_stage_begin(INFO) == {"staged": False, "need_bytes": 38, "free_bytes": 1 << 30}
    assert consumer.calls == [] and not worker._rlvr_stage().active


def test_free_memory_counts_what_the_allocator_holds_unused(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a staged sync the buffers are back in torch's cache (or the driver's, after empty_cache): either way
    the next sync can stage; counting only the driver's free memory made every later sync fall back."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 10 << 30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 7 << 30)
    assert vllm_staged._free_bytes(torch.device("cuda", 0)) == 5 << 30


def test_a_receive_never_loaded_blocks_the_next_sync_before_the_memory_check(consumer: FakeConsumer) -> None:
    worker = FakeWorker()
    worker.rlvr_stage_begin(INFO)  # the broadcast never finishes (the learner died)
    with pytest.raises(RuntimeError, match="never loaded"):
        worker.rlvr_stage_begin(INFO)
    consumer.release.set()


def test_take_before_the_receive_finished_refuses() -> None:
    stage, gate = StagedReceive(), threading.Event()
    stage.begin(lambda keep: gate.wait(30), torch.device("cpu"))
    with pytest.raises(RuntimeError, match="has not finished"):
        stage.take()
    gate.set()
    assert stage.take(timeout_s=30) == []


# ------------------------------------------------------------------ the engine's side
class StagedLLM(FakeAsyncLLM):
    """The worker extension answered through collective_rpc: `polls_pending` polls say "not done" first."""

    staged = True
    polls_pending = 2
    poll_error = ""
    engine: Any = None
    updating_during_polls: list[bool] = []

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = (), kwargs: Any = None):
        self.rpcs.append((method, args))
        self.log.append(f"rpc {method}")
        if method == RPC_BEGIN:
            return [{"staged": self.staged, "need_bytes": 38, "free_bytes": 10}]
        if method == RPC_POLL:
            if StagedLLM.engine is not None:
                StagedLLM.updating_during_polls.append(StagedLLM.engine._updating)
            StagedLLM.polls_pending -= 1
            return [{"done": self.polls_pending < 0, "error": self.poll_error, "seconds": 0.5}]
        assert method == RPC_LOAD
        return [{"seconds": 0.01}]


@pytest.fixture
def staged_llm(fake_vllm: type[FakeAsyncLLM], monkeypatch: pytest.MonkeyPatch) -> type[StagedLLM]:  # noqa: F811
    import sys

    monkeypatch.setattr(sys.modules["vllm.v1.engine.async_llm"], "AsyncLLM", StagedLLM)
    StagedLLM.staged, StagedLLM.polls_pending, StagedLLM.poll_error = True, 2, ""
    StagedLLM.engine, StagedLLM.updating_during_polls = None, []
    return StagedLLM


def _staged_engine() -> Any:
    from rlvr.rollout.vllm_engine import STAGED_EXTENSION

    engine = make_engine(staged=True)
    assert engine.staged_sync and engine._llm.args.worker_extension_cls == STAGED_EXTENSION
    return engine


META = {k: INFO[k] for k in ("names", "dtype_names", "shapes", "packed_buffer_size_bytes", "packed_num_buffers")}


def test_engine_generates_through_the_transfer_and_pauses_only_to_load(staged_llm: type[StagedLLM]) -> None:
    from rlvr.weight_sync.transport import make_receiver

    engine = _staged_engine()
    staged_llm.engine = engine
    try:
        receiver = make_receiver("nccl", engine, addr="10.0.0.1", port=1234, rank=1, world_size=2)
        out = receiver.receive(5, META)
        assert staged_llm.updating_during_polls == [False] * 3  # prompts are admitted while the weights arrive
        polls = ["rpc " + RPC_POLL] * 3
        assert staged_llm.log == ["rpc " + RPC_BEGIN, *polls, "pause keep", "rpc " + RPC_LOAD, "resume"]
        assert engine._llm.rpcs[0] == (RPC_BEGIN, ({**META, "packed": True},))
        assert engine.policy_version == 5 and engine.stats()["num_updates"] == 1
        assert out["sync/staged"] == 1.0
        assert out["sync/paused_s"] < out["sync/engine_total_s"] and out["sync/stage_s"] > 0
    finally:
        engine.shutdown()


def test_engine_without_room_to_stage_pauses_for_the_whole_transfer(staged_llm: type[StagedLLM]) -> None:
    from rlvr.weight_sync.transport import make_receiver

    staged_llm.staged = False
    engine = _staged_engine()
    try:
        out = make_receiver("nccl", engine, addr="h", port=1, rank=1, world_size=2).receive(3, META)
        assert staged_llm.log == ["rpc " + RPC_BEGIN, "pause keep", "start", "update", "finish", "resume"]
        assert out["sync/staged"] == 0.0 and engine.policy_version == 3
    finally:
        engine.shutdown()


def test_engine_fails_when_the_staged_receive_fails(staged_llm: type[StagedLLM]) -> None:
    staged_llm.poll_error = "RuntimeError('NCCL error')"
    engine = _staged_engine()
    try:
        with pytest.raises(EngineError, match="staged weight receive failed"):
            engine.receive_weights_nccl(META, 2)
        assert "pause keep" not in staged_llm.log and engine.policy_version != 2
        with pytest.raises(EngineError, match="staged weight receive failed"):
            engine.poll()  # a failed engine refuses further work
    finally:
        engine.shutdown()


def test_engine_fails_when_the_receive_outlasts_the_actor_timeout(staged_llm: type[StagedLLM]) -> None:
    staged_llm.polls_pending = 10**9  # the broadcast never completes
    engine = _staged_engine()
    engine.cfg.cluster.actor_timeout_s = 0.05
    try:
        with pytest.raises(EngineError, match="not finished after --cluster.actor-timeout-s"):
            engine.receive_weights_nccl(META, 2)
        assert "pause keep" not in staged_llm.log
    finally:
        engine.shutdown()


def test_engine_sync_metrics_report_the_staged_phases() -> None:
    from rlvr.orchestration.weight_updates import engine_sync_metrics

    got = [
        {"sync/stage_s": 0.4, "sync/paused_s": 0.05, "sync/staged": 1.0},
        {"sync/stage_s": 0.6, "sync/paused_s": 0.03, "sync/staged": 0.0},
    ]
    out = engine_sync_metrics(got)
    assert out["sync/engine_stage_s_max"] == 0.6 and out["sync/engine_paused_s_max"] == 0.05
    assert out["sync/engine_staged_min"] == 0.0  # one engine fell back to the paused path


# ------------------------------------------------------------------ validation
def _cfg(**rollout: Any) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.rollout.backend = "vllm"
    cfg.rollout.vllm_staged_sync = True
    cfg.cluster.device = "cuda"
    cfg.cluster.colocate = False
    for k, v in rollout.items():
        setattr(cfg.rollout, k, v)
    return cfg


def test_validation_accepts_staged_sync_for_split_tp1_engines() -> None:
    validate(_cfg())


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda c: setattr(c.rollout, "backend", "transformers"), "--rollout.backend vllm"),
        (lambda c: setattr(c.cluster, "colocate", True), "--cluster.colocate False"),
        (lambda c: setattr(c.cluster, "engine_tp", 2), "--cluster.engine-tp 1 (got 2)"),
        (lambda c: setattr(c.learner, "lora_rank", 8), "--learner.lora-rank 0 (got 8"),
    ],
)
def test_validation_refuses_staged_sync_where_there_is_no_nccl_broadcast(change: Any, words: str) -> None:
    cfg = _cfg()
    change(cfg)
    with pytest.raises(ConfigError, match="--rollout.vllm-staged-sync") as err:
        validate(cfg)
    assert words in str(err.value)
