"""RolloutFeeder with real engine actors (transformers engines on CPU, local Ray): an engine dying while the
others hold finished groups loses none of them.

An engine's poll() hands over its finished samples and forgets them. When the feeder polled every engine and
one of them was dead, the groups the living engines had just returned used to be dropped with the exception:
their prompts stayed "outstanding" on an engine that no longer had them, until the stuck-engine watchdog
replaced that healthy engine too (the flaky second restart of the kill_engine fault test).
"""

from __future__ import annotations

import time

import pytest
import ray
from transformers import AutoTokenizer

from rlvr.config import default_config, from_dict
from rlvr.data import PromptStream, builtin_corpus
from rlvr.models.tiny import build_tiny_model_dir
from rlvr.orchestration.accounting import PromptLedger
from rlvr.orchestration.actors import EngineActor
from rlvr.orchestration.health import EngineFailure
from rlvr.orchestration.rollouts import RolloutFeeder

pytestmark = pytest.mark.timeout(300)


def _wait_completed(engine, prompts: int, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while ray.get(engine.stats.remote(), timeout=60).get("completed_prompts", 0) < prompts:
        assert time.time() < deadline, "the engine did not finish its prompts"
        time.sleep(0.05)


def _wait_dead(engine, timeout_s: float = 60) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            ray.get(engine.stats.remote(), timeout=10)
        except ray.exceptions.RayActorError:
            return
        except ray.exceptions.GetTimeoutError:
            pass  # dying: ask again
        time.sleep(0.05)
    raise AssertionError("the killed engine still answers")


def test_groups_of_living_engines_survive_a_dead_engine_in_the_same_poll(tmp_path, ray_cluster) -> None:
    cfg = from_dict(
        {"generation": {"num_samples": 2, "max_new_tokens": 4}, "data": {"datasets": ["builtin:copy"]}},
        base=default_config(),
    )
    model_dir = str(build_tiny_model_dir(cfg.model, builtin_corpus("copy"), tmp_path / "model", cfg.seed))
    stream = PromptStream(cfg, AutoTokenizer.from_pretrained(model_dir))
    engines = [EngineActor.options(num_cpus=0).remote(cfg, model_dir, i, "cpu") for i in range(2)]
    try:
        ledger = PromptLedger()
        feeder = RolloutFeeder(engines, stream, ledger, timeout_s=60)
        assert feeder.top_up(2, limit=2) == 2  # one prompt per engine (least-loaded assignment)
        assert sorted(i for i, _ in feeder.outstanding.values()) == [0, 1]
        on_engine1 = next(pid for pid, (i, _) in feeder.outstanding.items() if i == 1)
        _wait_completed(engines[1], 1)  # engine 1 holds a finished group that no one has polled yet
        ray.kill(engines[0])
        _wait_dead(engines[0])  # the kill lands asynchronously

        with pytest.raises(EngineFailure) as err:
            feeder.poll()
        assert err.value.index == 0
        assert on_engine1 not in feeder.outstanding  # engine 1 answered: its group was taken from it
        assert [g.prompt_id for g in feeder.arrived] == [on_engine1]

        feeder.requeue_from(0)  # what the driver does before replacing engine 0
        engines[0] = EngineActor.options(num_cpus=0).remote(cfg, model_dir, 0, "cpu")
        feeder.engines = engines
        groups = feeder.poll()
        assert [g.prompt_id for g in groups] == [on_engine1]
        assert len(groups[0].samples) == 2 and feeder.arrived == []
        assert set(ledger.in_flight) == {on_engine1} | {r.prompt_id for r in feeder.requeue}
    finally:
        for e in engines:
            ray.kill(e)
