"""Throughput of the VerifierPool on 10k math completions, with 1 and N workers; prints ONE JSON line.

The completions mimic GRPO groups: 1,250 prompts x 8 samples (see `make_items` for the mix), each with a
reasoning block in front. Worker start-up is excluded (the pool
is warmed with one batch first); each figure is completions per second of wall time for `score_many`.

Usage: python bench/rewards.py [--num 10000] [--workers N]  (N defaults to the CPU count)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

from rlvr.rewards.pool import VerifierPool
from rlvr.rewards.scorer import RewardsSettings


def make_items(num: int) -> list[tuple[str, dict, list[int]]]:
    """GRPO-like groups of 8: half the prompts have integer golds (GSM8K / most of MATH), half fractions.

    Per group: 3 boxed correct answers in the gold's form, 1 in an equivalent other form (needs sympy), 1 plain
    "the answer is N", 1 equation "x = ...", 2 wrong boxed expressions (need sympy).
    """
    items = []
    for i in range(num):
        prompt, sample = divmod(i, 8)
        a, b = prompt % 97 + 1, prompt % 13 + 2
        integer = prompt % 2 == 0
        gold = str(a * b) if integer else rf"\frac{{{a}}}{{{b}}}"
        if sample < 3:
            answer = rf"\boxed{{{gold}}}"
        elif sample == 3:
            answer = rf"\boxed{{{a} \cdot {b}}}" if integer else rf"\boxed{{\frac{{{2 * a}}}{{{2 * b}}}}}"
        elif sample == 4:
            answer = f"The answer is {a * b}" if integer else f"The answer is {a / b:.6f}"
        elif sample == 5:
            answer = rf"so $x = {gold}$"
        else:
            answer = rf"\boxed{{\sqrt{{{a}}} + {b + sample}}}"
        text = "<think>" + f"Let me compute {a} and {b}. " * 20 + "</think>" + answer
        items.append((text, {"verifier": "math", "ground_truth": gold}, list(range(200))))
    return items


def throughput(items: list, num_workers: int) -> tuple[float, float]:
    settings = RewardsSettings(num_workers=num_workers, timeout_s=10.0, max_queue=1024)
    with VerifierPool(settings) as pool:
        pool.score_many(items[:64])  # warm-up: worker start-up and imports are not measured
        start = time.perf_counter()
        results = pool.score_many(items)
        elapsed = time.perf_counter() - start
    correct = sum(bool(r.correct) for r in results) / len(results)
    return len(items) / elapsed, correct


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    items = make_items(args.num)
    one, correct = throughput(items, 1)
    many, _ = throughput(items, args.workers)
    print(
        json.dumps(
            {
                "bench": "rewards.pool.math",
                "num_completions": args.num,
                "completions_per_s_1_worker": round(one, 1),
                f"completions_per_s_{args.workers}_workers": round(many, 1),
                "num_workers": args.workers,
                "speedup": round(many / one, 2),
                "correct_rate": round(correct, 3),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
            }
        )
    )


if __name__ == "__main__":
    main()
