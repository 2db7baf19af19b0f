"""Fault injection for the fault-tolerance tests and `bench/faults.py` (never active unless asked for).

`RLVR_INJECT_FAULTS` holds comma-separated `name@step` entries, e.g. `kill_engine@3,kill_learner@4`.
The driver calls the hooks of its `FaultInjector` (`injector()`): `NoFaults`, whose hooks do nothing, unless the
variable is set, then `EnvFaults`, which fires the named faults (`due(name, step)`: each entry once per process).
Learner-side faults (`nan_loss@v`) are read by the learner worker from the same variable, which the
actor factory forwards to actors through Ray's runtime_env.

Names: `kill_engine@s` (engine 0 killed before step s collects), `kill_engine_sync@s` (killed just before
step s's weight sync), `kill_engine_eval@s` (killed just after step s's eval prompts were submitted), `kill_learner@s` (learner rank 0 killed during step s), `slow_checkpoint@s` (the
checkpoint of step s is written slowly, to signal during it), `nan_loss@v` (learner, policy version v).
"""

from __future__ import annotations

import os
import time
from typing import Any

ENV = "RLVR_INJECT_FAULTS"
_fired: set[str] = set()


def parse(spec: str | None) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for item in (spec or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, _, step = item.partition("@")
        out.setdefault(name, set()).add(int(step) if step else 0)
    return out


def due(name: str, step: int) -> bool:
    """True once when fault `name` is configured for `step` in this process."""
    key = f"{name}@{step}"
    if key in _fired or step not in parse(os.environ.get(ENV)).get(name, set()):
        return False
    _fired.add(key)
    return True


def env_vars() -> dict[str, str]:
    """What to forward to actors (empty when no fault is configured)."""
    spec = os.environ.get(ENV)
    return {ENV: spec} if spec else {}


class NoFaults:
    """The driver's fault hooks, called at its injection points with the step the fault is named by: nothing."""

    def before_collect(self, step: int, actors: Any) -> None:
        """Step `step` is about to collect its rollouts."""

    def before_train(self, step: int, actors: Any) -> None:
        """The learners are about to train step `step`."""

    def before_sync(self, step: int, actors: Any) -> None:
        """The weights of step `step` are about to be sent to the engines."""

    def after_eval_submit(self, step: int, actors: Any) -> None:
        """The eval prompts of step `step` were just submitted."""

    def during_checkpoint(self, step: int) -> None:
        """The learners wrote the checkpoint of step `step`; the driver state and the commit are next."""


class EnvFaults(NoFaults):
    """The faults named in `RLVR_INJECT_FAULTS` (module docstring)."""

    def _kill(self, name: str, step: int, handles: list) -> None:
        if due(name, step):
            import ray

            ray.kill(handles[0])

    def before_collect(self, step: int, actors: Any) -> None:
        self._kill("kill_engine", step, actors.engines)

    def before_train(self, step: int, actors: Any) -> None:
        self._kill("kill_learner", step, actors.learners)

    def before_sync(self, step: int, actors: Any) -> None:
        self._kill("kill_engine_sync", step, actors.engines)

    def after_eval_submit(self, step: int, actors: Any) -> None:
        self._kill("kill_engine_eval", step, actors.engines)

    def during_checkpoint(self, step: int) -> None:
        if due("slow_checkpoint", step):
            time.sleep(5.0)  # a signal or kill lands in the middle of the write


def injector() -> NoFaults:
    """`EnvFaults` when `RLVR_INJECT_FAULTS` names any fault in this process, else `NoFaults`."""
    return EnvFaults() if os.environ.get(ENV) else NoFaults()
