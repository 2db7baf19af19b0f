"""Table-driven tests of the math verifiers (math, math_boxed_strict, gsm8k)."""

import time

import pytest

from rlvr.rewards.registry import get_reward

BIG = "blah " * 20000  # 100 kB

MATH_CASES = [
    # (completion, ground_truth, expected)
    (r"The answer is \boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"so $x = \frac{1}{2}$", r"\frac{1}{2}", 1.0),
    ("The answer is 42", "42", 1.0),
    (r"\boxed{50\%}", r"50\%", 1.0),
    (r"\boxed{0.5}", r"50\%", 1.0),
    (r"\boxed{5 \text{ cm}}", "5", 1.0),
    (r"\boxed{[1, 2)}", "[1,2)", 1.0),
    (r"\boxed{(1, 2]}", "[1,2)", 0.0),
    (r"\boxed{\{2, 1\}}", r"\{1,2\}", 1.0),
    (r"\boxed{y = 1 + 2x}", "y=2x+1", 1.0),
    (r"\boxed{\sqrt{2}}", r"\sqrt{2}", 1.0),
    (r"\boxed{\frac{\sqrt{\frac{1}{2}}}{\frac{1}{2}}}", r"\sqrt{2}", 1.0),  # nested braces (math-verify decides)
    (r"\boxed{\frac{\frac{1}{2}}{\frac{1}{4}}}", "2", 0.0),  # an integer gold wants the number itself
    (r"first \boxed{3} then \boxed{4}", "4", 1.0),  # several boxes: the last counts
    (r"first \boxed{4} then \boxed{3}", "4", 0.0),
    (r"\boxed{7}", "42", 0.0),
    ("", "42", 0.0),
    (r"<think>it is \boxed{42}</think> I don't know", "42", 0.0),  # answer only inside the reasoning
    (r"<think>it is \boxed{42} and I keep thinking", "42", 0.0),  # unterminated reasoning
    (r"<think>maybe 41</think> \boxed{42}", "42", 1.0),
    ("答案是 \\boxed{42}。", "42", 1.0),  # unicode
    (BIG + r" \boxed{42}", "42", 1.0),
    (BIG, "42", 0.0),
    (r"\boxed{" + "1+" * 2000 + "1}", "2001", 0.0),  # over max_answer_chars: refused, fast
    (r"\boxed{\frac{1}{2", "0.5", 0.0),  # unbalanced
]


@pytest.mark.parametrize("completion,gold,expected", MATH_CASES)
def test_math(completion, gold, expected):
    assert get_reward("math").fn(completion, {"ground_truth": gold}) == expected


STRICT_CASES = [
    (r"\boxed{42}", "42", 1.0),
    ("The answer is 42", "42", 0.0),  # no box: strict scores 0
    (r"$42$", "42", 0.0),
    (r"\boxed{}", "42", 0.0),
    (r"\boxed{41} \boxed{42}", "42", 1.0),
    (r"<think>\boxed{42}</think>", "42", 0.0),
    ("", "42", 0.0),
    (BIG + r"\boxed{42}", "42", 1.0),
    ("é \\boxed{\\frac{2}{4}}", "1/2", 1.0),
]


@pytest.mark.parametrize("completion,gold,expected", STRICT_CASES)
def test_math_boxed_strict(completion, gold, expected):
    assert get_reward("math_boxed_strict").fn(completion, {"ground_truth": gold}) == expected


GSM8K_CASES = [
    ("so she has 72 apples", "72", 1.0),
    ("so she has 72 apples", "Natalia sold 48/2 = 24 clips.\n#### 72", 1.0),
    ("The total is $1,234.", "1234", 1.0),
    ("3 + 4 = 7, then 7 * 2 = 14", "14", 1.0),
    ("14 first, then finally 15", "14", 0.0),
    ("-3", "-3", 1.0),
    ("0.50", "0.5", 1.0),
    ("no numbers here", "5", 0.0),
    ("", "5", 0.0),
    ("<think>72</think> I give up", "72", 0.0),
    ("٧٢ ﻿ 72", "72", 1.0),  # unicode digits elsewhere; ascii number last
    (BIG + " 72", "72", 1.0),
    (r"\boxed{3} \boxed{72}", "72", 1.0),
]


@pytest.mark.parametrize("completion,gold,expected", GSM8K_CASES)
def test_gsm8k(completion, gold, expected):
    assert get_reward("gsm8k").fn(completion, {"ground_truth": gold}) == expected


@pytest.mark.parametrize("name", ["math", "math_boxed_strict", "gsm8k"])
def test_no_ground_truth_is_none(name):
    assert get_reward(name).fn(r"\boxed{1}", {}) is None


def test_ground_truth_list_means_any():
    assert get_reward("math").fn(r"\boxed{3}", {"ground_truth": ["2", "3"]}) == 1.0


def test_big_inputs_are_fast():
    start = time.perf_counter()
    for completion, gold, _ in MATH_CASES[-4:]:
        get_reward("math").fn(completion * 1, {"ground_truth": gold})
    assert time.perf_counter() - start < 5.0


# An integer gold needs a number as the answer, not a computation that evaluates to it. math-verify alone scores
# these as correct (the expression is symbolically equal to the gold), and a policy trained on "What is 44 + 66?"
# found the echo in under 20 steps.
INTEGER_GOLD_CASES = [
    ("44 + 66", "110", 0.0),
    (r"\boxed{44 + 66}", "110", 0.0),
    ("98 + 83, not a possible answer.", "181", 0.0),
    ("15 + 71 = Como", "86", 0.0),
    ("Leo has 56 + 3 - 49", "10", 0.0),
    (r"\boxed{2 \times 5}", "10", 0.0),
    (r"\boxed{\frac{20}{2}}", "10", 0.0),
    ("44 + 66 = 110", "110", 1.0),
    ("44 + 66 equals 110.", "110", 1.0),
    (r"\boxed{110}", "110", 1.0),
    (r"\boxed{\$110}", "110", 1.0),
    (r"\boxed{110 \text{ apples}}", "110", 1.0),
    (r"\boxed{-22}", "-22", 1.0),
    (r"\boxed{1,000}", "1000", 1.0),
    (r"\boxed{1000}", "1,000", 1.0),
    ("The answer is 110, not 111.", "110", 0.0),  # the last number is the answer
]


@pytest.mark.parametrize("completion,gold,expected", INTEGER_GOLD_CASES)
@pytest.mark.parametrize("fn", ["math", "math_boxed_strict"])
def test_integer_gold_needs_the_number(fn, completion, gold, expected):
    if fn == "math_boxed_strict" and "boxed" not in completion:
        expected = 0.0
    assert get_reward(fn).fn(completion, {"ground_truth": gold}) == expected


def test_no_unevaluated_arithmetic_scores_for_an_integer_gold():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None)
    @given(
        st.integers(2, 999),
        st.integers(2, 999),
        st.sampled_from(["+", "*", "\\times", "\\cdot"]),
        st.sampled_from(["{e}", "\\boxed{{{e}}}", "The answer is {e}.", "${e}$", "So {e}"]),
    )
    def check(a, b, op, wrap):
        value = a + b if op == "+" else a * b
        echo = wrap.format(e=f"{a} {op} {b}")
        assert get_reward("math").fn(echo, {"ground_truth": str(value)}) == 0.0, echo
        assert get_reward("math").fn(wrap.format(e=str(value)), {"ground_truth": str(value)}) == 1.0

    check()


RATIONAL_GOLD_CASES = [  # the same for a rational gold: a number (or a percentage) answers, a computation does not
    (r"\boxed{1/4+1/4}", "0.5", 0.0),
    (r"\boxed{2 \times 0.25}", "0.5", 0.0),
    (r"\boxed{2^{-1}}", "0.5", 0.0),
    (r"$x = \frac14+\frac14$", r"\frac{1}{2}", 0.0),
    (r"\boxed{25\%+25\%}", "0.5", 0.0),
    (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{0.50}", "1/2", 1.0),
    (r"\boxed{50\%}", "0.5", 1.0),
    (r"$x = \frac12$", r"\frac{1}{2}", 1.0),
    (r"\boxed{-\frac{1}{2}}", "-0.5", 1.0),
    (r"The answer is $\frac{3}{4}$", "0.75", 1.0),
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", 1.0),  # irrational gold: math-verify decides
]


@pytest.mark.parametrize("completion,gold,expected", RATIONAL_GOLD_CASES)
def test_rational_gold_needs_the_number(completion, gold, expected):
    assert get_reward("math").fn(completion, {"ground_truth": gold}) == expected
