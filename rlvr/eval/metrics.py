"""Evaluation estimators: unbiased pass@k, maj@k, per-verifier / per-dataset reward means, length stats.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", the Codex estimator): with n
samples of which c are correct, pass@k = 1 - C(n-c, k) / C(n, k), the probability that a uniformly random
k-subset holds at least one correct sample. It is computed in the numerically stable product form
1 - prod_{i=n-c+1}^{n} (1 - k / i) of the paper's reference code (no huge binomials).

maj@k: the expected score of majority voting over a uniformly random k-subset of the n samples, so that it
is an unbiased estimate of "sample k, vote" in the same way pass@k is. Within a subset, the answers extracted
from the samples vote (samples with no extractable answer do not vote); a tie between m answers gives each
1/m of the credit (an even random tie-break, in expectation); a subset with no votes scores 0. The credit of
an answer is the fraction of the samples carrying it that were judged correct (1 or 0 when the verifier is
consistent, as it is for equal answers). The expectation over all C(n, k) subsets is computed exactly by a
small dynamic program over answer classes (no enumeration); tests compare it with brute-force enumeration.

Invariants: every estimator returns a float in [0, 1]; k > n is a ValueError (the estimate is undefined).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

AnswerExtractor = Callable[[str], Hashable | None]
"""Maps a completion to its final answer (hashable, compared for equality), or None when it has none."""


def pass_at_k(num_samples: int, num_correct: int, k: int) -> float:
    """Unbiased pass@k of one prompt with `num_samples` samples of which `num_correct` are correct."""
    if not 0 <= num_correct <= num_samples:
        raise ValueError(f"need 0 <= num_correct <= num_samples, got c={num_correct}, n={num_samples}")
    if not 1 <= k <= num_samples:
        raise ValueError(f"pass@{k} needs 1 <= k <= n = {num_samples} samples per prompt")
    if num_samples - num_correct < k:
        return 1.0
    prod = 1.0
    for i in range(num_samples - num_correct + 1, num_samples + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def maj_at_k(answers: Sequence[Hashable | None], correct: Sequence[bool | None], k: int) -> float:
    """Expected majority-vote score over all k-subsets of one prompt's samples (module docstring)."""
    n = len(answers)
    if len(correct) != n:
        raise ValueError(f"answers ({n}) and correct ({len(correct)}) differ in length")
    if not 1 <= k <= n:
        raise ValueError(f"maj@{k} needs 1 <= k <= n = {n} samples per prompt")
    members: dict[Hashable, list[bool]] = defaultdict(list)
    num_abstain = 0
    for answer, ok in zip(answers, correct):
        if answer is None:
            num_abstain += 1
        else:
            members[answer].append(bool(ok))
    sizes = [len(v) for v in members.values()]
    credits = [sum(v) / len(v) for v in members.values()]
    total = 0.0
    for idx, credit in enumerate(credits):
        if credit > 0:
            total += credit * _expected_win_share(idx, sizes, num_abstain, k)
    return min(1.0, total / math.comb(n, k))


def _expected_win_share(idx: int, sizes: list[int], num_abstain: int, k: int) -> float:
    """Sum over k-subsets of class `idx`'s share of the win (1/#tied when it has the top count, else 0).

    For each count t >= 1 of class idx in the subset, a DP over the other classes tracks
    (samples drawn so far, classes tied at exactly t) with each other class drawing at most t samples.
    """
    others = [s for j, s in enumerate(sizes) if j != idx]
    out = 0.0
    for t in range(1, min(sizes[idx], k) + 1):
        # ways[s][j]: number of ways the other classes draw s samples with j of them at exactly t.
        ways = [[0] * (len(others) + 1) for _ in range(k - t + 1)]
        ways[0][0] = 1
        for size in others:
            nxt = [[0] * (len(others) + 1) for _ in range(k - t + 1)]
            for s, row in enumerate(ways):
                for j, w in enumerate(row):
                    if not w:
                        continue
                    for x in range(0, min(size, t, k - t - s) + 1):
                        nxt[s + x][j + (x == t)] += w * math.comb(size, x)
            ways = nxt
        base = math.comb(sizes[idx], t)
        for s, row in enumerate(ways):
            rest = k - t - s  # drawn from the abstaining samples
            if rest > num_abstain:
                continue
            fill = math.comb(num_abstain, rest)
            for j, w in enumerate(row):
                if w:
                    out += base * w * fill / (j + 1)
    return out


def default_answer_extractor(completion_text: str) -> str | None:
    """The last `\\boxed{}` content, else the last `<answer>` tag, else the last non-empty line of the answer.

    Text inside an unclosed reasoning block is no answer (rlvr.rewards.answer_text invariants). Whitespace is
    collapsed so that formatting differences do not split votes.
    """
    from rlvr.rewards.answer_text import answer_tag_content, boxed_contents, final_answer_text

    text = final_answer_text(completion_text)
    boxed = boxed_contents(text)
    answer = boxed[-1] if boxed else answer_tag_content(text)
    if answer is None:
        lines = [line for line in text.strip().splitlines() if line.strip()]
        answer = lines[-1] if lines else None
    if answer is None:
        return None
    answer = " ".join(answer.split())
    return answer or None


def length_stats(lengths: Sequence[int | float]) -> dict[str, float]:
    """mean / min / p50 / p90 / max of completion lengths (tokens); empty input gives {}."""
    if not lengths:
        return {}
    ordered = sorted(float(v) for v in lengths)
    return {
        "mean": statistics.fmean(ordered),
        "min": ordered[0],
        "p50": _percentile(ordered, 50),
        "p90": _percentile(ordered, 90),
        "max": ordered[-1],
    }


def _percentile(ordered: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default) of sorted values."""
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def finish_rates(finish_reasons: Iterable[str]) -> dict[str, float]:
    """Fractions of completions that stopped (`stop_rate`), hit the length limit, or were aborted."""
    reasons = list(finish_reasons)
    if not reasons:
        return {}
    n = len(reasons)
    return {
        "stop_rate": reasons.count("stop") / n,
        "truncated_rate": reasons.count("length") / n,
        "abort_rate": reasons.count("abort") / n,
    }


def mean_scores(score_dicts: Iterable[Mapping[str, float | None]]) -> dict[str, float]:
    """Per reward function: the mean over completions it scored (None scores are left out)."""
    values: dict[str, list[float]] = defaultdict(list)
    for scores in score_dicts:
        for name, value in scores.items():
            if value is not None:
                values[name].append(float(value))
    # fmean sums exactly (fsum), so the result does not depend on the order of the completions.
    return {name: statistics.fmean(values[name]) for name in sorted(values)}


def group_metrics(
    groups: Mapping[str, Sequence[Mapping[str, Any]]], ks: Sequence[int], majority: bool = True
) -> dict[str, float]:
    """pass@k and (with `majority`) maj@k averaged over prompts, from per-prompt lists of scored rows.

    Each row needs `correct` (bool | None; None counts as incorrect) and, for maj@k, `answer` (the extracted
    answer, None for none). A k larger
    than a prompt's sample count is skipped for every prompt (the key is then absent)."""
    if not groups:
        return {}
    min_n = min(len(rows) for rows in groups.values())
    out: dict[str, float] = {}
    valid = [k for k in sorted(set(ks)) if 1 <= k <= min_n]
    for k in valid:
        out[f"pass@{k}"] = statistics.fmean(
            pass_at_k(len(rows), sum(bool(r.get("correct")) for r in rows), k) for rows in groups.values()
        )
    if majority:
        for k in valid:
            out[f"maj@{k}"] = statistics.fmean(
                maj_at_k([r["answer"] for r in rows], [bool(r.get("correct")) for r in rows], k)
                for rows in groups.values()
            )
    return out
