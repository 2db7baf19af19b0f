"""The learner rank: log-probs on packed batches, the policy loss, optimizer steps, weights out, checkpoints.

A plain class (the Ray actor in `rlvr.orchestration.actors` is a thin shell). One call of `train_batch` is
one policy version: `num_epochs` passes over `num_mini_batches` PackedBatches, one optimizer step each.
With more than one optimizer step per rollout batch the old log-probs are recomputed under the weights
before the first update (so the clipped ratio is meaningful); with exactly one step l_old = stopgrad(l)
(ratio 1, docs/design.md, Algorithms) and TIS corrects the engine/learner mismatch against the engine's log-probs.
Every rank must receive the same number of mini- and micro-batches (the packer guarantees it).
"""

from __future__ import annotations

import datetime
import math
import os
import random
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from rlvr import faults
from rlvr.algorithms.correction import CorrectionConfig, importance_weights
from rlvr.algorithms.losses import LossConfig, policy_loss, run_max_completion_length
from rlvr.config import ExperimentConfig
from rlvr.learner.backends import DeepSpeedBackend, TorchBackend, weights_only_load
from rlvr.learner.logprobs import head_chunks, packed_logprobs
from rlvr.learner.model import load_causal_lm
from rlvr.rollout import lora
from rlvr.telemetry.logs import get_logger
from rlvr.telemetry.reduce import MetricReducer, ReducedMetrics
from rlvr.types import MicroBatch, PackedBatch

logger = get_logger(__name__)

STEP_SHARES = ("loss/total", "loss/policy")
"""Each micro-batch's value is its share of its optimizer step's loss (global normalisers): summed over micro-batches
and ranks they give the step's loss; recorded divided by the number of optimizer steps of the call, so that the
result is the mean over those steps of the true step loss."""


def loss_config(cfg: ExperimentConfig) -> LossConfig:
    a = cfg.algorithm
    return LossConfig(
        loss=a.loss,
        aggregation=a.aggregation,
        clip_eps_low=a.clip_eps_low,
        clip_eps_high=a.clip_eps_high,
        clip_delta=a.clip_delta,
        cispo_eps_max=a.cispo_eps_max,
        sapo_tau_pos=a.sapo_tau_pos,
        sapo_tau_neg=a.sapo_tau_neg,
        kl_beta=a.kl_beta,
        kl_estimator=a.kl_estimator,
        entropy_coef=a.entropy_coef,
        max_completion_length=run_max_completion_length(cfg),  # episodes: their policy tokens over all turns
    )


class LearnerWorker:
    """One data-parallel learner rank."""

    def __init__(
        self,
        cfg: ExperimentConfig,
        model_path: str,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        device: str = "cpu",
        num_threads: int | None = None,
    ) -> None:
        if num_threads:
            torch.set_num_threads(num_threads)
        self.cfg, self.rank, self.world_size, self.device = cfg, rank, world_size, device
        torch.manual_seed(cfg.seed + rank)
        if not dist.is_initialized() and (world_size > 1 or cfg.learner.backend == "deepspeed"):
            os.environ.update(
                MASTER_ADDR=master_addr,
                MASTER_PORT=str(master_port),
                RANK=str(rank),
                WORLD_SIZE=str(world_size),
                LOCAL_RANK="0",
            )
            dist.init_process_group(
                "nccl" if device.startswith("cuda") else "gloo",
                rank=rank,
                world_size=world_size,
                timeout=datetime.timedelta(seconds=600),
            )
        model = load_causal_lm(model_path, cfg, device)
        self.backend: TorchBackend | DeepSpeedBackend
        if cfg.learner.backend == "deepspeed":
            self.backend = DeepSpeedBackend(model, cfg, world_size, device)
        else:
            self.backend = TorchBackend(model, cfg, world_size)
        self.ref_model = load_causal_lm(model_path, cfg, device, trainable=False) if cfg.algorithm.kl_beta > 0 else None
        self.loss_cfg = loss_config(cfg)
        self.corr_cfg = CorrectionConfig(cfg.algorithm.tis_mode, cfg.algorithm.tis_cap, cfg.algorithm.tis_min)
        self.version = 0
        self.num_skipped_steps = 0
        self.consecutive_skips = 0
        self.lora = lora.LoraSpec.from_config(cfg)
        self.model_path = model_path
        self._adapter: lora.AdapterParams | None = None  # resolved at the first sync (named_weights)

    @property
    def model(self) -> torch.nn.Module:
        return self.backend.model

    def _attention(self) -> str:
        a = self.cfg.learner.attention
        return "varlen" if a == "auto" else a

    def _head_calls(self, model: torch.nn.Module, mb: MicroBatch) -> int | None:
        """ZeRO-3 with several ranks: each head call gathers its weight (a collective), so every rank calls the head
        as often as the rank with the longest rows (one all-reduce per micro-batch; ranks have equal micro-batch
        counts). None elsewhere (the fused head is never partitioned: it makes no module call)."""
        if self.cfg.learner.backend != "deepspeed" or self.cfg.learner.zero_stage != 3 or self.world_size < 2:
            return None
        n = torch.tensor([head_chunks(mb.input_ids.shape[1] - 1, self.cfg.learner.logprob_chunk_size)])
        n = n.to(self.device)
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
        return int(n.item())

    def _logprobs(
        self, model: torch.nn.Module, mb: MicroBatch, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return packed_logprobs(
            model,
            mb.input_ids.to(self.device),
            mb.position_ids.to(self.device),
            temperature=self.cfg.generation.temperature,
            attention=self._attention(),
            chunk_size=self.cfg.learner.logprob_chunk_size,
            return_entropy=with_entropy,
            entropy_requires_grad=self.cfg.algorithm.entropy_coef != 0,
            fused=self.cfg.learner.fused_head,
            head_calls=self._head_calls(model, mb),
        )

    @torch.no_grad()
    def _recompute(self, model: torch.nn.Module, batches: list[PackedBatch]) -> list[list[torch.Tensor]]:
        model.eval()
        out = [[self._logprobs(model, mb, False)[0] for mb in pb.micro_batches] for pb in batches]
        model.train()
        return out

    def train_batch(self, batches: list[PackedBatch]) -> ReducedMetrics:
        """Train on one rollout batch (one PackedBatch per mini-batch); returns this rank's `loss/`, `learner/`
        metrics, reduced by type over micro- and mini-batches (`rlvr.telemetry.reduce`: merge the ranks' results
        with `reduce_all`). `loss/total` is the optimizer step's loss (the mean over steps when there are several),
        `loss/num_tokens` the loss tokens of the batch; the other `loss/` values are token-weighted means."""
        a = self.cfg.algorithm
        num_steps = a.num_epochs * len(batches)
        multi_step = num_steps > 1
        old = self._recompute(self.model, batches) if multi_step else None
        ref = self._recompute(self.ref_model, batches) if self.ref_model is not None else None
        metrics = MetricReducer()
        self.model.train()
        for _epoch in range(a.num_epochs):
            for bi, pb in enumerate(batches):
                finite = True
                for mi, mb in enumerate(pb.micro_batches):
                    lp, ent = self._logprobs(self.model, mb, with_entropy=True)
                    mask = mb.loss_mask.to(self.device)
                    l_old = old[bi][mi] if old is not None else lp.detach()
                    is_w, m_corr = importance_weights(
                        l_old,
                        mb.engine_logprobs.to(self.device).to(lp.dtype),
                        mask,
                        self.corr_cfg,
                        mb.sample_ids.to(self.device),
                    )
                    loss, m_loss = policy_loss(
                        lp,
                        l_old,
                        mb.advantages.to(self.device).to(lp.dtype),
                        mask,
                        self.loss_cfg,
                        global_num_loss_tokens=pb.global_num_loss_tokens,
                        global_num_samples=pb.global_num_samples,
                        sample_ids=mb.sample_ids.to(self.device),
                        ref_logprobs=ref[bi][mi] if ref else None,
                        is_weights=is_w,
                        entropy=ent,
                    )
                    # a micro-batch without loss tokens (a dummy that evens out ranks) still needs a graph:
                    # every rank must run backward so that ZeRO's gradient reductions line up
                    loss = loss + 0.0 * lp.sum()
                    if faults.due("nan_loss", self.version + 1):
                        loss = loss * float("nan")  # fault injection (tests of the numerical guard)
                    if not torch.isfinite(loss):
                        # skip the step (every rank, via `_optimizer_step`'s MIN all-reduce), but go on with every
                        # micro-batch: the other ranks' remaining gathers, head-call all-reduces and gradient
                        # reductions (ZeRO) are collectives that need this rank too. A zero-weight loss keeps the graph
                        finite = False
                        loss = 0.0 * torch.nan_to_num(lp, nan=0.0, posinf=0.0, neginf=0.0).sum()
                    self.backend.backward(loss, is_last=mi == len(pb.micro_batches) - 1)
                    if finite and mask.any():
                        self._record(
                            metrics,
                            {**m_loss, **m_corr},
                            num_tokens=float(mask.sum()),
                            num_steps=num_steps,
                            num_epochs=a.num_epochs,
                        )
                grad_norm, ok = self._optimizer_step(finite)
                metrics.add("learner/grad_norm", grad_norm if math.isfinite(grad_norm) else 0.0, "mean")
        self.version += 1
        for key, value in {
            "learner/lr": self.backend.lr(),
            "learner/skipped_steps": float(self.num_skipped_steps),
            "learner/consecutive_skips": float(self.consecutive_skips),
            "learner/version": float(self.version),
        }.items():
            metrics.add(key, value, "max")  # equal on every rank
        return ReducedMetrics(metrics)

    @staticmethod
    def _record(
        metrics: MetricReducer, values: dict[str, float], num_tokens: float, num_steps: int, num_epochs: int
    ) -> None:
        """One micro-batch's loss/correction metrics: step-loss shares and token counts summed, `_max`/`_min`
        extremes, the rest (per-token means over the micro-batch's loss tokens) token-weighted means."""
        for key, value in values.items():
            if key in STEP_SHARES:
                metrics.add(key, value / num_steps, "sum")
            elif key == "loss/num_tokens":
                metrics.add(key, value / num_epochs, "sum")
            elif key.endswith("_max") or key.endswith("_min"):
                metrics.add(key, value, "max" if key.endswith("_max") else "min")
            else:
                metrics.add(key, value, "mean", weight=num_tokens)

    def _optimizer_step(self, finite: bool) -> tuple[float, bool]:
        # every rank must agree on skipping, or the collectives of the others would hang
        flag = torch.tensor([1.0 if finite else 0.0], device=self.device)  # NCCL groups take CUDA tensors only
        if self.world_size > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if flag.item() < 1:
            for p in self.model.parameters():
                p.grad = None
            if isinstance(self.backend, TorchBackend):
                self.backend.skip_step()
            ok, grad_norm = False, float("nan")
        else:
            grad_norm, ok = self.backend.step()
        if ok:
            self.consecutive_skips = 0
        else:
            self.num_skipped_steps += 1
            self.consecutive_skips += 1
            logger.warning("non-finite loss or gradient: optimizer step skipped (%d in a row)", self.consecutive_skips)
        return grad_norm, ok

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, tensor) in one fixed order; ZeRO-3 gathers (in buckets) happen on every rank: iterate it to
        the end on all ranks. Rank 0, the sender, gets tensors it may keep; the others only drain it.

        With LoRA only the adapter goes out, under PEFT's on-disk names, in the base weights' dtype (what the
        engines compute the adapter in; bf16 halves the bytes of fp32 adapters), as an `lora.AdapterSnapshot` of
        the parameters resolved once (no state-dict rebuild per sync): iterated, one device-to-host copy for the
        whole adapter; the CUDA IPC sender reads the live parameters instead (`AdapterSnapshot.live`)."""
        if self.lora is None:
            return self.backend.named_weights(copy=self.rank == 0)
        if self._adapter is None:
            self._adapter = lora.AdapterParams(self.model)
        return self._adapter.snapshot()

    @torch.no_grad()
    def score(self, prompt_token_ids: list[int], completion_token_ids: list[int]) -> list[float]:
        """Teacher-forced log-probs of the completion tokens (for engine/learner agreement checks).

        Under ZeRO-3 the parameter gather is a collective: call it on every rank."""
        ids = torch.tensor([prompt_token_ids + completion_token_ids])
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        with self.backend.gathered() as model:
            model.eval()
            lp, _ = packed_logprobs(
                model,
                ids.to(self.device),
                pos.to(self.device),
                temperature=self.cfg.generation.temperature,
                attention="varlen",
            )
            model.train()
        return lp[0, len(prompt_token_ids) :].float().tolist()

    # ---------------------------------------------------------------- checkpoints
    def save(self, path: str, hf_dir: str | None, tokenizer_dir: str | None) -> None:
        """Optimizer/scheduler/RNG state (every rank) and, on rank 0, the HF model (+ tokenizer); with LoRA the
        adapter in PEFT format (adapter_config.json, adapter_model.safetensors) and the base model's config.json."""
        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)
        self.backend.save(p)
        version, internal, gauss = random.getstate()  # plain ints, stored as lists: loadable with weights_only
        torch.save(
            {
                "torch": torch.get_rng_state(),
                "python": [version, list(internal), gauss],
                "version": self.version,
                "skipped": self.num_skipped_steps,
            },
            p / f"rng_rank{self.rank}.pt",
        )
        full = self.backend.full_state_dict()  # ZeRO-3: gathered module by module onto rank 0's CPU
        if self.rank == 0 and hf_dir and self.lora is not None:  # the adapter (PEFT format) + the base's config
            Path(hf_dir).mkdir(parents=True, exist_ok=True)
            lora.write_adapter_files(
                lora.adapter_tensors(self.model).items(),
                lora.adapter_config_dict(self.lora, self.model_path),
                Path(hf_dir),
            )
            self.model.get_base_model().config.save_pretrained(hf_dir)
        elif self.rank == 0 and hf_dir:
            self.backend.model.save_pretrained(hf_dir, safe_serialization=True, state_dict=full)
        if self.rank == 0 and hf_dir:
            if tokenizer_dir:
                from transformers import AutoTokenizer, GenerationConfig

                tok = AutoTokenizer.from_pretrained(tokenizer_dir)
                tok.save_pretrained(hf_dir)
                gen = GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
                gen.save_pretrained(hf_dir)

    def load(self, path: str, hf_dir: str) -> None:
        """Restore weights from `hf_dir` and optimizer/scheduler/RNG state from `path`."""
        from safetensors.torch import load_file

        p = Path(path)
        if self.lora is not None:
            _, tensors = lora.read_adapter_dir(hf_dir)
            with self.backend.gathered(modify=True) as model:
                lora.load_adapter_tensors(model, tensors)
            self._load_state(p)
            return
        state = {}
        for f in sorted(Path(hf_dir).glob("*.safetensors")):
            try:
                state.update(load_file(str(f)))
            except Exception as e:  # trust boundary: safetensors raises its own error types on a malformed file
                raise ValueError(f"{f}: unreadable safetensors file: {e}") from None
        with self.backend.gathered(modify=True) as model:
            missing, unexpected = model.load_state_dict(state, strict=False)
            missing = [m for m in missing if not m.endswith("lm_head.weight")]
            if missing or unexpected:
                raise ValueError(
                    f"checkpoint {hf_dir} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
                )
        self._load_state(p)

    def _load_state(self, p: Path) -> None:
        """Optimizer/scheduler (backend) and RNG/counters of this rank from `p` (weights-only loads)."""
        self.backend.load(p)
        rng = weights_only_load(p / f"rng_rank{self.rank}.pt")
        try:
            torch.set_rng_state(rng["torch"])
            version, internal, gauss = rng["python"]
            random.setstate((int(version), tuple(int(x) for x in internal), gauss))
            self.version, self.num_skipped_steps = int(rng["version"]), int(rng["skipped"])
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"{p / f'rng_rank{self.rank}.pt'}: not an rlvr RNG state ({e})") from e

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
