"""pass@k / maj@k estimators against brute-force enumeration of every k-subset, plus the small stats helpers."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import pytest

from rlvr.eval.metrics import (
    default_answer_extractor,
    finish_rates,
    group_metrics,
    length_stats,
    maj_at_k,
    mean_scores,
    pass_at_k,
)


def brute_pass_at_k(correct: list[bool], k: int) -> float:
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


def brute_maj_at_k(answers: list, correct: list[bool], k: int) -> float:
    """Majority vote on every k-subset; ties split the credit evenly; credit = fraction correct of the answer."""
    credit = {}
    for a in set(a for a in answers if a is not None):
        flags = [c for x, c in zip(answers, correct) if x == a]
        credit[a] = sum(flags) / len(flags)
    subsets = list(itertools.combinations(range(len(answers)), k))
    total = 0.0
    for s in subsets:
        votes = Counter(answers[i] for i in s if answers[i] is not None)
        if not votes:
            continue
        top = max(votes.values())
        winners = [a for a, v in votes.items() if v == top]
        total += sum(credit[a] for a in winners) / len(winners)
    return total / len(subsets)


def test_pass_at_k_hand_cases() -> None:
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - math.comb(3, 3) / math.comb(5, 3))
    assert pass_at_k(3, 2, 2) == 1.0  # n - c < k


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8])
def test_pass_at_k_matches_enumeration(n: int) -> None:
    for c in range(n + 1):
        flags = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(flags, k), abs=1e-12)


def test_pass_at_k_stable_for_large_n() -> None:
    # C(1000, 500) overflows float; the product form does not.
    value = pass_at_k(1000, 3, 500)
    assert value == pytest.approx(1 - math.comb(997, 500) / math.comb(1000, 500), rel=1e-9)
    assert 0.0 <= pass_at_k(2000, 1, 7) <= 1.0


def test_pass_at_k_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)


def test_maj_at_k_hand_cases() -> None:
    # k = n is plain majority voting.
    assert maj_at_k(["4", "4", "5"], [True, True, False], 3) == 1.0
    assert maj_at_k(["5", "5", "4"], [False, False, True], 3) == 0.0
    # A 1-1 tie splits the credit.
    assert maj_at_k(["4", "5"], [True, False], 2) == pytest.approx(0.5)
    # Abstentions don't vote: one vote for the correct answer wins.
    assert maj_at_k([None, None, "4"], [False, False, True], 3) == 1.0
    assert maj_at_k([None, None], [False, False], 1) == 0.0
    # k = 1 equals the mean credit of the voting samples over all samples.
    assert maj_at_k(["a", "b", None, "a"], [True, False, False, True], 1) == pytest.approx(0.5)


@pytest.mark.parametrize("seed", range(40))
def test_maj_at_k_matches_enumeration(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    pool = ["a", "b", "c", "d", None][: rng.randint(1, 5)]
    answers = [rng.choice(pool) for _ in range(n)]
    # Mostly consistent verifiers (same answer, same verdict), sometimes not.
    verdict = {a: rng.random() < 0.4 for a in pool}
    correct = [verdict[a] if rng.random() < 0.8 else rng.random() < 0.5 for a in answers]
    correct = [bool(c) and a is not None for a, c in zip(answers, correct)]
    for k in range(1, n + 1):
        assert maj_at_k(answers, correct, k) == pytest.approx(brute_maj_at_k(answers, correct, k), abs=1e-12)


def test_maj_at_k_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="k <= n"):
        maj_at_k(["a"], [True], 2)
    with pytest.raises(ValueError, match="length"):
        maj_at_k(["a", "b"], [True], 1)


def test_group_metrics_averages_prompts_and_skips_large_k() -> None:
    groups = {
        "p0": [{"correct": True, "answer": "1"}, {"correct": False, "answer": "2"}, {"correct": None, "answer": None}],
        "p1": [{"correct": False, "answer": "x"}] * 3,
    }
    out = group_metrics(groups, ks=(1, 2, 3, 8))
    assert out["pass@1"] == pytest.approx((1 / 3 + 0) / 2)
    assert out["pass@2"] == pytest.approx((pass_at_k(3, 1, 2) + 0) / 2)
    assert "pass@8" not in out and "maj@8" not in out
    assert out["maj@3"] == pytest.approx((0.5 + 0) / 2)  # "1" vs "2" tie, None abstains
    assert "maj@1" not in group_metrics(groups, ks=(1,), majority=False)


def test_stats_helpers() -> None:
    stats = length_stats([1, 2, 3, 4, 10])
    assert stats == {"mean": 4.0, "min": 1.0, "p50": 3.0, "p90": pytest.approx(7.6), "max": 10.0}
    assert length_stats([]) == {}
    rates = finish_rates(["stop", "stop", "length", "abort"])
    assert rates == {"stop_rate": 0.5, "truncated_rate": 0.25, "abort_rate": 0.25}
    assert mean_scores([{"math": 1.0, "fmt": None}, {"math": 0.0, "fmt": 0.5}]) == {"fmt": 0.5, "math": 0.5}


def test_default_answer_extractor() -> None:
    assert default_answer_extractor("so \\boxed{ 4 } and \\boxed{x + 1}") == "x + 1"
    assert default_answer_extractor("<think>hmm \\boxed{3}</think> The answer is\n 42 ") == "42"
    assert default_answer_extractor("<answer>7</answer>") == "7"
    assert default_answer_extractor("<think>still thinking \\boxed{3}") is None
    assert default_answer_extractor("   ") is None
