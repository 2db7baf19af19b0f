"""Shaping and format rewards: think/answer format, tag count, reasoning steps, length, repetition.

Sources: open-r1's `rewards.py` (format, tag_count, reasoning_steps, len (Kimi 1.5), cosine_scaled (Yeo et
al. 2025, "Demystifying Long CoT"), repetition_penalty) and DAPO (soft overlong punishment, Yu et al. 2025).

Invariants:
- Pure functions of (text, metadata, params); no ground truth needed except where a function needs to know
  whether the answer is correct (`length`, `cosine_length`): they call the registered verifier named by their
  `verifier` param ("none" = treat every completion as correct).
- Length = `len(metadata["completion_token_ids"])`, or the number of whitespace-separated words when the
  scorer was given no token ids (e.g. `rlvr reward` on raw text).
- Deviation from Kimi 1.5: its length reward normalises by the min/max length *within the group*; a
  per-sample function cannot see the group, so `length` uses `metadata["group_min_tokens"]` /
  `["group_max_tokens"]` when the caller provides them and the `min_tokens`/`max_tokens` params otherwise.
"""

from __future__ import annotations

import math
import re

from rlvr.rewards.registration import lookup, register_reward


def num_completion_tokens(completion_text: str, metadata: dict) -> int:
    """The completion's token count (whitespace words when the token ids are not available)."""
    token_ids = metadata.get("completion_token_ids")
    if token_ids is not None:
        return len(token_ids)
    return len(completion_text.split())


def _is_correct(completion_text: str, metadata: dict, verifier: str) -> bool:
    if verifier == "none":
        return True
    spec = lookup(verifier)  # registered by rlvr.rewards.builtin, which the package imports (via registry)
    score = spec.fn(completion_text, metadata)
    return score is not None and score >= spec.max_score


_STRICT_FORMAT = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", re.DOTALL)


@register_reward("format_think_answer")
def format_think_answer(completion_text: str, metadata: dict) -> float:
    """1.0 for exactly `<think>...</think><answer>...</answer>` (whitespace between), each tag once; else 0."""
    if any(completion_text.count(tag) != 1 for tag in ("<think>", "</think>", "<answer>", "</answer>")):
        return 0.0
    return 1.0 if _STRICT_FORMAT.fullmatch(completion_text) else 0.0


@register_reward("format_partial")
def format_partial(completion_text: str, metadata: dict) -> float:
    """Incremental credit, 0.25 per step: opens with <think>; closes it; then opens <answer>; ends with </answer>.

    Each step counts only if the previous ones hold and its tag appears exactly once, so the credit grows
    as the model learns the format from the start of the completion onwards.
    """
    text = completion_text.strip()
    score = 0.0
    if text.count("<think>") != 1 or not text.startswith("<think>"):
        return score
    score += 0.25
    close = text.find("</think>")
    if text.count("</think>") != 1 or close < 0:
        return score
    score += 0.25
    after = text[close + len("</think>") :].lstrip()
    if text.count("<answer>") != 1 or not after.startswith("<answer>"):
        return score
    score += 0.25
    if text.count("</answer>") == 1 and after.endswith("</answer>"):
        score += 0.25
    return score


@register_reward("tag_count")
def tag_count(completion_text: str, metadata: dict) -> float:
    """open-r1's tag count: 0.25 for each of "<think>\\n", "\\n</think>\\n", "\\n<answer>\\n", "\\n</answer>" seen once."""
    tags = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")
    return sum(0.25 for tag in tags if completion_text.count(tag) == 1)


_STEP_RE = re.compile(r"(Step \d+:|^\d+\.|\n-|\n\*|First,|Second,|Next,|Finally,)", re.MULTILINE)


@register_reward("reasoning_steps")
def reasoning_steps(completion_text: str, metadata: dict, num_steps: int = 3) -> float:
    """open-r1: min(1, number of step markers / num_steps); markers are "Step n:", "1.", bullets, "First," ..."""
    return min(1.0, len(_STEP_RE.findall(completion_text)) / max(1, num_steps))


@register_reward("length")
def length_reward(
    completion_text: str, metadata: dict, min_tokens: int = 0, max_tokens: int = 4096, verifier: str = "math"
) -> float:
    """Kimi 1.5 length reward: lambda = 0.5 - (len - min) / (max - min); correct -> lambda, wrong -> min(0, lambda)."""
    lo = metadata.get("group_min_tokens", min_tokens)
    hi = metadata.get("group_max_tokens", max_tokens)
    if hi <= lo:
        return 0.0
    n = num_completion_tokens(completion_text, metadata)
    lam = 0.5 - (min(max(n, lo), hi) - lo) / (hi - lo)
    return lam if _is_correct(completion_text, metadata, verifier) else min(0.0, lam)


@register_reward("cosine_length")
def cosine_length(
    completion_text: str,
    metadata: dict,
    max_tokens: int = 1000,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
    min_value_wrong: float = -1.0,
    max_value_wrong: float = -0.5,
    verifier: str = "math",
) -> float:
    """Cosine-scaled length (open-r1 / Yeo et al.): short correct answers earn most, short wrong ones lose most."""
    progress = min(num_completion_tokens(completion_text, metadata), max_tokens) / max(1, max_tokens)
    cosine = math.cos(progress * math.pi)
    if _is_correct(completion_text, metadata, verifier):
        lo, hi = min_value_correct, max_value_correct
    else:  # swapped on purpose: the longer a wrong answer, the smaller its penalty
        lo, hi = max_value_wrong, min_value_wrong
    return lo + 0.5 * (hi - lo) * (1.0 + cosine)


def soft_overlong_penalty(length: float, max_tokens: int, cache_tokens: int) -> float:
    """DAPO soft overlong punishment (§3.4, eq. 13) of one completion length: 0 up to max - cache tokens, then
    linear down to -1 at max, -1 beyond. The one implementation: the `soft_overlong` reward function and the
    trainer's `algorithm.overlong_buffer` shaping (`rlvr.algorithms.shaping.overlong_penalty`) both call it."""
    expected = max_tokens - cache_tokens
    if length <= expected:
        return 0.0
    if length <= max_tokens:
        return (expected - length) / max(1, cache_tokens)
    return -1.0


@register_reward("soft_overlong", max_score=0.0)
def soft_overlong(completion_text: str, metadata: dict, max_tokens: int = 4096, cache_tokens: int = 512) -> float:
    """DAPO soft overlong punishment: 0 up to max - cache tokens, then linear down to -1 at max, -1 beyond."""
    return soft_overlong_penalty(num_completion_tokens(completion_text, metadata), max_tokens, cache_tokens)


@register_reward("repetition", max_score=0.0)
def repetition_penalty(completion_text: str, metadata: dict, ngram_size: int = 3, max_penalty: float = -1.0) -> float:
    """open-r1 n-gram repetition penalty: max_penalty * (1 - distinct n-grams / n-grams), over lowercase words."""
    if max_penalty > 0:
        raise ValueError(f"repetition: max_penalty must be <= 0, got {max_penalty}")
    words = completion_text.lower().split()
    if len(words) < ngram_size:
        return 0.0
    ngrams = [tuple(words[i : i + ngram_size]) for i in range(len(words) - ngram_size + 1)]
    return (1.0 - len(set(ngrams)) / len(ngrams)) * max_penalty
