"""An episode's reward and how its record is recognised (docs/multi-turn.md): the collector, the feeder's groups
and the eval runner score an episode from its environment's reward terms, never with the verifier pool.

Invariants:
- An episode's `RewardResult` is a function of its reward terms, end reason and row's verifier alone (`episode_reward`):
  the same record always gets the same reward, whether the `EpisodeRunner` scores it as its group finishes or a
  later reader re-scores the record (`sample_episode_reward`).
- A sample is an episode's record only by the private marker `episode_to_sample` sets (`is_episode`); no data
  column can make a single-turn sample look like one.
"""

from __future__ import annotations

from typing import Any

from rlvr.algorithms.policy_tokens import EPISODE_MARKER
from rlvr.types import RewardResult, Sample

UNSCORED_END_REASONS = ("abort",)
"""End reasons that are no act of the policy: the engine aborted the turn more often than the runner restarts an
episode. Such an episode is unscored (total None: no advantage, left out of its group's mean and std) rather than
scored 0, which would push down tokens for a failure they did not cause. `env_error` is not among them on
purpose: text that makes an environment raise must not be a refuge from a low score, so it scores 0 like a
wrong answer."""


def episode_reward(terms: dict[str, float], primary: str | None, end_reason: str | None = None) -> RewardResult:
    """An episode's reward: scores = the environment's reward terms, total = their sum (each term weighs 1;
    0.0 when the episode earned none, e.g. it never answered), correct = the primary (verifier) term at its
    maximum 1.0. An episode that ended for one of `UNSCORED_END_REASONS` is unscored (status "error")."""
    if end_reason in UNSCORED_END_REASONS:
        return RewardResult(scores={}, total=None, correct=None, status="error", error=f"episode ended: {end_reason}")
    key = primary if primary in terms else next(iter(terms), None)
    return RewardResult(
        scores=dict(terms),
        total=float(sum(terms.values())),
        correct=bool(key is not None and terms[key] >= 1.0),
    )


def is_episode(sample: Sample) -> bool:
    """Whether a sample is an episode's record: the private marker only `episode_to_sample` sets (data columns
    named like an episode's keys, e.g. a reused samples.jsonl, are rejected at load and never decide this)."""
    return sample.metadata.get(EPISODE_MARKER) is True


def sample_episode_reward(sample: Sample) -> RewardResult:
    """`episode_reward` of an episode's record (its terms and its row's verifier are in the metadata)."""
    meta = sample.metadata
    return episode_reward(dict(meta["reward_terms"]), primary_verifier(meta), meta.get("end_reason"))


def primary_verifier(metadata: dict[str, Any]) -> str | None:
    """The row's verifier (the first of a list), whose reward term decides `correct`; None when it names none."""
    v = metadata.get("verifier")
    return v[0] if isinstance(v, list) and v else v if isinstance(v, str) else None
