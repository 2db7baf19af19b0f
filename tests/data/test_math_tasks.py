"""Built-in math tasks: disjoint seeded splits, answers that are right, the math verifier accepting them."""

from __future__ import annotations

import ast
import operator
import re

import pytest

from rlvr.data.math_tasks import ARITH_LEVELS, MATH_TASKS
from rlvr.data.tasks import BUILTIN_TASKS, builtin_corpus, builtin_rows
from rlvr.rewards.math_verifiers import math_reward

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _eval(expr: str) -> int:
    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise ValueError(f"unexpected node {ast.dump(node)}")

    return ev(ast.parse(expr, mode="eval").body)


def test_math_tasks_are_builtin_tasks() -> None:
    assert set(MATH_TASKS) <= set(BUILTIN_TASKS)


@pytest.mark.parametrize("task", ARITH_LEVELS)
def test_arithmetic_answers_are_the_expression_value(task: str) -> None:
    for split in ("train", "test"):
        for row in builtin_rows(task, split, 300, seed=3):
            m = re.fullmatch(r"What is (.+)\? Put the final answer in \\boxed\{\}\.", row["prompt"])
            assert m, row["prompt"]
            assert int(row["ground_truth"]) == _eval(m.group(1)) >= 0
            assert row["verifier"] == "math"


def test_levels_have_the_documented_operands() -> None:
    def operands(task: str) -> list[list[int]]:
        return [[int(x) for x in re.findall(r"\d+", r["prompt"])] for r in builtin_rows(task, "train", 200, 0)]

    assert all(len(o) == 2 and all(0 <= x <= 9 for x in o) for o in operands("arith-l1"))
    assert all(len(o) == 2 and all(10 <= x <= 99 for x in o) for o in operands("arith-l2"))
    assert all("+" in r["prompt"] for r in builtin_rows("arith-l2", "train", 200, 0))
    assert any("-" in r["prompt"] for r in builtin_rows("arith-l3", "train", 200, 0))
    assert all(len(o) == 3 for o in operands("arith-l5"))


@pytest.mark.parametrize("task", MATH_TASKS)
def test_splits_are_disjoint_deterministic_and_test_ignores_seed(task: str) -> None:
    train = builtin_rows(task, "train", 2000, seed=0)
    test = builtin_rows(task, "test", 200, seed=0)
    assert builtin_rows(task, "train", 2000, seed=0) == train
    assert builtin_rows(task, "train", 2000, seed=1) != train
    assert builtin_rows(task, "test", 200, seed=9) == test
    # numbers and operators identify an item (names and objects vary freely): none is in both splits
    key = lambda r: re.sub(r"[A-Za-z]+", "", r["prompt"])  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in test}
    assert len({r["prompt"] for r in test}) == len(test)  # distinct held-out items


def test_small_item_spaces_give_every_test_item_once() -> None:
    rows = builtin_rows("arith-l1", "test", 200, seed=0)
    assert 0 < len(rows) < 30  # 100 one-digit pairs, about 1/8 held out
    assert len({r["prompt"] for r in rows}) == len(rows)


def test_word_problem_answers_are_non_negative_integers_and_verify() -> None:
    rows = builtin_rows("word-problems", "train", 3000, seed=5)
    assert len({r["prompt"].split(".")[0] for r in rows}) > 50
    for r in rows:
        assert int(r["ground_truth"]) >= 0 and r["prompt"].endswith("Put the final answer in \\boxed{}.")
    # spot-check templates whose answer can be recomputed from the text
    for r in rows:
        m = re.match(r"A farmer has (\d+) cows and (\d+) chickens", r["prompt"])
        if m:
            assert int(r["ground_truth"]) == 4 * int(m.group(1)) + 2 * int(m.group(2))
        m = re.match(r"\w+ has (\d+) \w+\. \w+ buys (\d+) more and then gives (\d+) to a friend", r["prompt"])
        if m:
            a, b, c = map(int, m.groups())
            assert int(r["ground_truth"]) == a + b - c


def test_math_verifier_scores_the_rows() -> None:
    row = builtin_rows("arith-l2", "test", 1, seed=0)[0]
    gold = {"ground_truth": row["ground_truth"]}
    assert math_reward(f"The sum is \\boxed{{{row['ground_truth']}}}.", gold) == 1.0
    assert math_reward(f"The sum is \\boxed{{{int(row['ground_truth']) + 1}}}.", gold) == 0.0


def test_corpus_covers_every_character_of_the_rows() -> None:
    for task in MATH_TASKS:
        corpus_chars = {ch for line in builtin_corpus(task) for ch in line}
        rows = builtin_rows(task, "test", 200, 0) + builtin_rows(task, "train", 500, 1)
        assert {ch for r in rows for ch in r["prompt"] + r["ground_truth"]} <= corpus_chars


def test_easy_word_problems_use_addition_and_subtraction_only_and_their_answers_are_right() -> None:
    rows = builtin_rows("word-problems-l1", "train", 2000, seed=3)
    assert len({r["prompt"].split(".")[0] for r in rows}) > 50
    seen = set()
    for r in rows:
        p, ans = r["prompt"], int(r["ground_truth"])
        assert 0 <= ans <= 200 and "twice" not in p and "Each pack" not in p and "every week" not in p
        nums = list(map(int, re.findall(r"\d+", p)))
        if "buys" in p or "loses" in p:
            seen.add("add-sub")
            assert ans == nums[0] + nums[1] - nums[2]
        elif "spends" in p:
            seen.add("sub-sub")
            assert ans == nums[0] - nums[1] - nums[2]
        elif "Wednesday" in p:
            seen.add("add-add")
            assert ans == sum(nums)
        elif "more" in p and "together" in p:
            seen.add("more-than")
            assert ans == 2 * nums[0] + nums[1]
        elif "bus" in p:
            seen.add("bus")
            assert ans == nums[0] - nums[1] + nums[2]
        else:
            raise AssertionError(f"unknown template: {p}")
    assert seen == {"add-sub", "sub-sub", "add-add", "more-than", "bus"}


def test_one_step_word_problems_take_one_addition_or_subtraction() -> None:
    """`word-problems-l0`, the curriculum level below l1: every template is one operation, and its answer is right."""
    rows = builtin_rows("word-problems-l0", "train", 2000, seed=3)
    assert len({r["prompt"] for r in rows}) > 500
    seen = set()
    for r in rows:
        p, ans = r["prompt"], int(r["ground_truth"])
        nums = list(map(int, re.findall(r"\d+", p)))
        assert len(nums) == 2 and ans >= 0 and p.endswith("Put the final answer in \\boxed{}."), p
        if "buys" in p or "Tuesday" in p:
            seen.add("add")
            assert ans == nums[0] + nums[1]
        elif any(w in p for w in ("gives", "spends", "get off", "eats")):
            seen.add("sub")
            assert ans == nums[0] - nums[1]
        else:
            raise AssertionError(f"unknown template: {p}")
    assert seen == {"add", "sub"}
    test = {r["prompt"] for r in builtin_rows("word-problems-l0", "test", 300, seed=0)}
    assert len(test) == 300 and not test & {r["prompt"] for r in rows}  # held-out items never train
