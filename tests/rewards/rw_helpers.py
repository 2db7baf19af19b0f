"""Test-only reward functions, registered by import path ("rw_helpers:hang") in pool tests."""

import ctypes
import os
import signal
import time


def hang(completion_text: str, metadata: dict) -> float:
    """Hangs beyond the worker's soft timeout (SIGALRM blocked) when asked to, else scores 1."""
    if completion_text == "hang":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(3600)
    return 1.0


def busy(completion_text: str, metadata: dict) -> float:
    """A pure-Python infinite loop when asked to (interruptible by the worker's soft timeout)."""
    while completion_text == "busy":
        pass
    return 1.0


def crash(completion_text: str, metadata: dict) -> float:
    """Segfaults the worker when asked to."""
    if completion_text == "segfault":
        ctypes.string_at(0)
    if completion_text == "exit":
        os._exit(3)
    if completion_text == "raise":
        raise RuntimeError("boom")
    return 0.5
