"""Built-in offline verifiable tasks (`builtin:<task>`): generated in code, no downloads.

Tasks:
- `copy`: the prompt is a random string over `COPY_ALPHABET` (length 3-6) followed by "=" ("bdac="); the
  answer is the same string ("bdac"). Scored by `copy_reward`, which gives partial credit per matching
  position, so a randomly initialised model earns some reward by chance and GRPO can climb from there.
- `copy4`: the demo task (`rlvr train` with no arguments). Like `copy`, but every string has exactly
  `COPY4_LEN` = 4 characters over `COPY4_ALPHABET` = "abcde" ("bdac=" -> "bdac"; 625 strings, about 1/8 of
  them held out). A fixed length puts each answer character at the same distance from its source in the
  prompt, which a tiny random-init model can discover by RL in a few hundred steps; a random model still
  earns ~0.2 per position by chance. Scored by `copy_reward`.
- `arith`: single-digit addition ("3+4=" -> "7"), scored by the same `copy_reward` (verifier "copy").
- `tool-lookup`: needs a tool (docs/multi-turn.md, configs/tools-cpu.yaml). The prompt is a key, one of
  `TOOL_LOOKUP_KEYS` ("B"); the answer is a random `TOOL_LOOKUP_LEN`-letter value over `COPY4_ALPHABET` ("dbe")
  held in the row's hidden `table` ({"B": "dbe"}), never in the prompt: it differs per row, so it is only
  obtainable by a `B?` call to the `lookup` tool with the prompt's key (another key is an error). The row's
  `env` column routes it to `tool_lookup_tiny`. Scored by `copy_reward`. A (key, value) pair belongs to one split.
- `arith-l1` ... `arith-l5` and `word-problems-l0`, `word-problems-l1`, `word-problems`: math questions for real (chat) models with `\\boxed{}` answers,
  scored by the `math` verifier (`rlvr.data.math_tasks`).

Invariants:
- Train and test splits are disjoint: every task item (string or operand pair) belongs to exactly one split,
  decided by a stable hash of the item, independent of any seed.
- The test split is deterministic: it ignores `seed` (so eval numbers are comparable across seeds).
- Rows carry `prompt`, `ground_truth` and `verifier` ("copy"; `tool-lookup` rows also `env` and `table`); the same (task, split, num_rows, seed) always
  gives the same rows.
- `copy_reward` is pure and returns a float in [0, 1]; 1.0 needs the exact string and, when the finish reason is
  known, a stop right after it.
"""

from __future__ import annotations

import hashlib
import itertools
import random
from typing import Any

from rlvr.data.math_tasks import MATH_TASKS, math_rows

COPY_ALPHABET = "abcdef"
"""Small alphabet: a random model hits the right character often enough to get partial credit."""
COPY_MIN_LEN = 3
COPY_MAX_LEN = 6
COPY4_ALPHABET = "abcde"
COPY4_LEN = 4
COPY_VERIFIER = "copy"
"""Verifier name the built-in tasks route to (the rewards registry maps it to `copy_reward`)."""
TOOL_LOOKUP_KEYS = "ABCD"
TOOL_LOOKUP_LEN = 3
TOOL_LOOKUP_ENV = "tool_lookup_tiny"
TOOL_LOOKUP_CHARS = "?!="
"""The compact call marker, the rendering of a failed call and the observation's closing delimiter
(rlvr/envs/builtin.py `tool_lookup_tiny`)."""
BUILTIN_TASKS: tuple[str, ...] = ("copy", "copy4", "arith", "tool-lookup", *MATH_TASKS)
"""Names accepted after `builtin:`."""

_TEST_SEED = 1234567
_TEST_FRACTION_PER_256 = 32  # 1/8 of the items are held out for the test split


def _stable_bucket(item: str) -> int:
    """A byte of sha256(item): stable across processes (unlike Python's salted hash())."""
    return hashlib.sha256(item.encode()).digest()[0]


def _is_test_item(item: str) -> bool:
    return _stable_bucket(item) < _TEST_FRACTION_PER_256


def _check(name: str, split: str) -> None:
    if name not in BUILTIN_TASKS:
        raise ValueError(f"unknown built-in task {name!r}; known: {', '.join(BUILTIN_TASKS)} (use builtin:<task>)")
    if split not in ("train", "test"):
        raise ValueError(f"built-in task {name!r} has splits 'train' and 'test', not {split!r}")


def _copy_spec(name: str) -> tuple[str, int, int]:
    """(alphabet, min length, max length) of a copy-family task."""
    if name == "copy4":
        return COPY4_ALPHABET, COPY4_LEN, COPY4_LEN
    return COPY_ALPHABET, COPY_MIN_LEN, COPY_MAX_LEN


def _copy_string(rng: random.Random, name: str) -> str:
    alphabet, min_len, max_len = _copy_spec(name)
    length = rng.randint(min_len, max_len)
    return "".join(rng.choice(alphabet) for _ in range(length))


def _copy_rows(split: str, num_rows: int, rng: random.Random, name: str = "copy") -> list[dict[str, Any]]:
    want_test = split == "test"
    rows: list[dict[str, Any]] = []
    while len(rows) < num_rows:
        s = _copy_string(rng, name)
        if _is_test_item(s) != want_test:
            continue
        rows.append({"prompt": f"{s}=", "ground_truth": s, "verifier": COPY_VERIFIER})
    return rows


def _arith_items(split: str) -> list[tuple[int, int]]:
    want_test = split == "test"
    return [(a, b) for a, b in itertools.product(range(10), range(10)) if _is_test_item(f"{a}+{b}") == want_test]


def _arith_rows(split: str, num_rows: int, rng: random.Random) -> list[dict[str, Any]]:
    items = _arith_items(split)
    rows: list[dict[str, Any]] = []
    for _ in range(num_rows):
        a, b = rng.choice(items)
        rows.append({"prompt": f"{a}+{b}=", "ground_truth": str(a + b), "verifier": COPY_VERIFIER})
    return rows


def _tool_lookup_rows(split: str, num_rows: int, rng: random.Random) -> list[dict[str, Any]]:
    want_test = split == "test"
    rows: list[dict[str, Any]] = []
    while len(rows) < num_rows:
        key = rng.choice(TOOL_LOOKUP_KEYS)
        value = "".join(rng.choice(COPY4_ALPHABET) for _ in range(TOOL_LOOKUP_LEN))
        if _is_test_item(f"{key}:{value}") != want_test:
            continue
        rows.append(
            {
                "prompt": key,
                "ground_truth": value,
                "verifier": COPY_VERIFIER,
                "env": TOOL_LOOKUP_ENV,
                "table": {key: value},
            }
        )
    return rows


def builtin_rows(name: str, split: str, num_rows: int, seed: int) -> list[dict[str, Any]]:
    """`num_rows` rows of built-in task `name` for `split` ("train" or "test").

    Train rows depend on `seed`; test rows do not (a fixed seed keeps eval identical across runs).
    """
    _check(name, split)
    if num_rows < 0:
        raise ValueError(f"num_rows must be >= 0, got {num_rows}")
    rng = random.Random(_TEST_SEED if split == "test" else (seed * 1_000_003 + 17))
    if name in ("copy", "copy4"):
        return _copy_rows(split, num_rows, rng, name)
    if name in MATH_TASKS:
        return math_rows(name, split, num_rows, rng)
    if name == "tool-lookup":
        return _tool_lookup_rows(split, num_rows, rng)
    return _arith_rows(split, num_rows, rng)


def builtin_corpus(name: str) -> list[str]:
    """Text lines to train the tiny tokenizer on: prompts followed by answers, plus every character alone.

    Deterministic. Covers every character a row of either split can contain, so each is one token.
    """
    _check(name, "train")
    if name in MATH_TASKS:
        rows = math_rows(name, "train", 300, random.Random(_TEST_SEED + 1))
        text = [row["prompt"] + " " + row["ground_truth"] for row in rows] + [r"\boxed{}"]
        return sorted({ch for line in text for ch in line}) + text
    if name == "tool-lookup":
        rows = _tool_lookup_rows("train", 200, random.Random(_TEST_SEED + 1))
        chars = list(TOOL_LOOKUP_KEYS + COPY4_ALPHABET + TOOL_LOOKUP_CHARS)
        return chars + [f"{r['prompt']}\n{r['prompt']}?\n{r['ground_truth']}=\n{r['ground_truth']}" for r in rows]
    if name in ("copy", "copy4"):
        chars = list(_copy_spec(name)[0]) + ["="]
    else:
        chars = [str(d) for d in range(10)] + ["+", "="]
    lines = list(chars)
    rng = random.Random(_TEST_SEED + 1)
    rows = _copy_rows("train", 500, rng, name) if name in ("copy", "copy4") else _arith_rows("train", 200, rng)
    lines.extend(row["prompt"] + row["ground_truth"] for row in rows)
    return lines


def copy_reward(completion_text: str, metadata: dict[str, Any]) -> float:
    """Partial-credit copy score in [0, 1] that also asks the answer to END in the right place.

    After stripping surrounding whitespace from both, positions i where completion[i] == target[i] each earn a
    point (the target is `metadata["ground_truth"]`, converted with str()). When the engine reports how the
    completion ended (`metadata["finish_reason"]`, passed by the trainer and `rlvr eval`), the end is one more
    slot: a point when the completion stopped (EOS or a stop string, finish_reason "stop") right after exactly
    len(target) characters. The score is points / (max(len(target), len(completion)) + 1), so 1.0 means "the
    exact string, then stop", and a completion that runs on to the token limit can never score 1. Without a
    finish reason (plain text, `rlvr reward`) the end slot is left out: points / max(len(target),
    len(completion)). An overlong completion is penalised by the larger denominator either way. Two empty
    strings score 1.
    """
    target = str(metadata.get("ground_truth", "")).strip()
    completion = completion_text.strip()
    matches = sum(1 for c, t in zip(completion, target) if c == t)
    finish = metadata.get("finish_reason")
    denom = max(len(target), len(completion))
    if finish is None:
        return 1.0 if denom == 0 else matches / denom
    ended_right = finish == "stop" and len(completion) == len(target)
    return (matches + int(ended_right)) / (denom + 1)
