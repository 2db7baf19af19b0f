"""Ray actors: thin shells around the plain engine, learner and verifier classes.

The only module (with driver.py and run.py) that knows Ray. Each actor records its last heartbeat and
answers `ping()`; engines are threaded (max_concurrency > 1) so that `poll()` and the weight-sync receive run
while the engine's own worker thread generates.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import ray

from rlvr.config import ExperimentConfig
from rlvr.types import PromptRequest, RewardResult, Sample


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_ip() -> str:
    return ray.util.get_node_ip_address()


class _Base:
    def ping(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "node": node_ip(), "time": time.time()}

    def address(self) -> tuple[str, int]:
        return node_ip(), free_port()


@ray.remote(max_concurrency=8)
class EngineActor(_Base):
    """A generation engine (transformers on CPU, vLLM on GPU) plus its end of the weight-sync group."""

    def __init__(self, cfg: ExperimentConfig, model_path: str, engine_id: int, device: str, initial_version: int = 0) -> None:
        from rlvr.telemetry.logs import setup_logging

        setup_logging("engine", engine_id, cfg.logging.level)
        self.cfg, self.engine_id = cfg, engine_id
        if cfg.rollout.backend == "vllm":
            from rlvr.rollout.vllm_engine import VLLMEngine

            self.engine = VLLMEngine(model_path, engine_id, cfg=cfg, initial_version=initial_version,
                                     ignore_eos=bool(os.environ.get("RLVR_IGNORE_EOS")),
                                     # TP workers as local processes on this actor's GPUs (vLLM's Ray executor
                                     # loses the placement-group context inside an actor; open-instruct does the same)
                                     distributed_executor_backend="mp" if cfg.cluster.engine_tp > 1 else None)
        else:
            from rlvr.rollout.hf_engine import TransformersEngine
            from rlvr.rollout.lora import LoraSpec

            self.engine = TransformersEngine(
                model_path, engine_id, device=device, dtype=_engine_dtype(cfg, device),
                max_batch_size=cfg.rollout.engine_batch_size, inflight_updates=cfg.rollout.inflight_updates,
                num_threads=max(1, int(cfg.cluster.cpus_per_actor)) if device == "cpu" else None,
                initial_version=initial_version, lora=LoraSpec.from_config(cfg))
        self.sync = None

    def submit(self, requests: list[PromptRequest]) -> None:
        self.engine.submit(requests)

    def poll(self) -> list[Sample]:
        return self.engine.poll()

    def generate(self, requests: list[PromptRequest], timeout_s: float = 600) -> list[Sample]:
        return self.engine.generate(requests, timeout_s=timeout_s)

    def score(self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0) -> list[float]:
        return self.engine.score(prompt_ids, completion_ids, temperature=temperature)

    def policy_version(self) -> int:
        return self.engine.policy_version

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    def abort_all(self) -> list[str]:
        return self.engine.abort_all()

    def init_weight_sync(self, addr: str, port: int, rank: int, world_size: int, timeout_s: float,
                         transport: str = "gloo") -> None:
        """Join learner rank 0's group: gloo (CPU), NCCL through vLLM's weight-transfer engine, or IPC."""
        self.transport = transport
        if transport == "gloo":
            from rlvr.weight_sync.gloo import GlooWeightGroup

            self.sync = GlooWeightGroup(addr, port, rank, world_size, timeout_s)
        elif transport != "shm":  # shm: LoRA adapters arrive as paths (load_adapter)
            self.engine.init_weight_transfer(addr, port, rank, world_size, timeout_s)

    def receive_weights(self, version: int, info: dict | None = None) -> dict[str, float]:
        """pause -> receive -> load -> version bump -> resume (the engine's update protocol)."""
        t0 = time.perf_counter()
        if self.transport == "nccl":
            phases = self.engine.receive_weights_nccl(info, version)  # pause / receive+load / finish seconds
            return {**phases, "sync/receive_s": time.perf_counter() - t0, "sync/load_s": 0.0}
        named = list(self.sync.receive())
        t1 = time.perf_counter()
        self.engine.load_weights(named, version)
        return {"sync/receive_s": t1 - t0, "sync/load_s": time.perf_counter() - t1}

    def load_adapter(self, path: str, version: int) -> float:
        """LoRA through shared memory: load the adapter directory learner rank 0 wrote; returns seconds."""
        t0 = time.perf_counter()
        self.engine.load_adapter_dir(path, version)
        return time.perf_counter() - t0

    # colocated (CUDA IPC) update steps and vLLM sleep/wake
    def begin_weight_update(self) -> float:
        return self.engine.begin_weight_update()

    def update_weights_chunk(self, info: dict) -> None:
        self.engine.update_weights_chunk(info)

    def finish_weight_update(self, version: int) -> dict[str, float]:
        return self.engine.finish_weight_update(version)

    def sleep(self, level: int = 1) -> None:
        self.engine.sleep(level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.engine.wake_up(tags)

    def shutdown(self) -> None:
        self.engine.shutdown()


def _engine_dtype(cfg: ExperimentConfig, device: str) -> str:
    if cfg.model.dtype != "auto":
        return cfg.model.dtype
    return "bfloat16" if device.startswith("cuda") else "float32"


@ray.remote
class LearnerActor(_Base):
    """One data-parallel learner rank."""

    def __init__(self) -> None:
        self.worker = None
        self.rank = -1
        self.sync = None

    def setup(self, cfg: ExperimentConfig, model_path: str, rank: int, world_size: int,
              master_addr: str, master_port: int, device: str) -> None:
        """Build the rank (after rank 0's address is known: it hosts the data-parallel rendezvous)."""
        from rlvr.learner.worker import LearnerWorker
        from rlvr.telemetry.logs import setup_logging

        setup_logging("learner", rank, cfg.logging.level)
        threads = max(1, int(cfg.cluster.cpus_per_actor)) if device == "cpu" else None
        self.worker = LearnerWorker(cfg, model_path, rank, world_size, master_addr, master_port, device, threads)
        self.rank = rank

    def train_batch(self, batches: list) -> dict[str, float]:
        return self.worker.train_batch(batches)

    def weight_metadata(self) -> dict:
        """Names, dtypes, shapes in send order (every rank iterates: ZeRO-3 gathers are collective)."""
        from rlvr.weight_sync.nccl import weight_metadata

        return weight_metadata(self.worker.named_weights())

    def init_weight_sync(self, addr: str, port: int, world_size: int, timeout_s: float,
                         transport: str = "gloo") -> dict | None:
        """Rank 0 opens the learner -> engines group; returns the engines' update info for NCCL."""
        self.transport = transport
        if transport == "shm":  # LoRA on one host: rank 0 writes adapter directories into shared memory
            if self.rank == 0 and self.sync is None:
                from rlvr.rollout.lora import SharedMemoryAdapters

                self.sync = SharedMemoryAdapters(self.worker.lora, self.worker.model_path, "learner")
            return None
        if transport == "gloo":
            if self.rank == 0:
                from rlvr.weight_sync.gloo import GlooWeightGroup

                self.sync = GlooWeightGroup(addr, port, 0, world_size, timeout_s)
            return None
        if transport == "nccl" and self.rank != 0:
            self.meta = self.weight_metadata()  # take part in the gathers only
            return None
        if transport == "nccl":
            from rlvr.weight_sync.nccl import NcclWeightSender

            self.meta = self.weight_metadata()
            self.sync = NcclWeightSender(addr, port, world_size)
            return self.sync.update_info(self.meta)
        self.meta = self.weight_metadata()
        return None

    def send_weights(self, engines: list | None = None, version: int = 0) -> dict[str, float]:
        """Every rank takes part (ZeRO-3 gathers); rank 0 sends (gloo/NCCL broadcast, or IPC chunks)."""
        named = self.worker.named_weights()
        try:
            if self.transport == "shm":
                if self.rank != 0:
                    return {}
                t0 = time.perf_counter()
                path = self.sync.write(named, version)
                return {"path": str(path), "sync/seconds": time.perf_counter() - t0,
                        "sync/bytes": float(path.joinpath("adapter_model.safetensors").stat().st_size)}
            if self.transport == "ipc":
                from rlvr.weight_sync.ipc import IpcWeightSender

                def deliver(info: dict) -> None:
                    ray.get([e.update_weights_chunk.remote(info) for e in engines], timeout=600)

                sender = IpcWeightSender(deliver if self.rank == 0 else (lambda info: None))
                return sender.send(named, self.meta)
            if self.rank == 0:
                return self.sync.send(named, self.meta) if self.transport == "nccl" else self.sync.send(named)
            return {}
        finally:
            # ZeRO-3 gathers are collectives: finish them even when the send failed midway, or the other ranks
            # wait in the next bucket's gather (no-op when the sender consumed everything)
            for _ in named:
                pass

    def score(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        return self.worker.score(prompt_ids, completion_ids)

    def version(self) -> int:
        return self.worker.version

    def save(self, path: str, hf_dir: str | None, tokenizer_dir: str | None) -> None:
        self.worker.save(path, hf_dir if self.rank == 0 else None, tokenizer_dir)

    def load(self, path: str, hf_dir: str) -> None:
        self.worker.load(path, hf_dir)

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
        if self.sync is not None and self.transport == "shm":
            self.sync.close()


@ray.remote(max_concurrency=4)
class VerifierActor(_Base):
    """A verifier pool (worker processes with timeouts and restarts) behind one actor."""

    def __init__(self, cfg: ExperimentConfig) -> None:
        from rlvr.rewards.pool import VerifierPool
        from rlvr.telemetry.logs import setup_logging

        setup_logging("verifier", None, cfg.logging.level)
        self.pool = VerifierPool(cfg.rewards)

    def score(self, items: list[tuple[str, dict, list[int]]], timeout_s: float) -> list[RewardResult]:
        return self.pool.score_many(items, timeout=timeout_s)

    def metrics(self) -> dict[str, float]:
        return self.pool.metrics(reset=True)

    def shutdown(self) -> None:
        self.pool.close()
