"""Math verifiers: `math`, `math_boxed_strict` (math-verify equivalence) and `gsm8k` (last number).

Invariants:
- Scores are 1.0 (equivalent to the ground truth) or 0.0; None only when the row has no ground truth.
- Only the text after the reasoning block is searched (`answer_text.final_answer_text`).
- math-verify is called with its own timeouts disabled (`parsing_timeout=None`, `timeout_seconds=None`):
  they use SIGALRM, which only works in the main thread. Time is bounded by the caller instead: the
  `VerifierPool` workers (soft SIGALRM in the worker's main thread plus a hard kill from the parent).
- Input size is bounded before sympy sees it: a boxed answer longer than `max_answer_chars` scores 0, and
  without a box only the last `tail_chars` characters are parsed, so a 100 kB completion costs no more
  than a short one.
- A `ground_truth` list means "any of these": the score is the max over golds.
- A rational gold ("0.5", "\\frac{1}{2}") likewise needs a number (or a percentage), not 1/4 + 1/4 or 2 * 0.25.
- An integer gold ("110", "-3", "1,000") needs a number as the answer, not a computation that evaluates to it:
  the answer's last number (in the last `\\boxed{}`, else in the tail) must equal the gold. math-verify alone
  scores an echoed question ("What is 44 + 66?" -> "44 + 66", or "56 + 3 - 49" for a word problem) as correct,
  because the unevaluated expression is symbolically equal to the gold; a policy learns that in a few steps.
- Fast path before sympy: identical strings (modulo spaces, \\left/\\right, thin spaces) score 1, and two
  plain decimal numbers are compared as floats; (golds, answer) verdicts are memoised (LRU, 16k entries).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from rlvr.rewards.answer_text import final_answer_text, last_boxed, last_number
from rlvr.rewards.registration import register_reward


@functools.cache
def _math_verify() -> Any:
    import math_verify
    import math_verify.grader
    import math_verify.parser

    # We disable its SIGALRM timeouts on purpose (module docstring); silence its one-time warning about it.
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    return math_verify


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple[Any, ...]:
    mv = _math_verify()
    text = gold.strip()
    if "$" not in text and "\\boxed" not in text and "\\(" not in text and "\\[" not in text:
        text = f"${text}$"  # a bare LaTeX gold such as "\frac{1}{2}" has no anchor for math-verify to find
    parsed = mv.parse(text, parsing_timeout=None)
    if not parsed:  # e.g. a gold that is plain text: fall back to the raw string for exact comparison
        parsed = mv.parse(gold, parsing_timeout=None)
    return tuple(parsed)


def _golds(metadata: dict) -> list[str] | None:
    gold = metadata.get("ground_truth")
    if gold is None:
        return None
    golds = gold if isinstance(gold, (list, tuple)) else [gold]
    return [str(g) for g in golds]


_PLAIN_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _plain(text: str) -> str:
    text = text.strip().strip("$").strip()
    if text.startswith("\\boxed{") and text.endswith("}"):
        text = text[len("\\boxed{") : -1]
    return re.sub(r"\s+|\\left|\\right|\\!|\\,", "", text).rstrip(".").replace("{,}", "")


def _fast_path(golds: list[str], pred_source: str) -> float | None:
    """Decide without sympy when both sides are the same string or both are plain decimal numbers."""
    pred = _plain(pred_source)
    pred_is_number = _PLAIN_NUMBER.fullmatch(pred) is not None
    all_numbers = pred_is_number
    for gold in golds:
        g = _plain(gold)
        if g == pred and g:
            return 1.0
        if pred_is_number and _PLAIN_NUMBER.fullmatch(g):
            if abs(float(g) - float(pred)) <= 1e-9 * max(1.0, abs(float(g))):
                return 1.0
        else:
            all_numbers = False
    return 0.0 if all_numbers else None


@functools.lru_cache(maxsize=16384)
def _equivalent_cached(golds: tuple[str, ...], pred_source: str) -> float:
    # Cached: the G samples of a GRPO group often give the same answer to the same gold.
    fast = _fast_path(list(golds), pred_source)
    if fast is not None:
        return fast
    mv = _math_verify()
    pred = mv.parse(pred_source, parsing_timeout=None)
    if not pred:
        return 0.0
    for gold in golds:
        gold_parsed = _parse_gold(gold)
        if gold_parsed and _is_rational(gold_parsed[0]) and _is_computation(pred[0]):
            continue  # a rational gold wants the number: "1/4 + 1/4" is the question, not the answer 1/2
        if gold_parsed and mv.verify(list(gold_parsed), pred, timeout_seconds=None):
            return 1.0
    return 0.0


def _is_rational(expr: Any) -> bool:
    return bool(getattr(expr, "is_Rational", False))


def _is_computation(expr: Any) -> bool:
    """A numeric expression still to be computed (1/4 + 1/4, 2*5, 2**10, x = 3 - 1), not a number; a percentage
    (50%) counts as a number."""
    import sympy

    if isinstance(expr, sympy.Equality):
        expr = expr.rhs
    if not isinstance(expr, sympy.Basic) or not expr.is_number or expr.is_Atom:
        return False
    args = [a.args[0] if isinstance(a, sympy.UnevaluatedExpr) else a for a in expr.args]
    if isinstance(expr, sympy.Mul) and len(args) == 2:
        for unit in (sympy.Rational(1, 100), -1):  # math-verify's 50% is 50 * 1/100; -x is a sign, not a product
            if unit in args:
                other = args[0] if args[1] == unit else args[1]
                return not other.is_Atom
    return True


def _equivalent(golds: list[str], pred_source: str) -> float:
    return _equivalent_cached(tuple(golds), pred_source)


_INTEGER = re.compile(r"-?\d{1,3}(?:,\d{3})+|-?\d+")


def _integer_golds(golds: list[str]) -> list[int] | None:
    """The golds as integers when every one is a plain integer, else None (math-verify decides)."""
    values = []
    for gold in golds:
        plain = _plain(gold.split("####")[-1])
        if not _INTEGER.fullmatch(plain):
            return None
        values.append(int(plain.replace(",", "")))
    return values


def _last_number_matches(answer: str, golds: list[float], rel_tol: float) -> float:
    """1.0 if the last number of `answer` equals one of `golds` (within `rel_tol`, relative above 1)."""
    number = last_number(answer)
    value = _to_float(number) if number is not None else None
    return 1.0 if value is not None and any(abs(value - g) <= rel_tol * max(1.0, abs(g)) for g in golds) else 0.0


def _integer_answer(golds: list[int], answer: str) -> float:
    """1.0 if the last number of `answer` is one of the integer golds: a result, not an expression for it."""
    return _last_number_matches(answer, [float(g) for g in golds], 1e-9)


@register_reward("math")
def math_reward(
    completion_text: str, metadata: dict, max_answer_chars: int = 1000, tail_chars: int = 2000
) -> float | None:
    """1.0 if the answer (last `\\boxed{}`, else last LaTeX/number in the tail) equals the ground truth.

    Equivalence is math-verify's: numbers, fractions, percentages, units in `\\text{}`, intervals, sets,
    equations and symbolic expressions.
    """
    golds = _golds(metadata)
    if golds is None:
        return None
    answer = final_answer_text(completion_text)
    boxed = last_boxed(answer)
    integers = _integer_golds(golds)
    if boxed is not None:
        if len(boxed) > max_answer_chars:
            return 0.0
        if integers is not None:
            return _integer_answer(integers, boxed)
        return _equivalent(golds, f"\\boxed{{{boxed}}}")
    tail = answer[-tail_chars:]
    if not tail.strip():
        return 0.0
    if integers is not None:
        return _integer_answer(integers, tail)
    return _equivalent(golds, tail)


@register_reward("math_boxed_strict")
def math_boxed_strict_reward(completion_text: str, metadata: dict, max_answer_chars: int = 1000) -> float | None:
    """Like `math`, but only the last `\\boxed{}` after the reasoning block counts; no box scores 0."""
    golds = _golds(metadata)
    if golds is None:
        return None
    boxed = last_boxed(final_answer_text(completion_text))
    if boxed is None or not boxed.strip() or len(boxed) > max_answer_chars:
        return 0.0
    integers = _integer_golds(golds)
    if integers is not None:
        return _integer_answer(integers, boxed)
    return _equivalent(golds, f"\\boxed{{{boxed}}}")


def _to_float(number: str) -> float | None:
    try:
        return float(number.replace(",", "").strip())
    except ValueError:
        return None


@register_reward("gsm8k")
def gsm8k_reward(completion_text: str, metadata: dict, rel_tol: float = 1e-6) -> float | None:
    """1.0 if the last number of the answer equals the gold number (GSM8K "#### 42" golds accepted)."""
    golds = _golds(metadata)
    if golds is None:
        return None
    values = [_to_float(n) for n in (last_number(g.split("####")[-1]) for g in golds) if n is not None]
    return _last_number_matches(final_answer_text(completion_text), [v for v in values if v is not None], rel_tol)
