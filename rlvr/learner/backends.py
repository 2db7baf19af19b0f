"""Optimizer backends for the learner: plain torch (summed all-reduce) and DeepSpeed (ZeRO 0/1/2/3).

Both expose the same small surface so that the train step is written once:
`backward(loss, is_last)` accumulates gradients of one micro-batch, `step()` all-reduces / reduces them,
clips, applies the optimizer and scheduler and returns the pre-clip gradient norm (NaN/inf are reported,
and the update is skipped, never applied).

Normalisation: rlvr's losses are already divided by the step's GLOBAL normaliser (docs/design.md, Algorithms:
aggregation), so the gradients of all micro-batches and all ranks must be SUMMED. The torch backend all-reduces with SUM;
DeepSpeed averages over data-parallel ranks and may divide by its accumulation steps, so the loss is
multiplied by the world size and passed with `scale_wrt_gas=False`.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from rlvr.config import ExperimentConfig
from rlvr.learner.model import lr_lambda


def total_optimizer_steps(cfg: ExperimentConfig) -> int:
    return cfg.num_steps * cfg.algorithm.num_mini_batches * cfg.algorithm.num_epochs


def adamw(model: torch.nn.Module, cfg: ExperimentConfig) -> torch.optim.AdamW:
    """AdamW over the parameters that train (all of them, or only the LoRA adapters: frozen ones get no optimizer
    state); on CUDA the fused kernel (one launch per step instead of foreach ops that allocate parameter-sized
    temporaries)."""
    return _adamw_over([p for p in model.parameters() if p.requires_grad], cfg)


def _adamw_over(params: list, cfg: ExperimentConfig) -> torch.optim.AdamW:
    lc = cfg.learner
    on_cuda = params[0].is_cuda if params else False
    return torch.optim.AdamW(
        params,
        lr=lc.lr,
        betas=(lc.adam_beta1, lc.adam_beta2),
        weight_decay=lc.weight_decay,
        fused=True if on_cuda else None,
    )


class TorchBackend:
    """AdamW + LambdaLR with gradients summed over ranks by an explicit all-reduce.

    Low-precision training (`learner.fp32_master_weights`, on by default): where trainable weights are bfloat16 or
    float16, AdamW owns float32 copies of them. Each micro-batch's gradients are added into the copies' float32
    gradients (so accumulation over micro-batches does not round either), the all-reduce, clipping and the update
    run in float32, and the result is copied back into the model's weights. Without the copies an update smaller
    than half a weight's bfloat16 step (about 0.4% of its size) is rounded away, which slows learning measurably
    (docs/design.md, Algorithms: Precision). The copies are saved with the optimizer state, so resume is exact."""

    def __init__(self, model: torch.nn.Module, cfg: ExperimentConfig, world_size: int) -> None:
        lc = cfg.learner
        self.model, self.cfg, self.world_size = model, cfg, world_size
        self.params: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
        low = any(p.dtype in (torch.bfloat16, torch.float16) for p in self.params)
        self.master: list[torch.Tensor] | None = None
        if lc.fp32_master_weights and low:
            self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.optimizer = _adamw_over(self.master if self.master is not None else self.params, cfg)
        total = total_optimizer_steps(cfg)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_lambda(s, lc.warmup_steps, total, lc.lr_schedule)
        )

    def backward(self, loss: torch.Tensor, is_last: bool) -> None:
        loss.backward()
        if self.master is None:
            return
        for p, m in zip(self.params, self.master, strict=True):  # into float32 at once: no low-precision sums
            if p.grad is not None:
                if m.grad is None:
                    m.grad = p.grad.float()
                else:
                    m.grad.add_(p.grad)
                p.grad = None

    def step(self) -> tuple[float, bool]:
        params = self.master if self.master is not None else self.params
        if self.world_size > 1:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        max_norm = self.cfg.learner.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
        grad_norm = float(norm)
        ok = math.isfinite(grad_norm)
        if ok:
            self.optimizer.step()
            self._copy_master_to_model()
        self.scheduler.step()
        self.zero_grad()
        return grad_norm, ok

    def skip_step(self) -> None:
        """A step every rank agreed to skip: gradients dropped, the schedule still advances."""
        self.zero_grad()
        self.scheduler.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def _copy_master_to_model(self) -> None:
        if self.master is not None:
            torch._foreach_copy_(self.params, self.master)

    @torch.no_grad()
    def _copy_model_to_master(self) -> None:
        if self.master is not None:
            torch._foreach_copy_(self.master, self.params)

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    @contextlib.contextmanager
    def gathered(self, modify: bool = False) -> Iterator[torch.nn.Module]:
        yield self.model
        if modify:  # weights set from outside (a checkpoint): the float32 copies follow
            self._copy_model_to_master()

    def named_weights(self, copy: bool) -> Iterator[tuple[str, torch.Tensor]]:
        return _detached(self.model)

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        return None  # the module's own state_dict is already whole

    def save(self, path: Path) -> None:
        state: dict = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        if self.master is not None:
            state["master"] = [m.detach() for m in self.master]
        torch.save(state, path / "optimizer.pt")

    def load(self, path: Path) -> None:
        state = weights_only_load(path / "optimizer.pt")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.master is None:
            return
        saved = state.get("master")
        if saved is None:  # a checkpoint written without the copies: start them from the loaded weights
            self._copy_model_to_master()
            return
        where = f"{path / 'optimizer.pt'}: 'master'"
        if not isinstance(saved, list) or len(saved) != len(self.master):
            found = f"{len(saved)} entries" if isinstance(saved, list) else type(saved).__name__
            raise ValueError(f"{where} holds {found}, the model trains {len(self.master)} weights")
        for i, (m, t) in enumerate(zip(self.master, saved, strict=True)):
            if not isinstance(t, torch.Tensor) or t.shape != m.shape:
                raise ValueError(f"{where} entry {i} does not match the model's weight of shape {tuple(m.shape)}")
        with torch.no_grad():
            torch._foreach_copy_(self.master, [t.to(m.device, torch.float32) for m, t in zip(self.master, saved)])
        self._copy_master_to_model()


class DeepSpeedBackend:
    """DeepSpeed engine; ZeRO-3 parameters are gathered for weight sync and saving."""

    def __init__(self, model: torch.nn.Module, cfg: ExperimentConfig, world_size: int, device: str) -> None:
        if device == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # inside the actor process, before deepspeed loads
        import deepspeed

        lc = cfg.learner
        self.cfg, self.world_size = cfg, world_size
        zero: dict = {"stage": lc.zero_stage}
        if lc.offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu"}
        if lc.offload_params:
            zero["offload_param"] = {"device": "cpu"}
        ds_config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "zero_optimization": zero,
            "gradient_clipping": lc.max_grad_norm,
            "bf16": {"enabled": next(model.parameters()).dtype == torch.bfloat16},
            "wall_clock_breakdown": False,
            "steps_per_print": 10**9,
        }
        optimizer = adamw(model, cfg)
        total = total_optimizer_steps(cfg)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: lr_lambda(s, lc.warmup_steps, total, lc.lr_schedule)
        )
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
        )
        self.model = self.engine.module
        self._deepspeed = deepspeed

    def backward(self, loss: torch.Tensor, is_last: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(is_last)
        self.engine.backward(loss * self.world_size, scale_wrt_gas=False)

    def step(self) -> tuple[float, bool]:
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        grad_norm = float(norm) if norm is not None else 0.0
        skipped = bool(getattr(self.engine, "skipped_steps", 0) and not math.isfinite(grad_norm))
        return grad_norm, math.isfinite(grad_norm) and not skipped

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    @contextlib.contextmanager
    def gathered(self, modify: bool = False) -> Iterator[torch.nn.Module]:
        """The whole model, gathered on every rank under ZeRO-3 (a collective: enter it on all ranks). With
        `modify`, rank 0's values are re-partitioned on exit; without it changes made inside are discarded."""
        if self.cfg.learner.zero_stage == 3:
            with self._deepspeed.zero.GatheredParameters(
                list(self.model.parameters()), modifier_rank=0 if modify else None
            ):
                yield self.model
        else:
            yield self.model

    def named_weights(self, copy: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) in `named_parameters` order. Under ZeRO-3 parameters are gathered in buckets of
        `learner.zero3_gather_mb` (collectives: iterate on every rank, to the end), never the whole model at
        once, so a model much larger than one GPU's free memory can still be synced; each bucket's gather has
        completed on all ranks before rank 0 hands its tensors to the sender (docs/design.md, Weight transport).
        With `copy` each
        tensor is cloned inside its gather, so what a sender keeps does not depend on how DeepSpeed frees the
        gathered storage when the bucket closes (DeepSpeed's `_zero3_consolidated_16bit_state_dict` copies
        layer by layer the same way)."""
        if self.cfg.learner.zero_stage != 3:
            yield from _detached(self.model)
            return
        named = list(self.model.named_parameters())
        limit = max(1, int(self.cfg.learner.zero3_gather_mb * 2**20))
        for bucket in _gather_buckets(named, limit):
            with self._deepspeed.zero.GatheredParameters([p for _, p in bucket], modifier_rank=None):
                for name, p in bucket:
                    yield name, (p.detach().clone() if copy else p.detach())

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """ZeRO-3: the whole state dict on rank 0's CPU, gathered one module at a time (all ranks must call);
        None otherwise (the module's own state_dict is whole)."""
        if self.cfg.learner.zero_stage != 3:
            return None
        return self.engine._zero3_consolidated_16bit_state_dict()  # private, but what accelerate uses

    def save(self, path: Path) -> None:
        # with LoRA the frozen base is not state (it is the model directory): only the adapters are saved
        self.engine.save_checkpoint(
            str(path / "deepspeed"),
            tag="state",
            save_latest=False,
            exclude_frozen_parameters=self.cfg.learner.lora_rank > 0,
        )

    def load(self, path: Path) -> None:
        # DeepSpeed 0.19.8's TorchCheckpointEngine.load calls torch.load(weights_only=False): every file it reads
        # (model states, ZeRO optimizer partitions) goes through the weights-only loader instead
        self.engine.checkpoint_engine.load = weights_only_load
        self.engine.load_checkpoint(
            str(path / "deepspeed"), tag="state", load_module_strict=self.cfg.learner.lora_rank == 0
        )


SAFE_TORCH_GLOBALS = (
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
)
"""Classes DeepSpeed pickles into its optimizer-state files (plain records: an enum, a namedtuple, loss-scale
settings), allowed beside torch's weights-only set. Residual risk, accepted: a crafted file can construct
them with values of its choosing, and their constructors (Enum lookup, namedtuple, LossScaler.__init__) only
store values; it cannot import or call anything else."""


def _safe_globals() -> list:
    """The classes of `SAFE_TORCH_GLOBALS` that can be imported here (DeepSpeed's only where it is installed)."""
    import importlib

    found = []
    for name in SAFE_TORCH_GLOBALS:
        module, _, attr = name.rpartition(".")
        try:
            found.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):
            continue
    return found


def weights_only_load(path: str | Path, map_location: str | torch.device | None = "cpu") -> dict:
    """torch.load of checkpoint state as data: tensors, containers, numbers, strings and `SAFE_TORCH_GLOBALS`;
    a file that names anything else is refused with ValueError (nothing in it is run)."""
    with torch.serialization.safe_globals(_safe_globals()):
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError(f"{path}: refused, it holds more than tensors and plain data ({first})") from None


def _detached(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of whole (not partitioned) parameters, detached from autograd."""
    for name, p in model.named_parameters():
        yield name, p.detach()


def _gather_buckets(
    named: list[tuple[str, torch.nn.Parameter]], limit: int
) -> list[list[tuple[str, torch.nn.Parameter]]]:
    """Consecutive parameters whose full sizes (ZeRO-3 `ds_numel`, else numel) add up to at most `limit` bytes;
    a larger parameter gets a bucket of its own."""
    buckets: list[list[tuple[str, torch.nn.Parameter]]] = []
    size = 0
    for name, p in named:
        nbytes = int(getattr(p, "ds_numel", p.numel())) * p.element_size()
        if not buckets or size + nbytes > limit:
            buckets.append([])
            size = 0
        buckets[-1].append((name, p))
        size += nbytes
    return buckets
