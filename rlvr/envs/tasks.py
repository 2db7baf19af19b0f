"""The built-in lookup task for `tool_lookup`: answers only obtainable through the `lookup` tool.

Each row holds a hidden table of `num_entries` items ("item K3" -> a random 4-digit code) that is never shown in
the prompt. Kinds:
- "single": "What is the secret code of item K3?"; the answer is that code;
- "sum" (multi-step: two look-ups, then arithmetic): "What is the sum of the secret codes of items K3 and B7?".

Rows: `prompt`, `ground_truth` (the answer as a string), `verifier` ("math"), `env` ("tool_lookup"), `table`.

Invariants:
- Train and test are disjoint: a question (its kind and item names) belongs to one split by a stable hash of
  the question, independent of any seed; the test split ignores `seed`.
- Codes are drawn from the row's own generator, so a question's answer differs between rows and seeds: it
  cannot be memorised from the prompt, only looked up.
- The same (split, num_rows, seed, kind, num_entries) always gives the same rows.
"""

from __future__ import annotations

import hashlib
import random
import string
from typing import Any

ITEM_NAMES = [f"{letter}{digit}" for letter in string.ascii_uppercase for digit in range(10)]
TEST_SEED = 1_000_003


def _is_test(question: str) -> bool:
    return int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) % 8 == 0


def _question(kind: str, keys: list[str]) -> str:
    if kind == "single":
        return f"What is the secret code of item {keys[0]}?"
    return f"What is the sum of the secret codes of items {keys[0]} and {keys[1]}?"


def _row(rng: random.Random, split: str, kind: str, num_entries: int) -> dict[str, Any]:
    """One row of `split` (rejection-samples the question until it belongs to the split)."""
    num_keys = 1 if kind == "single" else 2
    while True:
        names = rng.sample(ITEM_NAMES, num_entries)
        question = _question(kind, names[:num_keys])
        if _is_test(question) == (split == "test"):
            break
    table = {f"item {name}": rng.randint(1000, 9999) for name in names}
    answer = sum(table[f"item {name}"] for name in names[:num_keys])
    shuffled = dict(sorted(table.items()))  # the asked items are not first in the table
    return {
        "prompt": question + " Put the final answer in \\boxed{}.",
        "ground_truth": str(answer),
        "verifier": "math",
        "env": "tool_lookup",
        "table": {k: str(v) for k, v in shuffled.items()},
    }


def lookup_rows(
    split: str, num_rows: int, seed: int = 0, kind: str = "single", num_entries: int = 4
) -> list[dict[str, Any]]:
    """`num_rows` rows of the lookup task (module docstring)."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if kind not in ("single", "sum"):
        raise ValueError(f"kind must be 'single' or 'sum', got {kind!r}")
    if not 2 <= num_entries <= len(ITEM_NAMES):
        raise ValueError(f"num_entries must be in [2, {len(ITEM_NAMES)}], got {num_entries}")
    rng = random.Random(TEST_SEED if split == "test" else seed)
    return [_row(rng, split, kind, num_entries) for _ in range(num_rows)]


def write_rows(out_dir: str, num_train: int, num_test: int, seed: int = 0, kind: str = "single") -> list[str]:
    """Write `train.jsonl` and `test.jsonl` of the lookup task under `out_dir` (data files for `tool_lookup`);
    returns the paths."""
    import json
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, n in (("train", num_train), ("test", num_test)):
        path = out / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in lookup_rows(split, n, seed, kind)))
        paths.append(str(path))
    return paths


if __name__ == "__main__":  # python -m rlvr.envs.tasks OUT_DIR [NUM_TRAIN NUM_TEST [KIND]]
    import sys

    argv = sys.argv[1:]
    if not argv:
        sys.exit("usage: python -m rlvr.envs.tasks OUT_DIR [NUM_TRAIN NUM_TEST [single|sum]]")
    print(
        "\n".join(
            write_rows(
                argv[0],
                int(argv[1]) if len(argv) > 1 else 2000,
                int(argv[2]) if len(argv) > 2 else 64,
                kind=argv[3] if len(argv) > 3 else "single",
            )
        )
    )
