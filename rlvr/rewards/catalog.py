"""What `rlvr reward --list` prints and docs/rewards.md holds: every built-in reward function, its parameters,
what it scores, and an example row with the score it gets.

The summary line is the function's own docstring and the parameters its signature, so neither can drift from
the code; the examples are scored by the real functions in a test (tests/rewards/test_rw_catalog.py), which
also fails when a built-in has no example here. `python -m rlvr.rewards.catalog --write docs/rewards.md`
regenerates the doc page.
"""

from __future__ import annotations

import inspect
import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.rewards.registry import get_reward, known_rewards


@dataclass(frozen=True)
class Example:
    """A row to score: the completion, its metadata (row fields), params, and the score the function gives."""

    completion: str
    metadata: dict[str, Any]
    score: float
    params: dict[str, Any] = field(default_factory=dict)
    note: str = ""


_CODE = "```python\ndef add(a, b):\n    return a + b\n```"
EXAMPLES: dict[str, Example] = {
    "math": Example(
        "6 x 7 = 42, so the answer is \\boxed{42}",
        {"ground_truth": "42"},
        1.0,
        note="math-verify equivalence: 0.5, 1/2 and \\frac{1}{2} match",
    ),
    "math_boxed_strict": Example("<think>6 x 7 = 42</think> The answer is \\boxed{42}", {"ground_truth": "42"}, 1.0),
    "gsm8k": Example("Each box holds 6, so 7 boxes hold 42", {"ground_truth": "#### 42"}, 1.0),
    "exact_match": Example("Paris.", {"ground_truth": "paris"}, 1.0, note="case, punctuation and articles ignored"),
    "f1": Example(
        "the city of Paris",
        {"ground_truth": "Paris"},
        0.5,
        note="articles dropped: 'city of paris' vs 'paris' is precision 1/3, recall 1; best over the golds",
    ),
    "copy": Example(
        "bdac",
        {"ground_truth": "bdac", "finish_reason": "stop"},
        1.0,
        note="the built-in copy tasks' verifier: a point per right character, one for stopping",
    ),
    "code": Example(
        _CODE,
        {"tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 5"]},
        0.5,
        note="runs in the sandbox; `tests` is a list of Python statements",
    ),
    "code_binary": Example(_CODE, {"tests": ["assert add(1, 2) == 3"]}, 1.0),
    "ifeval": Example(
        "no commas here at all",
        {"ground_truth": [{"type": "no_comma"}, {"type": "number_words", "num_words": 10, "relation": "at least"}]},
        0.5,
        note="one of two constraints met; constraint types: see the list below",
    ),
    "format_think_answer": Example("<think>6 x 7</think><answer>42</answer>", {}, 1.0),
    "format_partial": Example("<think>6 x 7</think> 42", {}, 0.5),
    "tag_count": Example("<think>\n6 x 7\n</think>\n<answer>\n42\n</answer>", {}, 1.0),
    "reasoning_steps": Example("Step 1: 6 x 7. Step 2: that is 42.", {}, 2 / 3),
    "length": Example(
        "\\boxed{42}",
        {"ground_truth": "42"},
        0.49,
        {"max_tokens": 100},
        note="scores correctness with `verifier` first: a wrong or unscorable answer (no ground "
        "truth, e.g. 'hello world') gets min(0, lambda) = 0 while short; length is in tokens, "
        "or words for raw text (1 here)",
    ),
    "cosine_length": Example(
        "\\boxed{41}",
        {"ground_truth": "42"},
        -0.999876640091433,
        {"max_tokens": 100},
        note="wrong and short: close to min_value_wrong",
    ),
    "soft_overlong": Example(
        "word " * 95,
        {},
        -0.5,
        {"max_tokens": 100, "cache_tokens": 10},
        note="95 words: halfway into the 10-token buffer",
    ),
    "repetition": Example("the cat sat the cat sat the cat sat", {}, -4 / 7),
}


def _params(name: str) -> list[str]:
    sig = inspect.signature(get_reward(name).fn)
    return [
        f"{p.name}={p.default!r}" for p in list(sig.parameters.values())[2:] if p.default is not inspect.Parameter.empty
    ]


def _summary(name: str) -> str:
    doc = inspect.getdoc(get_reward(name).fn) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def _command(name: str, ex: Example) -> str:
    """The `rlvr reward` line for an example whose metadata is at most a ground truth, else None-like ''."""
    if set(ex.metadata) - {"ground_truth", "finish_reason"} or not isinstance(ex.metadata.get("ground_truth", ""), str):
        return ""
    cmd = ["rlvr", "reward", "--fn", name, "--completion", ex.completion]
    if "ground_truth" in ex.metadata:
        cmd += ["--reference", ex.metadata["ground_truth"]]
    if ex.params:
        cmd += ["--params", *[f"{name}.{k}={json.dumps(v)}" for k, v in ex.params.items()]]
    return shlex.join(cmd)


def ifeval_lines() -> list[str]:
    from rlvr.rewards.ifeval import constraint_arguments, constraint_types

    return [f"  {t}({', '.join(constraint_arguments(t))})" for t in constraint_types()]


def catalog_lines(names: list[str] | None = None) -> list[str]:
    """The `--list` text: one block per reward function (all registered ones when `names` is None)."""
    lines: list[str] = []
    for name in names or known_rewards():
        spec = get_reward(name)
        lines += [f"{name}", f"  scores   {_summary(name)}"]
        params = _params(name)
        lines.append(f"  params   {', '.join(params) if params else '(none)'}")
        lines.append(f"  correct  when the score is >= {spec.max_score:g} (if this is the primary function)")
        ex = EXAMPLES.get(name)
        if ex is not None:
            row = {"completion": ex.completion, **ex.metadata}
            lines.append(
                f"  example  {json.dumps(row, ensure_ascii=False)}"
                + (f" with params {json.dumps(ex.params)}" if ex.params else "")
                + f" -> {ex.score:.4g}"
            )
            cmd = _command(name, ex)
            if cmd:
                lines.append(f"           {cmd}")
            if ex.note:
                lines.append(f"  note     {ex.note}")
        lines.append("")
    lines += ['ifeval constraint types (a row\'s `ground_truth` or `constraints`: a list of {"type": ..., args}):']
    lines += ifeval_lines()
    lines += [
        "",
        "Scores of None (no ground truth for the row) are left out of the total. Params go on the command "
        "line as --params fn.key=value, in a config as rewards.functions[i].params.",
    ]
    return lines


def markdown() -> str:
    """docs/rewards.md: the catalog as a page."""
    head = [
        "# Reward functions",
        "",
        "Generated by `python -m rlvr.rewards.catalog --write docs/rewards.md` from the "
        "registered functions (the same text as `rlvr reward --list`); a test fails when it is stale.",
        "",
        "```",
    ]
    return "\n".join(head + catalog_lines() + ["```", ""])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        Path(sys.argv[2]).write_text(markdown())
    else:
        print("\n".join(catalog_lines()))
