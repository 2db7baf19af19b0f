"""The actors of a run: `ActorFactory` creates (and re-creates) learners, engines and verifiers with their placement
(colocated placement group, per-engine groups for tensor parallelism) and connects the weight-sync transport
(`rlvr.weight_sync.transport.pick_kind`); `create_actors` / `shutdown_actors` bring the whole set up and down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlvr.config import ExperimentConfig, check_resources
from rlvr.orchestration.health import describe
from rlvr.telemetry.logs import get_logger

logger = get_logger(__name__)


@dataclass
class Actors:
    learners: list = field(default_factory=list)
    engines: list = field(default_factory=list)
    verifiers: list = field(default_factory=list)
    factory: Any = None

    def all(self) -> list:
        return self.learners + self.engines + self.verifiers


def device_of(cfg: ExperimentConfig) -> str:
    import ray

    if cfg.cluster.device != "auto":
        return cfg.cluster.device
    return "cuda" if ray.cluster_resources().get("GPU", 0) > 0 else "cpu"


class ActorFactory:
    """Creates (and re-creates) the actors of a run with their placement options."""

    def __init__(self, cfg: ExperimentConfig, model_dir: str, device: str) -> None:
        from rlvr import faults

        self.cfg, self.model_dir, self.device = cfg, model_dir, device
        self.sync_info: dict | None = None
        self.sync_transport: str | None = None  # the transport connect_weight_sync connected (may be "shm" for LoRA)
        self.placement_groups: dict[int, Any] = {}
        c, gpu = cfg.cluster, device.startswith("cuda")
        env = faults.env_vars()
        base: dict[str, Any] = {"runtime_env": {"env_vars": env}} if env else {}
        self.learner_opts = {**base, "num_cpus": c.cpus_per_actor, "num_gpus": 1 if gpu else 0}
        self.engine_opts = {**base, "num_cpus": c.cpus_per_actor, "num_gpus": c.engine_tp if gpu else 0}
        if gpu and c.colocate:
            self.learner_opts["num_gpus"], self.engine_opts["num_gpus"] = 0.5, 0.5
        self.colocate_pg: Any = None

    def colocated_options(self, opts: dict[str, Any], index: int) -> dict[str, Any]:
        """Colocated on GPUs: learner i and engine i share bundle i ({GPU: 1}) of one placement group, so each
        GPU hosts one learner rank and one engine. Without it Ray may pack two 0.5-GPU learners onto one GPU,
        and NCCL refuses two ranks on one device."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        c = self.cfg.cluster
        if not (self.device.startswith("cuda") and c.colocate):
            return opts
        if self.colocate_pg is None:
            bundles = [{"GPU": 1, "CPU": 2 * c.cpus_per_actor} for _ in range(max(c.num_learners, c.num_engines))]
            self.colocate_pg = ray.util.placement_group(bundles, strategy="PACK", name="rlvr-colocated")
            ray.get(self.colocate_pg.ready(), timeout=c.actor_timeout_s)
        return {
            **opts,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.colocate_pg, placement_group_bundle_index=index
            ),
        }

    def learners(self) -> list:
        import ray

        from rlvr.orchestration.actors import LearnerActor

        c, timeout = self.cfg.cluster, self.cfg.cluster.actor_timeout_s
        learners = [
            LearnerActor.options(**self.colocated_options(self.learner_opts, r)).remote() for r in range(c.num_learners)
        ]
        addr, port = ray.get(learners[0].address.remote(), timeout=timeout)  # rank 0 hosts the rendezvous
        ray.get(
            [
                a.setup.remote(self.cfg, self.model_dir, r, c.num_learners, addr, port, self.device)
                for r, a in enumerate(learners)
            ],
            timeout=timeout,
        )
        return learners

    def engine(self, index: int, version: int = 0) -> Any:
        """Engine `index`; a tensor-parallel engine gets its own STRICT_PACK placement group (one node, engine_tp
        GPUs) and vLLM's multiprocessing executor starts its TP workers on those GPUs."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from rlvr.orchestration.actors import EngineActor

        opts = dict(self.engine_opts)
        tp = self.cfg.cluster.engine_tp
        if self.device.startswith("cuda") and tp > 1 and not self.cfg.cluster.colocate:
            old = self.placement_groups.pop(index, None)
            if old is not None:
                ray.util.remove_placement_group(old)
            pg = ray.util.placement_group(
                [{"GPU": tp, "CPU": max(1.0, self.cfg.cluster.cpus_per_actor)}],
                strategy="STRICT_PACK",
                name=f"rlvr-engine-{index}",
            )
            ray.get(pg.ready(), timeout=self.cfg.cluster.actor_timeout_s)
            self.placement_groups[index] = pg
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
        opts = self.colocated_options(opts, index)
        return EngineActor.options(**opts).remote(self.cfg, self.model_dir, index, self.device, version)

    def release(self) -> None:
        import ray

        for pg in self.placement_groups.values():
            ray.util.remove_placement_group(pg)
        self.placement_groups.clear()
        if self.colocate_pg is not None:
            ray.util.remove_placement_group(self.colocate_pg)
            self.colocate_pg = None

    def verifiers(self) -> list:
        from rlvr.orchestration.actors import VerifierActor

        return [VerifierActor.options(num_cpus=0).remote(self.cfg) for _ in range(self.cfg.cluster.num_verifier_actors)]

    @property
    def transport(self) -> str:
        """The weight-sync transport for these actors before their hosts are known (`rlvr.weight_sync.transport.
        pick_kind`; LoRA may still become "shm" in `connect_weight_sync`)."""
        return self._pick_transport(one_host=False)

    def _pick_transport(self, one_host: bool) -> str:
        from rlvr.weight_sync.transport import pick_kind

        return pick_kind(
            gpu=self.device.startswith("cuda"),
            vllm=self.cfg.rollout.backend == "vllm",
            lora=self.cfg.learner.lora_rank > 0,
            colocate=self.cfg.cluster.colocate,
            one_host=one_host,
        )

    @property
    def colocated(self) -> bool:
        """vLLM engines share the learners' GPUs (they can sleep while the learners train)."""
        return self.device.startswith("cuda") and self.cfg.rollout.backend == "vllm" and self.cfg.cluster.colocate

    def connect_weight_sync(self, actors: Actors) -> None:
        """(Re)build the learner rank 0 -> engines group (after any engine was replaced).

        Every learner rank takes part in the metadata pass (ZeRO-3 gathers are collective); engine i's
        ranks start at 1 + i * engine_tp (one per tensor-parallel worker)."""
        import ray

        from rlvr.weight_sync.transport import ranks_per_engine

        timeout = self.cfg.cluster.actor_timeout_s
        t = self._pick_transport(one_host=self.cfg.learner.lora_rank > 0 and _one_host(actors, timeout))
        self.sync_transport = t
        tp = ranks_per_engine(t, self.cfg.cluster.engine_tp)
        waddr, wport = ray.get(actors.learners[0].address.remote(), timeout=timeout)
        world = 1 + len(actors.engines) * tp
        refs = [lrn.init_weight_sync.remote(waddr, wport, world, timeout, t) for lrn in actors.learners]
        refs += [
            e.init_weight_sync.remote(waddr, wport, 1 + i * tp, world, timeout, t) for i, e in enumerate(actors.engines)
        ]
        self.sync_info = ray.get(refs, timeout=timeout)[0]


def _one_host(actors: Actors, timeout: float) -> bool:
    """Learner rank 0 and every engine run on one host (one IP address): they share /dev/shm."""
    import ray

    pings = ray.get([a.ping.remote() for a in [actors.learners[0], *actors.engines]], timeout=timeout)
    return len({p["node"] for p in pings}) == 1


def create_actors(cfg: ExperimentConfig, model_dir: str, device: str) -> Actors:
    import ray

    res = ray.cluster_resources()
    check_resources(cfg, res.get("GPU", 0), res.get("CPU", 0))
    factory = ActorFactory(cfg, model_dir, device)
    actors = Actors(factory=factory)
    actors.learners = factory.learners()
    actors.engines = [factory.engine(i) for i in range(cfg.cluster.num_engines)]
    actors.verifiers = factory.verifiers()
    ray.get([a.ping.remote() for a in actors.all()], timeout=cfg.cluster.actor_timeout_s)
    factory.connect_weight_sync(actors)
    return actors


def shutdown_actors(actors: Actors) -> None:
    import ray

    refs = [a.shutdown.remote() for a in actors.all()]
    try:
        ray.get(refs, timeout=30)
    except Exception as e:  # shutting down: report and kill regardless (an actor may already be dead)
        logger.warning("actor shutdown: %s", describe(e))
    for a in actors.all():
        ray.kill(a)
    if actors.factory is not None:
        actors.factory.release()
