"""`Trainer._reconnect_weight_sync` after an engine replacement: Ray's transient `ActorUnavailableError` (a
cancelled learner call left a gap in the actor's call order, which Ray fails and then skips) is retried, raw or
wrapped by `learner_get`; a real failure propagates at once. In-process stand-ins, no Ray cluster."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import ray.exceptions

from rlvr.orchestration.driver import Trainer
from rlvr.orchestration.health import LearnerFailure


def _unavailable() -> Exception:
    return ray.exceptions.ActorUnavailableError("Timed out waiting for seq_no 11 in concurrency group", None)


def _wrapped() -> Exception:
    err = LearnerFailure(0, "died during send_weights: ActorUnavailableError")
    err.__cause__ = _unavailable()
    return err


class Factory:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures, self.connects = list(failures), 0

    def connect_weight_sync(self, actors) -> None:
        self.connects += 1
        if self.failures:
            raise self.failures.pop(0)


def _trainer(failures: list[Exception]) -> SimpleNamespace:
    synced: list[int] = []
    factory = Factory(failures)
    return SimpleNamespace(
        actors=SimpleNamespace(factory=factory), weights=SimpleNamespace(sync=synced.append), step=7, synced=synced
    )


@pytest.mark.parametrize("make", [_unavailable, _wrapped])
def test_a_transient_unavailable_actor_is_retried(make) -> None:
    t = _trainer([make(), make()])
    Trainer._reconnect_weight_sync(t)  # type: ignore[arg-type]
    assert t.actors.factory.connects == 3 and t.synced == [7]


def test_it_gives_up_after_the_attempts_and_real_failures_propagate_at_once() -> None:
    t = _trainer([_unavailable()] * 3)
    with pytest.raises(ray.exceptions.ActorUnavailableError):
        Trainer._reconnect_weight_sync(t)  # type: ignore[arg-type]
    assert t.synced == []
    dead = LearnerFailure(0, "died during send_weights: ActorDiedError")
    t = _trainer([dead])
    with pytest.raises(LearnerFailure):
        Trainer._reconnect_weight_sync(t)  # type: ignore[arg-type]
    assert t.actors.factory.connects == 1
