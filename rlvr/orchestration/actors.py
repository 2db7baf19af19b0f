"""Ray actors: thin shells around the plain engine, learner and verifier classes, and `actor_get`, the one way the
driver side waits on them.

Ray is known here, in run.py (cluster start, placement, actor creation) and in the driver-side modules that call
actors (driver.py, rollouts.py, weight_updates.py); the engines, learners, verifiers and weight-sync transports
below these shells are plain classes. Each actor records its last heartbeat and answers `ping()`; engines are
threaded (max_concurrency > 1) so that `poll()` and the weight-sync receive run while the engine's own worker
thread generates. Weight sync: learners hold a `WeightSender`, engines a `WeightReceiver`
(`rlvr.weight_sync.transport`), made by `init_weight_sync` for the transport the actor factory picked.
"""

from __future__ import annotations

import os
import time
from typing import Any

import ray

from rlvr.config import ExperimentConfig
from rlvr.launch.local_cluster import free_port
from rlvr.orchestration.health import ActorFailure, EngineFailure, LearnerFailure, describe
from rlvr.telemetry.logs import get_logger
from rlvr.types import PromptRequest, RewardResult, Sample

logger = get_logger(__name__)


def actor_get(
    refs: Any, failure: type[ActorFailure], what: str, timeout_s: float, index: int | None = None, setting: str = ""
) -> Any:
    """ray.get on calls to actors of one role (`failure`: EngineFailure or LearnerFailure): a dead or hung actor
    becomes that failure naming it. `refs`: one ref (the call to actor `index`) or a list, one per actor in order
    (which one died is probed; a timeout names `index`, default 0). `setting`: the flag that sets `timeout_s`."""
    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError as e:
        hint = f" ({setting})" if setting else ""
        raise failure(index or 0, f"{what} did not answer within {timeout_s:g}s{hint}") from e
    except ray.exceptions.RayActorError as e:
        if index is None:
            index = next((i for i, r in enumerate(refs if isinstance(refs, list) else [refs]) if call_failed(r)), 0)
        raise failure(index, f"died during {what}: {describe(e)}") from e


def learner_get(refs: list, what: str, timeout_s: float) -> list:
    """`actor_get` on one call per learner rank."""
    return actor_get(refs, LearnerFailure, what, timeout_s, setting="--cluster.actor-timeout-s")


def engine_get(ref: Any, engine_index: int, timeout_s: float, what: str = "a call") -> Any:
    """`actor_get` on one call to engine `engine_index`; a value that is no ObjectRef is an in-process handle's
    answer (tests' fake engines), returned as it is."""
    if not isinstance(ref, ray.ObjectRef):
        return ref
    return actor_get(ref, EngineFailure, what, timeout_s, engine_index)


def replace_verifiers(actors: Any, error: BaseException) -> None:
    """A verifier actor failed (died, or did not answer in time): kill them all and start new ones
    (`actors.factory.verifiers()`). Scoring (`VerifierScorer`) and episode jobs (`ActorToolRunner`) share it."""
    logger.error("verifier actor failed (%s): replacing the verifier actors", describe(error))
    for v in actors.verifiers:
        try:
            ray.kill(v)
        except Exception as e:  # already gone: nothing to kill
            logger.debug("ray.kill of a verifier actor: %s", e)
    actors.verifiers = actors.factory.verifiers()


def call_failed(ref: Any) -> bool:
    """Whether a finished Ray call raised (False while it is still running)."""
    try:
        ray.get(ref, timeout=0)
        return False
    except ray.exceptions.GetTimeoutError:
        return False
    except Exception:  # any failure: probing which call failed
        return True


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

    def __init__(
        self, cfg: ExperimentConfig, model_path: str, engine_id: int, device: str, initial_version: int = 0
    ) -> None:
        from rlvr.telemetry.logs import setup_logging

        setup_logging("engine", engine_id, cfg.logging.level)
        self.cfg, self.engine_id = cfg, engine_id
        if cfg.rollout.backend == "vllm":
            from rlvr.rollout.vllm_engine import VLLMEngine

            self.engine = VLLMEngine(
                model_path,
                engine_id,
                cfg=cfg,
                initial_version=initial_version,
                ignore_eos=bool(os.environ.get("RLVR_IGNORE_EOS")),
                # TP workers as local processes on this actor's GPUs (vLLM's Ray executor
                # loses the placement-group context inside an actor; open-instruct does the same)
                distributed_executor_backend="mp" if cfg.cluster.engine_tp > 1 else None,
            )
        else:
            from rlvr.rollout.hf_engine import TransformersEngine
            from rlvr.rollout.lora import LoraSpec

            self.engine = TransformersEngine(
                model_path,
                engine_id,
                device=device,
                dtype=_engine_dtype(cfg, device),
                max_batch_size=cfg.rollout.engine_batch_size,
                inflight_updates=cfg.rollout.inflight_updates,
                num_threads=max(1, int(cfg.cluster.cpus_per_actor)) if device == "cpu" else None,
                initial_version=initial_version,
                lora=LoraSpec.from_config(cfg),
            )
        self.receiver: Any = None  # a rlvr.weight_sync.transport.WeightReceiver, from init_weight_sync

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

    def init_weight_sync(
        self, addr: str, port: int, rank: int, world_size: int, timeout_s: float, transport: str = "gloo"
    ) -> None:
        """Join learner rank 0's weight-sync group as `rank` (`rlvr.weight_sync.transport.make_receiver`)."""
        from rlvr.weight_sync.transport import make_receiver

        old, self.receiver = self.receiver, None
        self.receiver = make_receiver(
            transport,
            self.engine,
            addr=addr,
            port=port,
            rank=rank,
            world_size=world_size,
            timeout_s=timeout_s,
            lora=self.cfg.learner.lora_rank > 0,
        )
        if old is not None:
            old.close()

    def begin_weight_sync(self) -> float:
        """Pause ahead of the learners' send (transports whose chunks load as they arrive); seconds."""
        return self.receiver.begin()

    def receive_weights(self, version: int, info: Any = None) -> dict[str, float]:
        """receive -> pause -> load -> version bump -> resume (the engine's update protocol); `sync/*` seconds."""
        return self.receiver.receive(version, info)

    def update_weights_chunk(self, info: dict) -> None:
        """One CUDA IPC chunk, delivered by learner rank 0 between `begin_weight_sync` and `receive_weights`."""
        self.engine.update_weights_chunk(info)

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
        self.sender: Any = None  # a rlvr.weight_sync.transport.WeightSender, from init_weight_sync

    def setup(
        self,
        cfg: ExperimentConfig,
        model_path: str,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        device: str,
    ) -> None:
        """Build the rank (after rank 0's address is known: it hosts the data-parallel rendezvous)."""
        from rlvr.learner.worker import LearnerWorker
        from rlvr.telemetry.logs import setup_logging

        setup_logging("learner", rank, cfg.logging.level)
        threads = max(1, int(cfg.cluster.cpus_per_actor)) if device == "cpu" else None
        self.worker = LearnerWorker(cfg, model_path, rank, world_size, master_addr, master_port, device, threads)
        self.rank = rank

    def train_batch(self, batches: list) -> dict[str, float]:
        return self.worker.train_batch(batches)

    def init_weight_sync(
        self, addr: str, port: int, world_size: int, timeout_s: float, transport: str = "gloo"
    ) -> dict | None:
        """This rank's end of the learner -> engines transport (rank 0 hosts the group at addr:port); returns what
        the engines need ahead of every update (NCCL metadata, from rank 0), else None."""
        from rlvr.weight_sync.transport import make_sender

        old, self.sender = self.sender, None
        self.sender = make_sender(
            transport,
            rank=self.rank,
            addr=addr,
            port=port,
            world_size=world_size,
            timeout_s=timeout_s,
            named_weights=self.worker.named_weights,
            lora=self.worker.lora,
            model_path=self.worker.model_path,
            previous=old,
        )
        if old is not None and old is not self.sender:
            old.close()
        return self.sender.engine_info()

    def send_weights(self, engines: list | None = None, version: int = 0) -> dict[str, Any]:
        """Every rank takes part (ZeRO-3 gathers); rank 0 transfers. `engines`: where rank 0 delivers IPC chunks."""

        def deliver(info: dict) -> None:
            ray.get([e.update_weights_chunk.remote(info) for e in engines or []], timeout=600)

        from rlvr.weight_sync.transport import send_all

        return send_all(self.sender, self.worker.named_weights(), version, deliver)

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
        if self.sender is not None:
            self.sender.close()


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

    def run_tool(self, job_id: Any, fn: Any, args: tuple, timeout_s: float) -> None:
        self.pool.run_tool(job_id, fn, args, timeout_s)  # an episode's tool call or answer check (episodes.py)

    def poll_tools(self, started: bool = False) -> Any:
        return self.pool.poll_tools(started)  # with `started`: (answers, ids of the jobs dispatched meanwhile)

    def cancel_jobs(self, job_ids: list[Any]) -> int:
        return self.pool.cancel_jobs(job_ids)  # queued jobs of an episode group that was dropped

    def metrics(self) -> dict[str, float]:
        return self.pool.metrics(reset=True)

    def shutdown(self) -> None:
        self.pool.close()
