"""Built-in math tasks for real models (`builtin:arith-l1` ... `builtin:arith-l5`, `builtin:word-problems-l0`,
`builtin:word-problems-l1`, `builtin:word-problems`).

Generated in code, seeded, with held-out test splits; every row's answer is an integer computed here and
checked by the `math` verifier (math-verify equivalence; the last `\\boxed{}`, else the last number).

Arithmetic levels (prompt: "What is <expr>? Put the final answer in \\boxed{}."):
- `arith-l1`: one-digit addition (3 + 4); 100 items.
- `arith-l2`: two-digit addition (37 + 45); 8,100 items. The headline eval of the real-model demo.
- `arith-l3`: two-digit addition or subtraction with a non-negative result (82 - 37).
- `arith-l4`: two-digit times one-digit (23 * 7), or three-digit addition / subtraction (512 - 178).
- `arith-l5`: three operands: a + b - c with two-digit numbers, or a * b + c (two-digit, one-digit, two-digit).
`word-problems`: GSM8K-style templated stories of two or three steps (buy, give away, spend, save, share,
count legs, ...) with small integer answers >= 0, e.g. "Mia has 23 stickers. She buys 15 more and then gives
8 to a friend. How many stickers does Mia have now?" (30). About half of its templates need a multiplication.
`word-problems-l1`: the easier level: two-step stories with addition and subtraction only (gets and gives, spends
twice, two boxes then a loss, ...), numbers up to 60, answers 0-120. Tried as the real-model preset's word set (weights 0.6 / 0.4,
1 x H100): SmolLM2-135M went from 0.0 to 0.02-0.10 in 80-100 steps (docs/gpu-results/README.md).

`word-problems-l0`: the curriculum level below that: one-step stories (gets more, gives away, spends, gets off the
bus, collects on two days, eats), one addition or subtraction, numbers up to 60. Sampled on CPU at temperature
0.6, SmolLM2-135M-Instruct answers 4% of them right (5 groups of 8 samples in 24 have a right answer), against
0.5% (1 group in 24) for `word-problems-l1` at 0.6 or 1.0 and for these at 1.0: a level GRPO gets an advantage
from.

Invariants:
- Train and test are disjoint: an item (the template and its numbers) belongs to one split by a stable hash.
- The test split ignores the seed; it holds distinct items (as many as exist, up to the rows asked for).
- The same (task, split, num_rows, seed) always gives the same rows.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Callable

MATH_VERIFIER = "math"
ARITH_LEVELS = ("arith-l1", "arith-l2", "arith-l3", "arith-l4", "arith-l5")
WORD_LEVELS = ("word-problems-l0", "word-problems-l1", "word-problems")
MATH_TASKS: tuple[str, ...] = (*ARITH_LEVELS, *WORD_LEVELS)
INSTRUCTION = "Put the final answer in \\boxed{}."
_TEST_PER_256 = 32  # 1/8 of the items are held out


def _is_test(key: str) -> bool:
    return hashlib.sha256(key.encode()).digest()[0] < _TEST_PER_256


Item = tuple[str, int, str]  # (question, answer, split key)


def _arith_item(level: int, rng: random.Random) -> Item:
    r = rng.randint
    if level == 1:
        a, b, op = r(0, 9), r(0, 9), "+"
    elif level == 2:
        a, b, op = r(10, 99), r(10, 99), "+"
    elif level == 3:
        a, b, op = r(10, 99), r(10, 99), rng.choice("+-")
        if op == "-" and b > a:
            a, b = b, a
    elif level == 4:
        if rng.random() < 0.5:
            a, b, op = r(10, 99), r(2, 9), "*"
        else:
            a, b, op = r(100, 999), r(100, 999), rng.choice("+-")
            if op == "-" and b > a:
                a, b = b, a
    else:
        if rng.random() < 0.5:
            a, b, c = r(10, 99), r(10, 99), r(10, 99)
            if c > a + b:
                c = a + b - r(0, 9)
            expr, ans = f"{a} + {b} - {c}", a + b - c
        else:
            a, b, c = r(10, 99), r(2, 9), r(10, 99)
            expr, ans = f"{a} * {b} + {c}", a * b + c
        return f"What is {expr}? {INSTRUCTION}", ans, expr
    expr = f"{a} {op} {b}"
    ans = a + b if op == "+" else a - b if op == "-" else a * b
    return f"What is {expr}? {INSTRUCTION}", ans, expr


_NAMES = [
    ("Mia", "She", "her"),
    ("Leo", "He", "his"),
    ("Ava", "She", "her"),
    ("Sam", "He", "his"),
    ("Zoe", "She", "her"),
    ("Omar", "He", "his"),
    ("Ivy", "She", "her"),
    ("Ben", "He", "his"),
    ("Nora", "She", "her"),
    ("Raj", "He", "his"),
    ("Lina", "She", "her"),
    ("Tom", "He", "his"),
]
_THINGS = ["stickers", "marbles", "apples", "pencils", "cards", "books", "shells", "cookies", "stamps", "coins"]


def _buys_then_gives(name: str, he: str, thing: str, a: int, b: int, c: int) -> str:
    return (
        f"{name} has {a} {thing}. {he} buys {b} more and then gives {c} to a friend. "
        f"How many {thing} does {name} have now?"
    )


def _spends_twice(name: str, he: str, a: int, b: int, c: int) -> str:
    return (
        f"{name} has {a} dollars. {he} spends {b} dollars on lunch and {c} dollars on a book. "
        f"How many dollars does {name} have left?"
    )


def _word_item(rng: random.Random) -> Item:
    r = rng.randint
    name, he, his = rng.choice(_NAMES)
    thing = rng.choice(_THINGS)
    t = r(0, 7)
    if t == 0:
        a, b = r(5, 60), r(2, 30)
        c = r(1, a + b)
        q = _buys_then_gives(name, he, thing, a, b, c)
        ans, nums = a + b - c, (a, b, c)
    elif t == 1:
        a, b = r(2, 9), r(2, 12)
        c = r(1, a * b)
        q = (
            f"{name} buys {a} packs of {thing}. Each pack has {b} {thing}. {he} gives away {c} of them. "
            f"How many {thing} does {name} have left?"
        )
        ans, nums = a * b - c, (a, b, c)
    elif t == 2:
        a, b = r(2, 9), r(2, 9)
        c = next(x for x in (20, 50, 100) if x >= a * b)
        q = (
            f"A shop sells notebooks for {a} dollars each. {name} buys {b} notebooks and pays with a "
            f"{c}-dollar bill. How many dollars of change does {name} get?"
        )
        ans, nums = c - a * b, (a, b, c)
    elif t == 3:
        a = r(5, 40)
        q = (
            f"{name} reads {a} pages on Monday and twice as many pages on Tuesday. "
            f"How many pages does {name} read in the two days?"
        )
        ans, nums = 3 * a, (a,)
    elif t == 4:
        a = r(20, 99)
        b = r(1, a // 2)
        c = r(1, a - b)
        q = _spends_twice(name, he, a, b, c)
        ans, nums = a - b - c, (a, b, c)
    elif t == 5:
        b, per, c = r(2, 6), r(2, 9), r(1, 9)
        a = b * per
        q = (
            f"There are {a} students in a class. They split into {b} equal groups, and then {c} more students "
            f"join each group. How many students are in each group now?"
        )
        ans, nums = per + c, (a, b, c)
    elif t == 6:
        a, b = r(2, 15), r(2, 8)
        c = r(1, a * b)
        q = (
            f"{name} saves {a} dollars every week for {b} weeks, then spends {c} dollars on a game. "
            f"How many dollars does {name} have left?"
        )
        ans, nums = a * b - c, (a, b, c)
    else:
        a, b = r(1, 20), r(1, 20)
        q = f"A farmer has {a} cows and {b} chickens. How many legs do the farmer's animals have in total?"
        ans, nums = 4 * a + 2 * b, (a, b)
    return f"{q} {INSTRUCTION}", ans, f"w{t}:" + ",".join(map(str, nums))


def _word_item_l1(rng: random.Random) -> Item:
    """Two steps, addition and subtraction only (module docstring)."""
    r = rng.randint
    name, he, his = rng.choice(_NAMES)
    thing = rng.choice(_THINGS)
    t = r(0, 5)
    if t == 0:
        a, b = r(5, 60), r(2, 40)
        c = r(1, a + b)
        q = _buys_then_gives(name, he, thing, a, b, c)
        ans, nums = a + b - c, (a, b, c)
    elif t == 1:
        a = r(20, 99)
        b = r(1, a // 2)
        c = r(1, a - b)
        q = _spends_twice(name, he, a, b, c)
        ans, nums = a - b - c, (a, b, c)
    elif t == 2:
        a, b, c = r(2, 40), r(2, 40), r(2, 40)
        q = (
            f"{name} collects {a} {thing} on Monday, {b} on Tuesday and {c} on Wednesday. "
            f"How many {thing} does {name} collect in total?"
        )
        ans, nums = a + b + c, (a, b, c)
    elif t == 3:
        a, b = r(5, 60), r(5, 60)
        c = r(1, a + b)
        q = (
            f"One box holds {a} {thing} and another box holds {b} {thing}. {name} loses {c} of them. "
            f"How many {thing} are left?"
        )
        ans, nums = a + b - c, (a, b, c)
    elif t == 4:
        a, b = r(5, 60), r(1, 30)
        q = (
            f"{name} has {a} {thing}. {his.capitalize()} friend has {b} more {thing} than {name}. "
            f"How many {thing} do they have together?"
        )
        ans, nums = a + a + b, (a, b)
    else:
        a = r(10, 60)
        b = r(1, a)
        c = r(1, 40)
        q = (
            f"A bus has {a} passengers. At the first stop {b} get off and {c} get on. "
            f"How many passengers are on the bus now?"
        )
        ans, nums = a - b + c, (a, b, c)
    return f"{q} {INSTRUCTION}", ans, f"v{t}:" + ",".join(map(str, nums))


def _word_item_l0(rng: random.Random) -> Item:
    """One step: a single addition or subtraction (module docstring)."""
    r = rng.randint
    name, he, his = rng.choice(_NAMES)
    thing = rng.choice(_THINGS)
    t = r(0, 5)
    a, b = r(5, 60), r(2, 40)
    if t == 0:
        q = f"{name} has {a} {thing}. {he} buys {b} more. How many {thing} does {name} have now?"
        ans = a + b
    elif t == 1:
        a = a + b
        q = f"{name} has {a} {thing}. {he} gives {b} to a friend. How many {thing} does {name} have left?"
        ans = a - b
    elif t == 2:
        a = a + b
        q = f"{name} has {a} dollars. {he} spends {b} dollars on a book. How many dollars does {name} have left?"
        ans = a - b
    elif t == 3:
        a = a + b
        q = f"A bus has {a} passengers. At the stop {b} get off. How many passengers are on the bus now?"
        ans = a - b
    elif t == 4:
        q = f"{name} collects {a} {thing} on Monday and {b} on Tuesday. How many {thing} does {name} collect in total?"
        ans = a + b
    else:
        a = a + b
        q = f"A plate has {a} cookies. {name} eats {b} of them. How many cookies are left on the plate?"
        ans = a - b
    return f"{q} {INSTRUCTION}", ans, f"o{t}:{a},{b}"


def _maker(name: str) -> Callable[[random.Random], Item]:
    if name == "word-problems-l0":
        return _word_item_l0
    if name == "word-problems":
        return _word_item
    if name == "word-problems-l1":
        return _word_item_l1
    level = int(name.rsplit("l", 1)[1])
    return lambda rng: _arith_item(level, rng)


def math_rows(name: str, split: str, num_rows: int, rng: random.Random) -> list[dict[str, Any]]:
    """Rows {prompt, ground_truth, verifier} of math task `name` for `split` (train items repeat; test items
    are distinct while enough exist)."""
    make = _maker(name)
    want_test = split == "test"
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    tries = 0
    while len(rows) < num_rows:
        tries += 1
        question, answer, key = make(rng)
        if _is_test(key) != want_test:
            continue
        if want_test and key in seen:
            if tries > 50 * num_rows:  # every distinct test item is already in: stop short
                break
            continue
        seen.add(key)
        rows.append({"prompt": question, "ground_truth": str(answer), "verifier": MATH_VERIFIER})
    return rows
