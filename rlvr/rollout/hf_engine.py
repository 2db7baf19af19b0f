"""The transformers generation engine: CPU runs, tests, and small GPU runs without vLLM.

A plain class (no Ray) implementing `rlvr.rollout.base.GenerationEngine`. A background worker thread admits
queued prompts between decode steps (continuous admission, up to `max_batch_size` sequences; a prompt's
`num_samples` sequences may be admitted in several chunks) and decodes them with the model's KV cache
(`rlvr.rollout.kv_batch`). Methods may be called from several threads at once.

Locks and invariants:
- `_model_lock` guards the model and the running batch: the worker holds it for one admission + decode
  step; `load_weights`, `score` and `abort_all` take it between steps, so a weight update never lands in
  the middle of a forward pass. Lock order is always `_model_lock` then `_cond`, never the reverse.
- `_cond` (a Condition) guards the queue, outbox, counters, pause flags and `_num_running`. A sequence is
  counted in `_num_running` from the moment it is taken off the queue until its sample is filed, so the
  drain of a non-in-flight weight update cannot miss a sequence being admitted.
- Admission stops while the user paused the engine or a weight update is in progress; running sequences
  keep decoding (that is what lets `inflight_updates=False` drain them).
- A prompt's samples are filed together once all `num_samples` are done: into a `generate()` call waiting
  for it, else into the outbox that `poll()` empties. A `generate()` that times out leaves its prompts
  running; their samples then arrive through `poll()`.
- An exception in the worker is stored, ends the worker, and is re-raised (as `EngineError`, chained) by
  every later `poll`/`generate`/`stats`/`submit`/`load_weights` call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlvr.rollout.base import EngineError, GroupBook, wait_until
from rlvr.rollout.kv_batch import RunningBatch, Sequence
from rlvr.rollout.lora import LoraSpec, read_adapter_dir, to_module_names
from rlvr.rollout.lora import wrap as wrap_lora
from rlvr.rollout.sampling import (
    check_finish,
    default_eos_token_ids,
    effective_temperature,
    sample_rows,
    validate_request,
)
from rlvr.rollout.weights import copy_named_tensors
from rlvr.types import PromptRequest, Sample

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Job:
    """One submitted prompt: its samples are admitted from `next_index` on and collected in `done`."""

    uid: int
    request: PromptRequest
    next_index: int = 0
    done: dict[int, Sample] = field(default_factory=dict)


class TransformersEngine:
    """Generation with a transformers causal LM and a hand-written KV-cache decode loop."""

    def __init__(
        self,
        model_path: str,
        engine_id: int = 0,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        max_batch_size: int = 32,
        inflight_updates: bool = True,
        eos_token_ids: list[int] | None = None,
        tokenizer_path: str | None = None,
        num_threads: int | None = None,
        initial_version: int = 0,
        attn_implementation: str | None = None,
        lora: LoraSpec | None = None,
    ) -> None:
        """`lora`: serve the base model plus this LoRA adapter (as peft applies it); `load_weights` then takes the
        adapter's tensors under PEFT on-disk names (`rlvr.rollout.lora`), which until the first load are peft's
        initial adapter (lora_B zero: the base model's outputs)."""
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(_DTYPES)}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if num_threads:
            torch.set_num_threads(num_threads)
        self.engine_id = engine_id
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.inflight_updates = inflight_updates
        model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=_DTYPES[dtype], attn_implementation=attn_implementation
        )
        self.lora = lora
        if lora is not None:
            model = wrap_lora(model, lora, model_path)
        self._model: torch.nn.Module | None = model.to(self.device).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or model_path)
        self.eos_token_ids: list[int] = (
            list(eos_token_ids) if eos_token_ids is not None else default_eos_token_ids(model, self.tokenizer)
        )
        self.max_positions: int | None = getattr(model.config, "max_position_embeddings", None)
        self._version = initial_version
        self._model_lock = threading.Lock()
        self._update_lock = threading.Lock()
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._book = GroupBook(self._cond)
        self._user_paused = False
        self._num_updates_in_progress = 0
        self._num_running = 0
        self._stopping = False
        self._error: BaseException | None = None
        self._counters = {"completed_prompts": 0, "completed_samples": 0, "generated_tokens": 0, "busy_s": 0.0}
        self._num_cached_tokens = 0
        self._started = time.monotonic()
        self._batch = RunningBatch(self.device)
        self._worker = threading.Thread(target=self._run, name=f"hf-engine-{engine_id}", daemon=True)
        self._worker.start()

    @property
    def policy_version(self) -> int:
        return self._version

    def submit(self, requests: list[PromptRequest]) -> None:
        """Enqueue prompts (non-blocking)."""
        self._enqueue(requests, wait=False)

    def poll(self) -> list[Sample]:
        """Samples of prompts completed since the last poll, whole groups in sample_index order."""
        with self._cond:
            self._raise_if_failed()
            return self._book.take()

    def pause(self) -> None:
        with self._cond:
            self._user_paused = True

    def resume(self) -> None:
        with self._cond:
            self._user_paused = False
            self._cond.notify_all()

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """pause -> (drain when not in-flight) -> copy HF-named tensors -> policy_version = version -> resume.

        Tensors are copied as the iterable yields them (`rlvr.rollout.weights`); on a bad name or shape a
        ValueError is raised and the version is not bumped (weights may be partly updated).
        """
        with self._update_lock:
            with self._cond:
                self._raise_if_failed()
                self._num_updates_in_progress += 1
            try:
                if not self.inflight_updates:
                    with self._cond:
                        wait_until(self._cond, lambda: self._num_running == 0, None, self._check_alive, "drain")
                if self.lora is not None:  # PEFT on-disk names -> the live adapter parameters
                    named_tensors = to_module_names(named_tensors)
                with self._model_lock, torch.no_grad():
                    num_loaded = copy_named_tensors(self._require_model(), named_tensors)
                    with self._cond:
                        self._version = version
            finally:
                with self._cond:
                    self._num_updates_in_progress -= 1
                    self._cond.notify_all()
        logger.debug("engine %d loaded %d tensors, policy version %d", self.engine_id, num_loaded, version)

    def load_adapter(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """LoRA: `load_weights` with the adapter's tensors (PEFT on-disk names)."""
        if self.lora is None:
            raise ValueError(f"engine {self.engine_id}: load_adapter needs LoRA (--learner.lora-rank > 0)")
        self.load_weights(named_tensors, version)

    def load_adapter_dir(self, path: str, version: int) -> None:
        """LoRA: `load_adapter` with the tensors of a PEFT adapter directory (shared memory; data only)."""
        _, tensors = read_adapter_dir(path)
        self.load_adapter(tensors.items(), version)

    def score(
        self, prompt_token_ids: list[int], completion_token_ids: list[int], temperature: float = 1.0
    ) -> list[float]:
        """Teacher-forced log-probs of the completion tokens (log_softmax(logits / temperature), fp32)."""
        if not completion_token_ids:
            return []
        if not prompt_token_ids:
            raise ValueError("score() needs a non-empty prompt")
        ids = list(prompt_token_ids) + list(completion_token_ids)
        with self._model_lock, torch.no_grad():
            model = self._require_model()
            ids_1T = torch.tensor([ids], dtype=torch.long, device=self.device)
            pos_1T = torch.arange(len(ids), device=self.device).unsqueeze(0)
            logits = model(input_ids=ids_1T, position_ids=pos_1T, use_cache=False).logits[0]
        start = len(prompt_token_ids) - 1
        logits_CV = logits[start : start + len(completion_token_ids)].float() / effective_temperature(temperature)
        targets = torch.tensor(completion_token_ids, dtype=torch.long, device=self.device).unsqueeze(1)
        return torch.log_softmax(logits_CV, dim=-1).gather(1, targets).squeeze(1).tolist()

    def generate(self, requests: list[PromptRequest], timeout_s: float = 600) -> list[Sample]:
        """Submit and wait for exactly these prompts; samples in request order, then sample_index order."""
        uids = self._enqueue(requests, wait=True)
        with self._cond:
            return self._book.collect(requests, uids, time.monotonic() + timeout_s, self._check_alive, self.engine_id)

    def stats(self) -> dict[str, float]:
        """Gauges and counters; tokens_per_s is generated tokens over time spent in decode steps."""
        with self._cond:
            self._raise_if_failed()
            queued = sum(job.request.num_samples - job.next_index for job in self._queue)
            busy = self._counters["busy_s"]
            return {
                "running": float(self._num_running),
                "queued": float(queued),
                "queued_prompts": float(len(self._queue)),
                **{k: float(v) for k, v in self._counters.items()},
                "tokens_per_s": self._counters["generated_tokens"] / busy if busy > 0 else 0.0,
                "uptime_s": time.monotonic() - self._started,
                "kv_cached_tokens": float(self._num_cached_tokens),
                "policy_version": float(self._version),
                "paused": float(self._user_paused or self._num_updates_in_progress > 0),
            }

    def abort_all(self) -> list[str]:
        """Drop queued and running prompts (partial samples discarded); return their prompt ids."""
        with self._model_lock, self._cond:
            jobs: dict[int, _Job] = {}
            for seq in self._batch.seqs:
                jobs.setdefault(seq.job.uid, seq.job)
            for job in self._queue:
                jobs.setdefault(job.uid, job)
            self._queue.clear()
            self._batch.clear()
            self._num_running = 0
            self._num_cached_tokens = 0
            self._book.abort(jobs)
        return [job.request.prompt_id for job in jobs.values()]

    def shutdown(self) -> None:
        """Stop the worker, drop requests and free the model; idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._worker.is_alive() and threading.current_thread() is not self._worker:
            self._worker.join(timeout=60)
        with self._model_lock:
            self._batch.clear()
            self._model = None

    def _enqueue(self, requests: list[PromptRequest], wait: bool) -> list[int]:
        for req in requests:
            validate_request(req, self.max_positions)
        with self._cond:
            self._raise_if_failed()
            if self._stopping:
                raise EngineError(f"engine {self.engine_id} is shut down")
            uids = self._book.new_uids(len(requests), wait)
            for uid, req in zip(uids, requests, strict=True):
                self._queue.append(_Job(uid, req))
            self._cond.notify_all()
        return uids

    def _check_alive(self) -> None:
        """For waits under `_cond`: raise when the worker failed or the engine shut down."""
        self._raise_if_failed()
        if self._stopping:
            raise EngineError(f"engine {self.engine_id} shut down while waiting")

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise EngineError(f"engine {self.engine_id} worker failed: {self._error!r}") from self._error

    def _require_model(self) -> torch.nn.Module:
        if self._model is None:
            raise EngineError(f"engine {self.engine_id} is shut down")
        return self._model

    def _run(self) -> None:
        try:
            while self._wait_for_work():
                with self._model_lock, torch.no_grad():
                    start = time.perf_counter()
                    self._admit()
                    if len(self._batch):
                        self._decode_step()
                    elapsed = time.perf_counter() - start
                with self._cond:
                    self._counters["busy_s"] += elapsed
                    self._num_cached_tokens = self._batch.num_cached_tokens
        except BaseException as exc:  # the worker thread's boundary: stored and re-raised to every caller
            logger.exception("engine %d worker failed", self.engine_id)
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def _admitting(self) -> bool:
        return not self._user_paused and self._num_updates_in_progress == 0

    def _wait_for_work(self) -> bool:
        with self._cond:
            while not self._stopping and not (self._num_running > 0 or (self._queue and self._admitting())):
                self._cond.wait(timeout=1.0)
            return not self._stopping

    def _admit(self) -> None:
        """Admit queued sequences while there is room; each chunk of one prompt is prefilled once."""
        while True:
            with self._cond:
                room = self.max_batch_size - self._num_running
                if room <= 0 or not self._queue or not self._admitting():
                    break
                job = self._queue[0]
                first = job.next_index
                num = min(room, job.request.num_samples - first)
                job.next_index += num
                if job.next_index >= job.request.num_samples:
                    self._queue.popleft()
                self._num_running += num
                version = self._version
            req = job.request
            seqs = [
                Sequence(job, req, j, self._generator(req.sampling.seed, j), version) for j in range(first, first + num)
            ]
            cache, logits = self._batch.prefill(self._require_model(), req.prompt_token_ids, num)
            tokens, logprobs = sample_rows(logits, [s.request.sampling for s in seqs], [s.generator for s in seqs])
            self._batch.add(seqs, cache, tokens)
            self._append(seqs, tokens, logprobs)
        self._retire()

    def _decode_step(self) -> None:
        seqs = list(self._batch.seqs)
        logits = self._batch.step(self._require_model())
        tokens, logprobs = sample_rows(logits, [s.request.sampling for s in seqs], [s.generator for s in seqs])
        self._batch.set_next_tokens(tokens)
        self._append(seqs, tokens, logprobs)
        self._retire()

    def _generator(self, seed: int | None, sample_index: int) -> torch.Generator:
        gen = torch.Generator(device=self.device)
        if seed is None:
            gen.seed()
        else:
            gen.manual_seed(seed + sample_index)
        return gen

    def _decode_text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _append(self, seqs: list[Sequence], tokens: list[int], logprobs: list[float]) -> None:
        for seq, token, logprob in zip(seqs, tokens, logprobs, strict=True):
            seq.token_ids.append(token)
            seq.logprobs.append(logprob)
            params = seq.request.sampling
            stop_ids = set(self.eos_token_ids).union(params.stop_token_ids)
            # Stop when the sequence fills the model's positions (the learner must fit it too).
            at_limit = self.max_positions is not None and seq.prompt_len + len(seq.token_ids) >= self.max_positions
            seq.finish_reason = check_finish(seq.token_ids, params, stop_ids, self._decode_text, at_limit)
        with self._cond:
            self._counters["generated_tokens"] += len(tokens)

    def _retire(self) -> None:
        """Drop finished rows from the batch and file their samples (whole prompts go out together)."""
        keep = [row for row, seq in enumerate(self._batch.seqs) if seq.finish_reason is None]
        finished = [seq for seq in self._batch.seqs if seq.finish_reason is not None]
        if not finished:
            return
        self._batch.keep(keep)
        # The version only changes under _model_lock, which the worker holds here.
        samples = [seq.to_sample(self._version, self.engine_id, self._decode_text(seq.token_ids)) for seq in finished]
        with self._cond:
            for seq, sample in zip(finished, samples, strict=True):
                job: _Job = seq.job
                job.done[seq.sample_index] = sample
                if len(job.done) == job.request.num_samples:
                    self._file(job)
            self._num_running -= len(finished)
            self._counters["completed_samples"] += len(finished)
            self._cond.notify_all()

    def _file(self, job: _Job) -> None:
        self._book.file(job.uid, [job.done[i] for i in range(job.request.num_samples)])
        self._counters["completed_prompts"] += 1
