"""The generation-engine protocol (docs/design.md, Generation engines), shared by the transformers and vLLM engines.

An engine is a plain class (no Ray); `rlvr.orchestration` wraps it in a Ray actor whose methods may be
called from several threads at once (max_concurrency > 1), so every method must be thread-safe.

Invariants every implementation keeps:
- Requests stream in per prompt (`submit`) and completed groups stream out (`poll`): a prompt's
  `num_samples` samples are returned together, in `sample_index` order, and never before all are done.
- `Sample.logprobs` holds one entry per completion token: log-softmax(logits / temperature) of the sampled
  token, before top-p/top-k filtering (training uses top_p 1, top_k 0, so this equals the learner's
  distribution); greedy requests (temperature < 1e-5) record temperature-1 log-probs.
- A stop token (EOS or `stop_token_ids`) is kept in `completion_token_ids` with its log-prob; a stop string
  truncates the completion after the token that completed it. Both give finish_reason "stop"; reaching
  `max_new_tokens` gives "length"; `abort_all` drops requests and returns their prompt ids (no samples).
- `version_start` is `policy_version` when the sample's sequence was admitted, `version_end` when it
  finished. A weight update is pause -> (drain running requests when in-flight updates are off) -> load ->
  bump `policy_version` -> resume; with in-flight updates running sequences continue on the new weights, so
  `version_end` can exceed `version_start`.
- How weights get in is not part of this protocol but of the weight-sync transport
  (`rlvr.weight_sync.transport`): the transformers engine takes HF-named tensors in process (`load_weights`),
  vLLM only through its weight-transfer API (NCCL, CUDA IPC); with LoRA both take the adapter (`AdapterLoading`).
- With `SamplingParams.seed` set, sample j of a prompt draws from its own generator seeded with seed + j,
  so its tokens do not depend on which other requests share the batch.
- An exception raised inside an engine's background work is re-raised by the next `poll`, `generate` or
  `stats` call, never swallowed.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

import torch

from rlvr.types import PromptRequest, Sample

GREEDY_TEMPERATURE_EPS = 1e-5
"""Temperatures below this mean greedy decoding (argmax); log-probs are then taken at temperature 1."""


class EngineError(RuntimeError):
    """An error raised in an engine's background worker, re-raised to the caller (cause chained)."""


@runtime_checkable
class GenerationEngine(Protocol):
    """One generation engine: streams prompts in and completed groups of samples out."""

    engine_id: int

    @property
    def policy_version(self) -> int:
        """The version of the weights currently loaded (bumped by every weight update)."""
        ...

    def submit(self, requests: list[PromptRequest]) -> None:
        """Enqueue prompts without blocking; each expands to `num_samples` sequences."""
        ...

    def poll(self) -> list[Sample]:
        """Samples of prompts completed since the last poll (whole groups only); never blocks."""
        ...

    def pause(self) -> None:
        """Stop admitting new requests; running ones keep their state (and, unless drained, keep decoding)."""
        ...

    def resume(self) -> None:
        """Admit requests again after `pause`."""
        ...

    def score(
        self, prompt_token_ids: list[int], completion_token_ids: list[int], temperature: float = 1.0
    ) -> list[float]:
        """Teacher-forced log-probs of the completion tokens under the current weights (one per token)."""
        ...

    def generate(self, requests: list[PromptRequest], timeout_s: float = 600) -> list[Sample]:
        """Blocking convenience: submit and wait for exactly these prompts; samples in request order."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters and gauges: running, queued, completed prompts, generated tokens, tokens/s, version."""
        ...

    def abort_all(self) -> list[str]:
        """Drop every queued and running request; return their prompt ids (for re-queueing)."""
        ...

    def shutdown(self) -> None:
        """Stop background work and free the model; idempotent."""
        ...


@runtime_checkable
class AdapterLoading(Protocol):
    """An engine serving a LoRA adapter (`learner.lora_rank` > 0): each call is a weight update as above, replacing the
    adapter and setting `policy_version = version`."""

    def load_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """The adapter's tensors under PEFT on-disk names (`rlvr.rollout.lora`)."""
        ...

    def load_adapter_dir(self, path: str, version: int) -> None:
        """A PEFT adapter directory on this host (shared memory; data only)."""
        ...


def wait_until(
    cond: threading.Condition,
    predicate: Callable[[], bool],
    deadline: float | None,
    check: Callable[[], None],
    what: str,
) -> None:
    """Wait on `cond` (held by the caller) until predicate() holds; `check()` raises when the engine failed or
    shut down; TimeoutError names `what` once `deadline` (time.monotonic) passes."""
    while not predicate():
        check()
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise TimeoutError(f"{what} timed out")
        cond.wait(1.0 if remaining is None else min(remaining, 1.0))


class GroupBook:
    """An engine's prompt bookkeeping behind `submit` / `poll` / `generate` / `abort_all`: prompt uids,
    finished groups (for `poll`, or for the `generate` call waiting on that uid) and uids aborted while a
    `generate` waits. Every method expects the caller to hold `cond`, the engine's own condition."""

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self.outbox: list[Sample] = []
        self.waiting: dict[int, list[Sample] | None] = {}
        self.aborted: set[int] = set()
        self._uids = itertools.count()

    def new_uids(self, n: int, wait: bool) -> list[int]:
        """n fresh uids; with `wait` a `generate` call will collect their groups."""
        uids = [next(self._uids) for _ in range(n)]
        if wait:
            self.waiting.update({u: None for u in uids})
        return uids

    def file(self, uid: int, group: list[Sample]) -> None:
        """A prompt's finished group goes to its waiting `generate` call, else to the outbox."""
        if uid in self.waiting:
            self.waiting[uid] = group
        else:
            self.outbox.extend(group)
        self.cond.notify_all()

    def take(self) -> list[Sample]:
        """Everything filed for `poll` since the last take."""
        out, self.outbox = self.outbox, []
        return out

    def abort(self, uids: Iterable[int]) -> None:
        """Dropped prompts: wake the `generate` calls waiting on any of them."""
        self.aborted.update(u for u in uids if u in self.waiting)
        self.cond.notify_all()

    def collect(
        self, requests: list[PromptRequest], uids: list[int], deadline: float, check: Callable[[], None], engine_id: int
    ) -> list[Sample]:
        """Block until each uid's group is filed or aborted; samples in request order, then sample_index
        order. EngineError if any was aborted; `check` as in `wait_until`."""
        try:
            wait_until(
                self.cond,
                lambda: all(self.waiting.get(u) is not None or u in self.aborted for u in uids),
                deadline,
                check,
                f"engine {engine_id}: generate()",
            )
        finally:
            results = [self.waiting.pop(u, None) for u in uids]
            aborted = [r.prompt_id for r, u in zip(requests, uids, strict=True) if u in self.aborted]
            self.aborted.difference_update(uids)
        if aborted:
            raise EngineError(f"engine {engine_id}: generate() prompts were aborted: {aborted}")
        return [s for group in results for s in group or []]
