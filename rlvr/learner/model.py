"""Loading the policy (and reference) model for the learner, and the optimizer's LR schedule.

The model is always an HF causal LM loaded from a directory (the built-in tiny model is written to the run
directory by the driver first, so every process loads the same weights).
"""

from __future__ import annotations

import math

import torch

from rlvr.config import ExperimentConfig
from rlvr.learner import attention

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """`auto` = bfloat16 on GPU, float32 on CPU."""
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return _DTYPES[name]


FLASH_DTYPES = (torch.bfloat16, torch.float16)
"""The flash kernels (flash-attn and torch's flash varlen kernel) compute in these dtypes only."""


def resolve_attn_implementation(
    name: str, device: str, packed_attention: str = "auto", dtype: torch.dtype | None = None
) -> str:
    """`auto` = flash_attention_2 on GPU when flash-attn is installed, else torch's varlen flash kernel
    (`torch_varlen`, `rlvr.learner.attention`) on GPU, else sdpa; sdpa whenever learner.attention is `mask`
    (explicit block-diagonal masks) and whenever the model is not fp16/bf16 (`dtype`; the flash kernels raise
    "FlashAttention only support fp16 and bf16 data type" on float32). Explicit names are checked against the
    dtype by config validation, not here."""
    if name != "auto":
        return name
    if dtype is not None and dtype not in FLASH_DTYPES:
        return "sdpa"
    if device.startswith("cuda") and packed_attention != "mask":
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            pass
        from rlvr.learner.attention import NAME, kernel_available

        if kernel_available():
            return NAME
    return "sdpa"


def load_causal_lm(path: str, cfg: ExperimentConfig, device: str, trainable: bool = True) -> torch.nn.Module:
    """An HF causal LM in the configured dtype and attention implementation, dropout off; with
    `learner.lora_rank` > 0 and `trainable`, a peft model whose adapters alone train."""
    from transformers import AutoModelForCausalLM

    dtype = resolve_dtype(cfg.model.dtype, device)
    impl = resolve_attn_implementation(cfg.model.attn_implementation, device, cfg.learner.attention, dtype)
    if impl == attention.NAME:
        attention.register()
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation=impl, trust_remote_code=cfg.model.trust_remote_code
    )
    model.config.use_cache = False
    for m in model.modules():  # RL fine-tuning runs without dropout (open-instruct, TRL)
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    if trainable and cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if trainable and cfg.learner.lora_rank > 0:  # frozen base in its dtype, trainable adapters (rlvr.rollout.lora)
        from rlvr.rollout import lora

        model = lora.wrap(model, lora.LoraSpec.from_config(cfg), path, seed=cfg.seed)
    if not trainable:
        model.requires_grad_(False).eval()
    model = model.to(device)
    if cfg.learner.compile and device.startswith("cuda"):
        compile_for_training(model)
    return model


def compile_for_training(model: torch.nn.Module, backend: str = "inductor") -> int:
    """torch.compile every decoder layer (regional compilation: one graph per layer type, dynamic sequence
    length) and the fused head's elementwise kernels. Returns the number of layers compiled."""
    from rlvr.learner import fused_head
    from rlvr.learner.logprobs import decoder

    layers = getattr(decoder(model), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"learner.compile: {type(model).__name__} has no decoder `layers` list to compile")
    for layer in layers:
        layer.compile(dynamic=True, backend=backend)
    fused_head.compile_kernels(backend)
    return len(layers)


def lr_lambda(step: int, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Multiplier of the peak LR at optimizer step `step`: linear warmup, then constant / linear / cosine."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * progress))
