"""String verifiers: `exact_match` and token-level `f1` against the ground truth (SQuAD normalisation).

Invariants: the compared answer is the last `<answer>...</answer>` content when present, else the text after
the reasoning block; normalisation lowercases, drops punctuation and the articles a/an/the and collapses
whitespace; a `ground_truth` list scores the best match; no ground truth -> None.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from rlvr.rewards.answer_text import answer_tag_content, final_answer_text
from rlvr.rewards.registration import register_reward

_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD-style normalisation: lowercase, no punctuation, no articles, single spaces."""
    text = text.lower().translate(_PUNCT)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _answer(completion_text: str) -> str:
    text = final_answer_text(completion_text)
    tagged = answer_tag_content(text)
    return tagged if tagged is not None else text


def _golds(metadata: dict) -> list[str] | None:
    gold = metadata.get("ground_truth")
    if gold is None:
        return None
    return [str(g) for g in gold] if isinstance(gold, (list, tuple)) else [str(gold)]


def token_f1(prediction: str, gold: str) -> float:
    """Token-overlap F1 between the normalised prediction and gold."""
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


@register_reward("exact_match")
def exact_match(completion_text: str, metadata: dict) -> float | None:
    """1.0 if the normalised answer equals a normalised gold."""
    golds = _golds(metadata)
    if golds is None:
        return None
    answer = normalize_answer(_answer(completion_text))
    return float(any(answer == normalize_answer(g) for g in golds))


@register_reward("f1")
def f1_reward(completion_text: str, metadata: dict) -> float | None:
    """Best token F1 of the answer against the golds."""
    golds = _golds(metadata)
    if golds is None:
        return None
    answer = _answer(completion_text)
    return max(token_f1(answer, g) for g in golds)
