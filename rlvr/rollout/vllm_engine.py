"""The vLLM generation engine (GPU): `GenerationEngine` (docs/design.md, Generation engines) on vLLM 0.26's `AsyncLLM`.

A plain class (no Ray). `AsyncLLM` runs on an asyncio loop in a background thread owned by this object;
every public method is synchronous, thread-safe, and hands its work to that loop. The weight-update methods (vLLM's
weight-transfer sessions, IPC chunks, LoRA adapters) live in `rlvr.rollout.vllm_weights`, a mixin of this class. vllm
is imported only in these two modules and only inside functions, so importing them works without the `gpu` extra.

Invariants:
- A prompt's `num_samples` samples go to vLLM as separate n=1 requests with seeds seed + j (vLLM's own n>1
  fan-out does the same: parallel_sampling.py), so each sample has its own finish time and `version_end`;
  they share the prompt's KV through prefix caching. A group is filed once all its samples are done.
- `Sample.logprobs` come from `logprobs_mode="processed_logprobs"` with `logprobs=0`: log_softmax of the
  logits after temperature (greedy rows: temperature 1), i.e. the distribution the learner computes. With
  top_p < 1 or top_k > 0 vLLM's values are after that filtering too (renormalised over the kept tokens);
  training keeps both off, so this never differs from the transformers engine there.
- `version_start` is `policy_version` when rlvr hands the request to vLLM (conservative: a request still in
  vLLM's waiting queue during an update is prefilled on the new weights yet stamped with the old version);
  `version_end` is `policy_version` when its final output arrives.
- Prefix caching never serves KV computed by older weights to a newer request: every request carries
  `cache_salt = "rlvr-v<version at admission>"` (vLLM hashes the salt into the first block), and with
  in-flight updates off the prefix cache is also reset after each update (nothing is running then).
- A weight update is: stop rlvr admission -> `pause_generation(mode="keep")` (in-flight updates: running
  requests are frozen with their KV and continue on the new weights) or `mode="wait"` (drain running
  requests first) -> `start_weight_update` -> `update_weights` (one or more chunks) ->
  `finish_weight_update` -> policy_version = version -> `resume_generation` (unless the engine sleeps:
  `wake_up` resumes it) -> admit again. A failure mid-update leaves weights partly loaded, so it marks the
  engine failed: every later call raises `EngineError`.
- `pause()` stops rlvr admitting queued prompts; requests already handed to vLLM keep running.
- `score()` uses `prompt_logprobs`, which vLLM takes before temperature (ModelConfig.logprobs_mode docs),
  so it supports temperature 1 (and greedy, which means temperature 1) only.
- An exception in the loop's work is stored and re-raised (as `EngineError`) by later calls.
- LoRA (`learner.lora_rank` > 0): vLLM runs with LoRA on and serves one adapter, id `LORA_ID`, that every request
  carries once one is loaded (before that: none, i.e. the base model, which equals peft's initial adapter). An
  update writes the adapter to shared memory (`SharedMemoryAdapters`) and, paused as above, `add_lora`s it with
  `load_inplace=True` under the same id, so running requests continue on the new adapter; requests themselves
  never carry `load_inplace` (vLLM would reload the adapter at every step).
- With the `ipc` backend the constructor sets VLLM_ALLOW_INSECURE_SERIALIZATION=1 (inherited by vLLM's
  engine-core processes): CUDA IPC handles reach the workers pickled, and vLLM refuses to unpickle without it.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rlvr.config import ExperimentConfig
from rlvr.rollout.base import GREEDY_TEMPERATURE_EPS, EngineError, GroupBook
from rlvr.rollout.lora import LoraSpec, SharedMemoryAdapters, vllm_engine_args
from rlvr.rollout.sampling import validate_request
from rlvr.rollout.vllm_support import SchedulerStatsTap, cache_salt, default_max_model_len, import_vllm
from rlvr.rollout.vllm_weights import VLLMWeightUpdates, allow_ipc_handles
from rlvr.types import FinishReason, PromptRequest, Sample
from rlvr.types import SamplingParams as RlvrSamplingParams

logger = logging.getLogger(__name__)
STAGED_EXTENSION = "rlvr.rollout.vllm_staged.StagedNcclWorkerExtension"

T = TypeVar("T")

_FINISH_REASONS: dict[str | None, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}
"""vLLM finish reasons kept as they are. Anything else ("error", "repetition", a reason added later) becomes
"length": an ending the policy may have caused is treated as a truncation (shaped and scored like one), never
as an "abort", which restarts an episode and finally leaves it unscored: that would be a way out of a low score."""


def finish_reason(vllm_reason: str | None) -> FinishReason:
    """rlvr's finish reason for one of vLLM's (`_FINISH_REASONS`)."""
    return _FINISH_REASONS.get(vllm_reason, "length")


@dataclass
class _Job:
    uid: int
    request: PromptRequest
    done: dict[int, Sample] = field(default_factory=dict)
    tasks: list[asyncio.Task] = field(default_factory=list)


def sampled_logprobs(lps: Any, token_ids: list[int]) -> list[float]:
    """Each sampled token's log-prob from vLLM's per-position log-probs: its flat layout (`FlatLogprobs`: parallel
    lists, the sampled token first in each position's range) read straight from the lists, else (or where a
    position's range does not hold its token) the list-of-dicts form, `{token_id: Logprob}` per position."""
    starts, ends = getattr(lps, "start_indices", None), getattr(lps, "end_indices", None)
    flat_ids, flat_lps = getattr(lps, "token_ids", None), getattr(lps, "logprobs", None)
    if starts is None or ends is None or flat_ids is None or flat_lps is None:
        return [float(pos[t].logprob) for pos, t in zip(lps, token_ids, strict=True)]
    out = []
    for i, t in enumerate(token_ids):
        k = next((k for k in range(starts[i], ends[i]) if flat_ids[k] == t), None)
        out.append(float(flat_lps[k]) if k is not None else float(lps[i][t].logprob))
    return out


class VLLMEngine(VLLMWeightUpdates):
    """Generation with vLLM's async engine (continuous batching) behind the rlvr engine protocol."""

    def __init__(
        self,
        model_path: str,
        engine_id: int = 0,
        *,
        cfg: ExperimentConfig,
        initial_version: int = 0,
        tokenizer_path: str | None = None,
        weight_transfer_backend: str | None = None,
        enable_sleep_mode: bool | None = None,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        ignore_eos: bool = False,
        distributed_executor_backend: str | None = None,
        startup_timeout_s: float = 900.0,
        **engine_kwargs: Any,
    ) -> None:
        """`weight_transfer_backend`: "nccl" (default) or "ipc" (default when `cfg.cluster.colocate`);
        `enable_sleep_mode` defaults to `cfg.cluster.colocate and cfg.rollout.colocate_sleep`; `ignore_eos` makes every completion run to
        max_new_tokens (benchmarks and tests: a fixed workload); `engine_kwargs` go to AsyncEngineArgs."""
        import_vllm()
        from vllm.config import WeightTransferConfig
        from vllm.engine.arg_utils import AsyncEngineArgs

        self.engine_id = engine_id
        self.cfg = cfg
        self.inflight_updates = cfg.rollout.inflight_updates
        self.ignore_eos = ignore_eos
        colocate = cfg.cluster.colocate
        self.lora = LoraSpec.from_config(cfg)
        self._lora_request: Any = None  # what requests carry once an adapter is loaded (None: the base model)
        self._adapters = SharedMemoryAdapters(self.lora, model_path, f"e{engine_id}") if self.lora else None
        self.weight_transfer_backend = weight_transfer_backend or ("ipc" if colocate and not self.lora else "nccl")
        # full-weight NCCL syncs received in the background, then loaded in one short pause (rlvr.rollout.vllm_staged)
        self.staged_sync = cfg.rollout.vllm_staged_sync and self.weight_transfer_backend == "nccl" and not self.lora
        self._staged_fallback_logged = False
        self.sleep_enabled = (
            (colocate and cfg.rollout.colocate_sleep) if enable_sleep_mode is None else enable_sleep_mode
        )
        self.max_model_len = max_model_len or default_max_model_len(model_path, cfg)
        self._version = initial_version
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._queue: deque[_Job] = deque()  # touched on the loop thread only
        self._running: dict[int, _Job] = {}  # touched on the loop thread only
        self._book = GroupBook(self._cond)
        self._rids = itertools.count()
        self._user_paused = False
        self._updating = False
        self._asleep = False
        self._stopped = False
        self._error: BaseException | None = None
        self._sched: dict[str, float] = {}
        self._counters = {
            "completed_prompts": 0.0,
            "completed_samples": 0.0,
            "generated_tokens": 0.0,
            "busy_s": 0.0,
            "num_updates": 0.0,
        }
        self._num_inflight = 0
        self._busy_since: float | None = None
        self._started = time.monotonic()
        dtype = cfg.model.dtype if cfg.model.dtype not in ("auto",) else "bfloat16"
        self._tokenizer_path = tokenizer_path or cfg.model.tokenizer_path or model_path
        self._tokenizer: Any = None  # lean outputs: decodes finished completions here, once (`_completion_text`)
        args = AsyncEngineArgs(
            model=model_path,
            tokenizer=self._tokenizer_path,
            dtype=dtype,
            seed=cfg.seed + engine_id,
            gpu_memory_utilization=(
                gpu_memory_utilization
                if gpu_memory_utilization is not None
                else cfg.rollout.vllm_gpu_memory_utilization
            ),
            enforce_eager=cfg.rollout.vllm_enforce_eager,
            enable_prefix_caching=cfg.rollout.vllm_enable_prefix_caching,
            tensor_parallel_size=cfg.cluster.engine_tp,
            max_model_len=self.max_model_len,
            logprobs_mode="processed_logprobs",
            weight_transfer_config=WeightTransferConfig(backend=self.weight_transfer_backend),
            enable_sleep_mode=self.sleep_enabled,
            trust_remote_code=cfg.model.trust_remote_code,
            disable_log_stats=True,  # our stat tap still receives scheduler stats (custom loggers enable them)
            distributed_executor_backend=distributed_executor_backend,
            **(vllm_engine_args(self.lora) if self.lora else {}),
            **({"worker_extension_cls": STAGED_EXTENSION} if self.staged_sync else {}),
            **engine_kwargs,
        )
        if self.weight_transfer_backend == "ipc":
            allow_ipc_handles()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name=f"vllm-engine-{engine_id}", daemon=True)
        self._thread.start()
        try:
            self._llm = self._call(self._start(args), timeout=startup_timeout_s)
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise
        if cfg.rollout.vllm_lean_outputs:
            try:  # the tokenizer that decodes finished completions, loaded now rather than when the first batch ends
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(
                    self._tokenizer_path, trust_remote_code=cfg.model.trust_remote_code
                )
            except Exception as e:  # vLLM keeps detokenizing (flat log-probs still on) rather than failing mid-run
                logger.warning(
                    "engine %d: tokenizer %s did not load (%s): vLLM detokenizes completions, as without "
                    "--rollout.vllm-lean-outputs",
                    engine_id,
                    self._tokenizer_path,
                    e,
                )
        # Everything alive now (torch, vLLM, the tokenizer: millions of objects) lives as long as the process: kept
        # out of the collector's full passes, which otherwise stall this process's event loop (request outputs,
        # pause and weight-update calls) for the length of one pass. vLLM's own engine core and API server do
        # the same after start-up.
        gc.collect()
        gc.freeze()
        logger.info(
            "vLLM engine %d up (model %s, tp %d, backend %s, sleep mode %s)",
            engine_id,
            model_path,
            cfg.cluster.engine_tp,
            self.weight_transfer_backend,
            self.sleep_enabled,
        )

    # ------------------------------------------------------------------ protocol
    @property
    def policy_version(self) -> int:
        return self._version

    def submit(self, requests: list[PromptRequest]) -> None:
        """Enqueue prompts (non-blocking); admitted to vLLM unless paused or updating."""
        self._enqueue(requests, wait=False)

    def poll(self) -> list[Sample]:
        """Samples of prompts completed since the last poll, whole groups in sample_index order."""
        with self._lock:
            self._raise_if_failed()
            return self._book.take()

    def pause(self) -> None:
        """Stop admitting queued prompts; requests already in vLLM keep running."""
        self._user_paused = True

    def resume(self) -> None:
        self._user_paused = False
        self._loop.call_soon_threadsafe(self._pump)

    def score(
        self, prompt_token_ids: list[int], completion_token_ids: list[int], temperature: float = 1.0
    ) -> list[float]:
        """Teacher-forced log-probs of the completion tokens under the current weights (temperature 1 only)."""
        if not completion_token_ids:
            return []
        if not prompt_token_ids:
            raise ValueError("score() needs a non-empty prompt")
        if temperature >= GREEDY_TEMPERATURE_EPS and abs(temperature - 1.0) > 1e-6:
            raise ValueError(
                f"VLLMEngine.score supports temperature 1.0 only (got {temperature}): vLLM's "
                "prompt_logprobs are taken before temperature scaling"
            )
        ids = list(prompt_token_ids) + list(completion_token_ids)
        if len(ids) > self.max_model_len:
            raise ValueError(f"score(): {len(ids)} tokens exceed max_model_len {self.max_model_len}")
        self._raise_if_failed()
        return self._call(self._score(ids, len(prompt_token_ids)))

    def generate(self, requests: list[PromptRequest], timeout_s: float = 600) -> list[Sample]:
        """Submit and wait for exactly these prompts; samples in request order, then sample_index order."""
        uids = self._enqueue(requests, wait=True)
        with self._cond:
            return self._book.collect(requests, uids, time.monotonic() + timeout_s, self._check_alive, self.engine_id)

    def stats(self) -> dict[str, float]:
        """Counters and gauges; running/waiting/kv_usage are vLLM's scheduler figures (latest step)."""
        with self._lock:
            self._raise_if_failed()
            busy = self._counters["busy_s"] + (time.monotonic() - self._busy_since if self._busy_since else 0.0)
            queued_prompts = len(self._queue)
            return {
                "running": self._sched.get("vllm_running", float(self._num_inflight)),
                "queued": self._sched.get("vllm_waiting", 0.0) + sum(j.request.num_samples for j in self._queue),
                "queued_prompts": float(queued_prompts),
                "inflight_samples": float(self._num_inflight),
                "kv_usage": self._sched.get("kv_usage", 0.0),
                **self._counters,
                "busy_s": busy,  # the period still open counts: an engine never idle never closes one
                "tokens_per_s": self._counters["generated_tokens"] / busy if busy > 0 else 0.0,
                "uptime_s": time.monotonic() - self._started,
                "policy_version": float(self._version),
                "paused": float(self._user_paused or self._updating),
                "asleep": float(self._asleep),
            }

    def abort_all(self) -> list[str]:
        """Drop queued and running prompts (partial samples discarded); return their prompt ids."""
        if self._stopped:
            return []
        return self._call(self._abort_all())

    def shutdown(self) -> None:
        """Abort everything, stop vLLM (its engine-core processes) and the loop thread; idempotent."""
        if self._stopped:
            return
        try:
            if self._thread.is_alive():
                self._call(self._abort_all(), timeout=120)
        except Exception:  # shutting down: the engine may already be broken; log and carry on
            logger.exception("engine %d: abort during shutdown failed", self.engine_id)
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        llm = getattr(self, "_llm", None)
        if llm is not None and self._thread.is_alive():
            self._call(self._shutdown_llm(llm), timeout=300)  # on the loop: its zmq sockets belong to it
        self._llm = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=60)
        if self._adapters is not None:
            self._adapters.close()
        gc.unfreeze()  # a process that goes on (eval CLI, tests) can collect what start-up froze again

    # ------------------------------------------------------------------ colocated mode
    def sleep(self, level: int = 1) -> None:
        """Free GPU memory (level 1: weights to CPU, KV dropped; level 2: both dropped, buffers kept).
        Requests in flight are frozen and recomputed after `wake_up`."""
        if not self.sleep_enabled:
            raise ValueError("sleep() needs enable_sleep_mode (on by default with cluster.colocate)")
        with self._lock:  # asleep is not busy: requests frozen through the sleep do not generate
            self._asleep = True
            self._close_busy_period(time.monotonic())
        self._call(self._llm.sleep(level, mode="keep"))

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore memory: tags None = everything; ["weights"] first (to receive an update) then
        ["kv_cache"] keeps peak memory low. Scheduling resumes once everything is resident."""
        self._call(self._llm.wake_up(tags))
        if tags is None or "kv_cache" in tags:
            asleep = bool(self._call(self._llm.is_sleeping()))
            with self._lock:
                self._asleep = asleep
                if not asleep and self._num_inflight and self._busy_since is None:
                    self._busy_since = time.monotonic()  # the frozen requests generate again
        self._loop.call_soon_threadsafe(self._pump)

    # ------------------------------------------------------------------ loop thread
    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("VLLMEngine methods must not be called from its own loop thread")
        if not self._thread.is_alive():
            coro.close()
            raise EngineError(f"engine {self.engine_id} is shut down")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _start(self, args: Any) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        tap = SchedulerStatsTap(self._sched)
        return AsyncLLM.from_engine_args(args, stat_loggers=[lambda _vllm_config, _idx: tap])

    async def _shutdown_llm(self, llm: Any) -> None:
        llm.shutdown()

    def _fail(self, exc: BaseException) -> None:
        logger.error("engine %d failed: %r", self.engine_id, exc)
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()

    def _enqueue(self, requests: list[PromptRequest], wait: bool) -> list[int]:
        for req in requests:
            validate_request(req, self.max_model_len)
        with self._cond:
            self._raise_if_failed()
            if self._stopped:
                raise EngineError(f"engine {self.engine_id} is shut down")
            uids = self._book.new_uids(len(requests), wait)
        jobs = [_Job(u, r) for u, r in zip(uids, requests, strict=True)]
        self._loop.call_soon_threadsafe(self._admit, jobs)
        return uids

    def _admit(self, jobs: list[_Job]) -> None:
        self._queue.extend(jobs)
        self._pump()

    def _pump(self) -> None:
        """Hand queued prompts to vLLM while admission is open (loop thread)."""
        while self._queue and not (self._user_paused or self._updating or self._stopped or self._error):
            job = self._queue.popleft()
            self._running[job.uid] = job
            version = self._version
            for j in range(job.request.num_samples):
                job.tasks.append(self._loop.create_task(self._run_sample(job, j, version)))

    def _vllm_params(self, s: RlvrSamplingParams, sample_index: int, **overrides: Any) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        greedy = s.temperature < GREEDY_TEMPERATURE_EPS
        kwargs: dict[str, Any] = dict(
            n=1,
            temperature=0.0 if greedy else float(s.temperature),
            top_p=float(s.top_p),
            top_k=int(s.top_k),
            max_tokens=int(s.max_new_tokens),
            stop=list(s.stop_strings) or None,
            stop_token_ids=list(s.stop_token_ids) or None,
            include_stop_str_in_output=True,
            seed=None if s.seed is None else int(s.seed) + sample_index,
            logprobs=0,
            # --rollout.vllm-lean-outputs: a few flat lists per request instead of a dict + Logprob object per
            # token (hundreds of thousands fewer objects per step for this process's garbage collector)
            flat_logprobs=self.cfg.rollout.vllm_lean_outputs,
            ignore_eos=self.ignore_eos,
            skip_special_tokens=True,
            # vLLM detokenizes every token of every request as it goes, on this process's event loop; only stop
            # strings need that. With --rollout.vllm-lean-outputs the text of the others is decoded once per
            # finished sample (`_completion_text`), as the transformers engine does.
            detokenize=self._vllm_detokenizes(s),
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        kwargs.update(overrides)
        return SamplingParams(**kwargs)

    def _busy(self, delta: int) -> None:
        with self._lock:
            now = time.monotonic()
            if self._num_inflight == 0 and delta > 0 and not self._asleep:
                self._busy_since = now
            self._num_inflight += delta
            if self._num_inflight == 0:
                self._close_busy_period(now)

    def _close_busy_period(self, now: float) -> None:
        """Add the open busy period (if any) to `busy_s` and close it; under `_lock`."""
        if self._busy_since is not None:
            self._counters["busy_s"] += now - self._busy_since
            self._busy_since = None

    async def _run_sample(self, job: _Job, j: int, version_start: int) -> None:
        req = job.request
        prompt = {"prompt_token_ids": list(req.prompt_token_ids), "cache_salt": cache_salt(version_start)}
        rid = f"rlvr-e{self.engine_id}-{job.uid}-{j}-{next(self._rids)}"
        self._busy(+1)
        final = None
        try:
            async for out in self._llm.generate(
                prompt, self._vllm_params(req.sampling, j), rid, lora_request=self._lora_request
            ):
                final = out
            if final is None or not final.outputs:
                raise EngineError(f"vLLM returned no output for request {rid}")
            sample = self._to_sample(job, j, final.outputs[0], version_start)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the loop's boundary: stored and re-raised to every caller
            logger.exception("engine %d: request %s failed", self.engine_id, rid)
            self._fail(exc)
            return
        finally:
            self._busy(-1)
        self._file(job, sample)

    def _to_sample(self, job: _Job, j: int, comp: Any, version_start: int) -> Sample:
        req = job.request
        token_ids = [int(t) for t in comp.token_ids]
        if comp.logprobs is None or len(comp.logprobs) != len(token_ids):
            raise EngineError(
                f"vLLM returned {0 if comp.logprobs is None else len(comp.logprobs)} log-probs for "
                f"{len(token_ids)} tokens"
            )
        logprobs = sampled_logprobs(comp.logprobs, token_ids)
        return Sample(
            prompt_id=req.prompt_id,
            sample_index=j,
            prompt_token_ids=list(req.prompt_token_ids),
            completion_token_ids=token_ids,
            completion_text=self._completion_text(req, comp, token_ids),
            logprobs=logprobs,
            finish_reason=finish_reason(comp.finish_reason),
            version_start=version_start,
            version_end=self._version,
            engine_id=self.engine_id,
            metadata=req.metadata,
            is_eval=req.is_eval,
            prompt_text=req.prompt_text,
        )

    def _vllm_detokenizes(self, s: RlvrSamplingParams) -> bool:
        return self._tokenizer is None or bool(s.stop_strings)  # no tokenizer: lean outputs off, or it did not load

    def _completion_text(self, req: PromptRequest, comp: Any, token_ids: list[int]) -> str:
        """vLLM's text where it detokenized, else (--rollout.vllm-lean-outputs, no stop strings, the tokenizer
        loaded at start-up) the tokenizer's decode of the ids with special tokens skipped and spaces left as they
        are, as vLLM's detokenizer leaves them."""
        if self._vllm_detokenizes(req.sampling):
            return comp.text or ""
        return str(self._tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))

    def _file(self, job: _Job, sample: Sample) -> None:
        job.done[sample.sample_index] = sample
        with self._cond:
            self._counters["completed_samples"] += 1
            self._counters["generated_tokens"] += len(sample.completion_token_ids)
            if len(job.done) < job.request.num_samples:
                return
            self._running.pop(job.uid, None)
            self._counters["completed_prompts"] += 1
            self._book.file(job.uid, [job.done[i] for i in range(job.request.num_samples)])

    async def _abort_all(self) -> list[str]:
        jobs = list(self._running.values()) + list(self._queue)
        self._queue.clear()
        self._running.clear()
        tasks = [t for job in jobs for t in job.tasks if not t.done()]
        for t in tasks:
            t.cancel()  # AsyncLLM.generate aborts the vLLM request when its consumer is cancelled
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        with self._cond:
            self._book.abort(job.uid for job in jobs)
        return [job.request.prompt_id for job in jobs]

    async def _score(self, ids: list[int], prompt_len: int) -> list[float]:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY
        )
        prompt = {"prompt_token_ids": ids, "cache_salt": cache_salt(self._version)}
        final = None
        async for out in self._llm.generate(
            prompt, params, f"rlvr-score-e{self.engine_id}-{next(self._rids)}", lora_request=self._lora_request
        ):
            final = out
        if final is None or final.prompt_logprobs is None:
            raise EngineError("vLLM returned no prompt log-probs")
        plp = final.prompt_logprobs
        return [float(plp[i][ids[i]].logprob) for i in range(prompt_len, len(ids))]

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise EngineError(f"engine {self.engine_id} failed: {self._error!r}") from self._error

    def _check_alive(self) -> None:
        """For waits under `_cond`: raise when the engine failed or shut down."""
        self._raise_if_failed()
        if self._stopped:
            raise EngineError(f"engine {self.engine_id} shut down while generating")
