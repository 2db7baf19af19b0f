"""Fault injection for the fault-tolerance tests and `bench/faults.py` (never active unless asked for).

`RLVR_INJECT_FAULTS` holds comma-separated `name@step` entries, e.g. `kill_engine@3,kill_learner@4`.
The driver calls `due(name, step)` at its injection points; each entry fires once per process.
Learner-side faults (`nan_loss@v`) are read by the learner worker from the same variable, which the
actor factory forwards to actors through Ray's runtime_env.

Names: `kill_engine@s` (engine 0 killed before step s collects), `kill_engine_sync@s` (killed just before
step s's weight sync), `kill_engine_eval@s` (killed just after step s's eval prompts were submitted), `kill_learner@s` (learner rank 0 killed during step s), `slow_checkpoint@s` (the
checkpoint of step s is written slowly, to signal during it), `nan_loss@v` (learner, policy version v).
"""

from __future__ import annotations

import os

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
