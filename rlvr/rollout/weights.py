"""Copying HF-named tensors into a live model in place (the engine side of a weight update).

Invariants: tensors are copied one at a time as the iterable yields them (no second copy of the model is
held); every name must exist in the model's state dict with the same shape, a subset of names is allowed;
tied weights appear in the state dict under each of their names and share storage, so either name works.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


@torch.no_grad()
def copy_named_tensors(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy each (name, tensor) into the model's parameter or buffer of that name; return how many.

    Raises ValueError on an unknown name or a shape mismatch (tensors copied before it stay copied).
    Dtype and device are converted by `copy_`.
    """
    targets = model.state_dict(keep_vars=True)
    num_copied = 0
    for name, tensor in named_tensors:
        target = targets.get(name)
        if target is None:
            raise ValueError(f"unknown weight {name!r} (expected HF parameter names such as {next(iter(targets))!r})")
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(f"weight {name!r}: shape {tuple(tensor.shape)}, model has {tuple(target.shape)}")
        target.data.copy_(tensor)
        num_copied += 1
    return num_copied
