"""Garbage-collector pauses in a vLLM engine's host process (issue 14): what the engine actor's event loop loses
to Python's cyclic GC while it turns decode steps into request outputs, with vLLM's per-token log-prob dicts or its
flat layout, and with or without the start-up heap frozen (`gc.freeze()`).

    python3 bench/engine_gc.py                     # one JSON line; CPU only, no vLLM needed
    python3 bench/engine_gc.py --requests 512 --tokens 512 --heap-objects 3000000

The process first builds a start-up heap like the engine actor's (torch and transformers imported, plus
`--heap-objects` small containers standing in for vLLM's modules, configs and tokenizer tables: several million
objects in a real engine process). It then replays `--tokens` decode steps for `--requests` requests, each step
appending every request's sampled token and log-prob the way vLLM's output processor does with `logprobs=0`:
- `dicts`: one `{token_id: Logprob}` dict and one Logprob object per token (vLLM's default layout),
- `flat`: three flat lists per request (`SamplingParams(flat_logprobs=True)`: `--rollout.vllm-lean-outputs`),
and drops every request's outputs when it finishes. Every GC pass is timed through `gc.callbacks`. Reported per
variant: the number of collections, the longest single pause (what stalls a pause or weight-update call), the
total paused, the number of full (generation 2) passes, and the replay's wall time. The figures are host-side only: the GPU is not involved,
and a real engine's pauses also depend on its heap, so read them as the direction and size of the effect.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Logprob:  # the shape of vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class GcTimer:
    """Duration of every collection, by generation, through gc.callbacks."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append((int(info["generation"]), time.perf_counter() - self._t0))


def startup_heap(n: int) -> list[Any]:
    """Long-lived objects like an engine process's after start-up (modules, configs, tokenizer tables)."""
    import torch  # noqa: F401  (their objects are part of the real heap)
    import transformers  # noqa: F401

    return [{"k": i, "v": [i]} for i in range(n)]


def replay(requests: int, tokens: int, flat: bool) -> float:
    """`tokens` decode steps of `requests` requests; every request's outputs dropped when it finishes."""
    t0 = time.perf_counter()
    if flat:
        outs: list[Any] = [([], [], []) for _ in range(requests)]
        for step in range(tokens):
            for r in range(requests):
                ids, lps, ranks = outs[r]
                ids.append(step)
                lps.append(-0.5)
                ranks.append(1)
    else:
        outs = [[] for _ in range(requests)]
        for step in range(tokens):
            for r in range(requests):
                outs[r].append({step: Logprob(-0.5, 1, None)})
    del outs
    return time.perf_counter() - t0


def run(variant: str, freeze: bool, a: argparse.Namespace, heap: list[Any]) -> dict[str, Any]:
    gc.collect()
    if freeze:
        gc.freeze()
    timer = GcTimer()
    gc.callbacks.append(timer)
    try:
        walls = [replay(a.requests, a.tokens, variant == "flat") for _ in range(a.rounds)]
    finally:
        gc.callbacks.remove(timer)
        if freeze:
            gc.unfreeze()
    full = [d for g, d in timer.pauses if g == 2]
    return {
        "variant": variant,
        "freeze": freeze,
        "passes": len(timer.pauses),
        "max_pause_ms": round(1000 * max((d for _, d in timer.pauses), default=0.0), 2),
        "total_pause_ms": round(1000 * sum(d for _, d in timer.pauses), 1),
        "full_passes": len(full),
        "max_full_pause_ms": round(1000 * max(full, default=0.0), 2),
        "replay_s": round(sum(walls), 4),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=512, help="requests decoding at once (two 256-sample steps)")
    p.add_argument("--tokens", type=int, default=512, help="decode steps (completion length)")
    p.add_argument("--rounds", type=int, default=6, help="batches replayed per variant")
    p.add_argument("--heap-objects", type=int, default=2_000_000, help="long-lived start-up objects")
    a = p.parse_args()
    heap = startup_heap(a.heap_objects)
    gc.collect()
    variants = (("dicts", False), ("dicts", True), ("flat", False), ("flat", True))
    results = [run(variant, freeze, a, heap) for variant, freeze in variants]
    base, best = results[0], results[-1]
    line = {
        "bench": "engine_gc",
        "requests": a.requests,
        "tokens": a.tokens,
        "rounds": a.rounds,
        "heap_objects": a.heap_objects,
        "tracked_objects_at_start": len(gc.get_objects()),
        "results": results,
        "max_pause_ms_before_after": [base["max_pause_ms"], best["max_pause_ms"]],
        "total_pause_ms_before_after": [base["total_pause_ms"], best["total_pause_ms"]],
    }
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
