"""Locating the answer inside a completion: the text after the reasoning block, `\\boxed{}` contents, tags.

Invariants (shared by every verifier, so that "an answer inside the reasoning block only" scores 0 everywhere):
- `final_answer_text` drops everything up to the last `</think>`. A completion that opens `<think>` and never
  closes it has no answer (empty string): the model ran out of tokens while still reasoning.
- Completions without think tags are answers in full.
- All functions here are linear-time in the input (no backtracking regexes over model output).
"""

from __future__ import annotations

import re

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def final_answer_text(text: str) -> str:
    """The part of `text` after the reasoning block (see the module invariants)."""
    close = text.rfind(THINK_CLOSE)
    if close >= 0:
        return text[close + len(THINK_CLOSE) :]
    if THINK_OPEN in text:
        return ""
    return text


def answer_tag_content(text: str) -> str | None:
    """The content of the last `<answer>...</answer>` pair, or None when there is none."""
    end = text.rfind("</answer>")
    if end < 0:
        return None
    start = text.rfind("<answer>", 0, end)
    if start < 0:
        return None
    return text[start + len("<answer>") : end]


def boxed_contents(text: str) -> list[str]:
    """Contents of every balanced `\\boxed{...}` / `\\fbox{...}` in order; unbalanced ones are skipped."""
    out: list[str] = []
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth = 1
        i = match.end()
        while i < len(text) and depth:
            c = text[i]
            if c == "\\" and i + 1 < len(text):  # an escaped brace \{ \} does not open or close the box
                i += 2
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            i += 1
        if depth == 0:
            out.append(text[match.end() : i - 1])
    return out


def last_boxed(text: str) -> str | None:
    """The content of the last balanced `\\boxed{}` in `text`, or None."""
    boxes = boxed_contents(text)
    return boxes[-1] if boxes else None


_NUMBER_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?|-?\.\d+")


def last_number(text: str) -> str | None:
    """The last number in `text` with thousands separators removed ("1,234.50" -> "1234.50"), or None."""
    matches = _NUMBER_RE.findall(text)
    return matches[-1].replace(",", "") if matches else None
