"""The GRPO algorithm family as pure torch: advantages, filtering, shaping, losses, KL, corrections, packing.

Invariant: nothing in this package imports ray, vllm, deepspeed, wandb or torch.distributed. Functions take
tensors (or records from `rlvr.types`) plus a small per-function config and return values or
`(loss, metrics)`; every number that depends on other ranks (global loss-token count, global sample count)
arrives as an argument, so micro-batches and data-parallel ranks compose exactly.
"""
