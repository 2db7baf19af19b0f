"""Hostile reward functions for the fault tests: one hangs forever, one segfaults its worker process.

Both trigger on a deterministic subset of completions (so the run still gets real scores from `copy`).
Registered by import path: `--rewards.custom fault_rewards` with this directory on PYTHONPATH.
"""

from __future__ import annotations

import ctypes
import time
import zlib

from rlvr.rewards.registry import register_reward


def _hit(text: str, modulo: int) -> bool:
    return zlib.crc32(text.encode()) % modulo == 0


@register_reward("hang_sometimes")
def hang_sometimes(completion_text: str, metadata: dict) -> float:
    if _hit(completion_text, 5):
        while True:  # ignores everything but the pool's timeout
            time.sleep(3600)
    return 0.0


@register_reward("segfault_sometimes")
def segfault_sometimes(completion_text: str, metadata: dict) -> float:
    if _hit(completion_text + "x", 5):
        ctypes.string_at(0)  # SIGSEGV in the worker process
    return 0.0
