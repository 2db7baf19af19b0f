"""Zero-variance group filtering and active sampling (DAPO "dynamic sampling", §3.2 of the DAPO paper).

A group whose valid rewards are all equal has advantage 0 for every sample and contributes no gradient;
DAPO drops such groups and keeps sampling prompts until the batch holds B informative groups.

Invariants:
- A group is informative iff it has >= 2 valid (non-None, non-NaN) rewards that are not all equal
  (within `atol`). Groups with < 2 valid rewards are "unscored" zero-variance groups.
- Zero-variance groups are classified as all_correct / all_wrong from per-sample `correct` flags when
  given (else reward > 0 stands for correct); the rest (mixed flags, unscored) count as `other`.
- `ActiveSampler` never loses a group: every group it was fed is, at any time, exactly one of
  kept-and-returned, kept-and-buffered, or filtered (the prompt accounting identity: docs/design.md, Prompt
  accounting).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from rlvr.algorithms.advantages import rewards_to_tensor
from rlvr.types import Group


def informative_groups(
    rewards_NG: torch.Tensor, valid_NG: torch.Tensor | None = None, atol: float = 0.0
) -> torch.Tensor:
    """Bool [num_groups]: True where the group's valid rewards have non-zero spread (> atol)."""
    valid = ~torch.isnan(rewards_NG)
    if valid_NG is not None:
        valid = valid & valid_NG.bool()
    inf = torch.finfo(rewards_NG.dtype).max
    high = torch.where(valid, rewards_NG, torch.full_like(rewards_NG, -inf)).amax(-1)
    low = torch.where(valid, rewards_NG, torch.full_like(rewards_NG, inf)).amin(-1)
    return (valid.sum(-1) >= 2) & ((high - low) > atol)


def classify_groups(
    rewards_NG: torch.Tensor,
    valid_NG: torch.Tensor | None = None,
    correct_NG: torch.Tensor | None = None,
    atol: float = 0.0,
) -> dict[str, torch.Tensor]:
    """Bool masks [num_groups] "kept", "all_correct", "all_wrong", "other" (a partition of the groups)."""
    valid = ~torch.isnan(rewards_NG) if valid_NG is None else valid_NG.bool() & ~torch.isnan(rewards_NG)
    kept = informative_groups(rewards_NG, valid, atol)
    correct = (rewards_NG > 0) if correct_NG is None else correct_NG.bool()
    has_valid = valid.any(-1)
    all_correct = ~kept & has_valid & (correct | ~valid).all(-1)
    all_wrong = ~kept & has_valid & (~correct | ~valid).all(-1)
    other = ~kept & ~all_correct & ~all_wrong
    return {"kept": kept, "all_correct": all_correct, "all_wrong": all_wrong, "other": other}


def _group_tensors(groups: Sequence[Group]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    for group in groups:
        if len(group.rewards) != group.num_samples:
            raise ValueError(
                f"group {group.prompt_id} has {group.num_samples} samples but {len(group.rewards)} rewards"
            )
    rewards_NG, valid_NG = rewards_to_tensor([[r.total for r in g.rewards] for g in groups])
    correct_NG = torch.zeros_like(valid_NG)
    for n, group in enumerate(groups):
        for g, result in enumerate(group.rewards):
            is_correct = result.correct if result.correct is not None else (result.total or 0.0) > 0
            correct_NG[n, g] = bool(is_correct)
    return rewards_NG, valid_NG, correct_NG


def filter_groups(groups: Sequence[Group], atol: float = 0.0) -> tuple[list[Group], dict[str, float]]:
    """Split off zero-variance groups; returns (kept groups, `data/` count metrics)."""
    if not groups:
        return [], {
            "data/groups_kept": 0.0,
            "data/groups_all_correct": 0.0,
            "data/groups_all_wrong": 0.0,
            "data/groups_other_zero_variance": 0.0,
        }
    classes = classify_groups(*_group_tensors(groups), atol=atol)
    kept = [g for g, keep in zip(groups, classes["kept"].tolist()) if keep]
    metrics = {
        "data/groups_kept": float(classes["kept"].sum()),
        "data/groups_all_correct": float(classes["all_correct"].sum()),
        "data/groups_all_wrong": float(classes["all_wrong"].sum()),
        "data/groups_other_zero_variance": float(classes["other"].sum()),
    }
    return kept, metrics


class ActiveSampler:
    """Collects informative groups until `target_groups` (B) are available (DAPO dynamic sampling).

    The caller pulls prompts, generates and scores them, and feeds the groups with `add`; while `need > 0`
    it keeps pulling. `take()` returns exactly B groups; surplus informative groups stay buffered for the next
    batch (so no scored prompt is thrown away). With `filter_zero_variance=False` every group is kept.
    """

    def __init__(self, target_groups: int, filter_zero_variance: bool = True, atol: float = 0.0) -> None:
        if target_groups <= 0:
            raise ValueError(f"target_groups must be positive, got {target_groups}")
        self.target_groups = target_groups
        self.filter_zero_variance = filter_zero_variance
        self.atol = atol
        self._buffer: list[Group] = []
        self._counts = {"pulled": 0, "kept": 0, "all_correct": 0, "all_wrong": 0, "other_zero_variance": 0}

    @property
    def need(self) -> int:
        """How many more informative groups are needed before `take()` can return a full batch."""
        return max(0, self.target_groups - len(self._buffer))

    @property
    def ready(self) -> bool:
        return self.need == 0

    @property
    def num_buffered(self) -> int:
        return len(self._buffer)

    def add(self, groups: Iterable[Group]) -> None:
        """Feed scored groups; informative ones are buffered, zero-variance ones counted and dropped."""
        groups = list(groups)
        self._counts["pulled"] += len(groups)
        if not self.filter_zero_variance:
            self._buffer.extend(groups)
            self._counts["kept"] += len(groups)
            return
        kept, metrics = filter_groups(groups, self.atol)
        self._buffer.extend(kept)
        self._counts["kept"] += len(kept)
        self._counts["all_correct"] += int(metrics["data/groups_all_correct"])
        self._counts["all_wrong"] += int(metrics["data/groups_all_wrong"])
        self._counts["other_zero_variance"] += int(metrics["data/groups_other_zero_variance"])

    def take(self) -> list[Group]:
        """Return exactly `target_groups` groups (raises if not `ready`)."""
        if not self.ready:
            raise ValueError(f"ActiveSampler has {len(self._buffer)} of {self.target_groups} groups; add more first")
        batch, self._buffer = self._buffer[: self.target_groups], self._buffer[self.target_groups :]
        return batch

    def drain(self) -> list[Group]:
        """Return and forget every buffered group (end of training, or a policy change invalidating them)."""
        batch, self._buffer = self._buffer, []
        return batch

    def metrics(self, reset: bool = True) -> dict[str, float]:
        """`data/` counters since the last reset; real_batch_size_ratio = kept / pulled (DAPO)."""
        counts = dict(self._counts)
        out = {f"data/groups_{k}": float(v) for k, v in counts.items()}
        out["data/groups_buffered"] = float(len(self._buffer))
        out["data/real_batch_size_ratio"] = counts["kept"] / counts["pulled"] if counts["pulled"] else 0.0
        if reset:
            self._counts = {k: 0 for k in self._counts}
        return out
