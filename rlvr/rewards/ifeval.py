"""`ifeval`: IFEval-style instruction-following constraints; reward = fraction of constraints satisfied.

Constraint spec (the row's `metadata["ground_truth"]`, or `metadata["constraints"]`), a list of dicts:

    [{"type": "number_words", "num_words": 100, "relation": "at least"},
     {"type": "keywords:existence", "keywords": ["tea", "cup"]}]

`type` is a checker name below, with or without IFEval's group prefix ("length_constraints:number_words" and
"number_words" are the same). The other keys are the checker's keyword arguments, named as in IFEval
(google-research/instruction_following_eval), so IFEval / RLVR-IFeval rows work unchanged. The IFEval form
`{"instruction_id_list": [...], "kwargs": [...]}` and a JSON string of either form are accepted too.
`relation` is "less than", "at least", "at most" or "exactly".

Checkers: existence, forbidden_words, frequency, letter_frequency, number_words, number_sentences,
number_paragraphs, nth_paragraph_first_word, json_format, number_bullet_lists, multiple_sections, title,
number_highlighted_sections, constrained_response, postscript, number_placeholders, english_lowercase,
english_capital, capital_word_frequency, quotation, end_checker, no_comma, repeat_prompt, two_responses.
(`response_language` is not implemented: it needs a language detector.)

Invariants: the checked text is the one after the reasoning block; an unknown type or a malformed spec
raises ValueError (a data error, reported as status "error" by the scorer); the score is in [0, 1].
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from rlvr.rewards.answer_text import final_answer_text
from rlvr.rewards.registration import register_reward

Checker = Callable[..., bool]
_CHECKERS: dict[str, Checker] = {}


def _checker(name: str) -> Callable[[Checker], Checker]:
    def decorator(fn: Checker) -> Checker:
        _CHECKERS[name] = fn
        return fn

    return decorator


def _compare(value: int, target: int, relation: str) -> bool:
    relation = relation.strip().lower()
    if relation in ("less than", "<"):
        return value < target
    if relation in ("at least", ">="):
        return value >= target
    if relation in ("at most", "<="):
        return value <= target
    if relation in ("exactly", "=="):
        return value == target
    raise ValueError(f"unknown relation {relation!r}: use 'less than', 'at least', 'at most' or 'exactly'")


def _words(text: str) -> list[str]:
    return re.findall(r"\b\w+\b", text)


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", text.strip()) if s.strip()]


@_checker("existence")
def _existence(text: str, keywords: list[str]) -> bool:
    return all(re.search(re.escape(k), text, re.IGNORECASE) for k in keywords)


@_checker("forbidden_words")
def _forbidden(text: str, forbidden_words: list[str]) -> bool:
    return not any(re.search(r"\b" + re.escape(w) + r"\b", text, re.IGNORECASE) for w in forbidden_words)


@_checker("frequency")
def _frequency(text: str, keyword: str, frequency: int, relation: str) -> bool:
    count = len(re.findall(re.escape(keyword), text, re.IGNORECASE))
    return _compare(count, frequency, relation)


@_checker("letter_frequency")
def _letter_frequency(text: str, letter: str, let_frequency: int, let_relation: str) -> bool:
    return _compare(text.lower().count(letter.lower()), let_frequency, let_relation)


@_checker("number_words")
def _number_words(text: str, num_words: int, relation: str) -> bool:
    return _compare(len(_words(text)), num_words, relation)


@_checker("number_sentences")
def _number_sentences(text: str, num_sentences: int, relation: str) -> bool:
    return _compare(len(_sentences(text)), num_sentences, relation)


@_checker("number_paragraphs")
def _number_paragraphs(text: str, num_paragraphs: int) -> bool:
    parts = re.split(r"\s?\*\*\*\s?", text)
    if any(not p.strip() for p in parts[1:-1]):  # an empty paragraph between two separators
        return False
    return len([p for p in parts if p.strip()]) == num_paragraphs


@_checker("nth_paragraph_first_word")
def _nth_paragraph_first_word(text: str, num_paragraphs: int, nth_paragraph: int, first_word: str) -> bool:
    paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
    if len(paragraphs) != num_paragraphs or not 1 <= nth_paragraph <= len(paragraphs):
        return False
    words = _words(paragraphs[nth_paragraph - 1])
    return bool(words) and words[0].lower() == first_word.lower()


@_checker("json_format")
def _json_format(text: str) -> bool:
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json|Json|JSON)?\s*(.*?)\s*```", body, re.DOTALL)
    if fenced:
        body = fenced.group(1)
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


@_checker("number_bullet_lists")
def _number_bullets(text: str, num_bullets: int) -> bool:
    bullets = re.findall(r"^\s*[\*\-]\s+\S", text, re.MULTILINE)
    return len(bullets) == num_bullets


@_checker("multiple_sections")
def _multiple_sections(text: str, section_spliter: str, num_sections: int) -> bool:
    parts = re.split(r"\s?" + re.escape(section_spliter) + r"\s?\d+\s?", text)
    return len(parts) - 1 >= num_sections


@_checker("title")
def _title(text: str) -> bool:
    return any(t.strip() for t in re.findall(r"<<([^\n]+?)>>", text))


@_checker("number_highlighted_sections")
def _highlights(text: str, num_highlights: int) -> bool:
    single = [h for h in re.findall(r"(?<!\*)\*([^\n\*]+)\*(?!\*)", text) if h.strip()]
    double = [h for h in re.findall(r"\*\*([^\n\*]+)\*\*", text) if h.strip()]
    return len(single) + len(double) >= num_highlights


_CONSTRAINED = ("My answer is yes.", "My answer is no.", "My answer is maybe.")


@_checker("constrained_response")
def _constrained(text: str) -> bool:
    return any(option in text.strip() for option in _CONSTRAINED)


@_checker("postscript")
def _postscript(text: str, postscript_marker: str) -> bool:
    marker = postscript_marker.strip()
    pattern = r"\s*p\.\s?p\.?\s?s.*$" if marker.lower() == "p.p.s" else r"\s*" + re.escape(marker.lower()) + r".*$"
    return bool(re.search(pattern, text.lower(), re.MULTILINE))


@_checker("number_placeholders")
def _placeholders(text: str, num_placeholders: int) -> bool:
    return len(re.findall(r"\[[^\[\]\n]+\]", text)) >= num_placeholders


@_checker("english_lowercase")
def _lowercase(text: str) -> bool:
    return bool(text.strip()) and text == text.lower()


@_checker("english_capital")
def _capital(text: str) -> bool:
    return bool(text.strip()) and text == text.upper()


@_checker("capital_word_frequency")
def _capital_words(text: str, capital_frequency: int, capital_relation: str) -> bool:
    count = len([w for w in _words(text) if w.isupper() and any(c.isalpha() for c in w)])
    return _compare(count, capital_frequency, capital_relation)


@_checker("quotation")
def _quotation(text: str) -> bool:
    body = text.strip()
    return len(body) > 1 and body[0] == '"' and body[-1] == '"'


@_checker("end_checker")
def _end_checker(text: str, end_phrase: str) -> bool:
    return text.strip().strip('"').lower().endswith(end_phrase.strip().lower())


@_checker("no_comma")
def _no_comma(text: str) -> bool:
    return "," not in text


@_checker("repeat_prompt")
def _repeat_prompt(text: str, prompt_to_repeat: str) -> bool:
    return text.strip().lower().startswith(prompt_to_repeat.strip().lower())


@_checker("two_responses")
def _two_responses(text: str) -> bool:
    parts = text.split("******")
    if len(parts) != 2:
        return False
    first, second = parts[0].strip(), parts[1].strip()
    return bool(first) and bool(second) and first != second


def constraint_types() -> list[str]:
    """Names of the implemented constraint checkers."""
    return sorted(_CHECKERS)


def constraint_arguments(name: str) -> list[str]:
    """The keyword arguments a constraint type takes (IFEval's names), for `rlvr reward --list`."""
    import inspect

    return list(inspect.signature(_CHECKERS[name]).parameters)[1:]


def parse_constraints(spec: Any) -> list[dict[str, Any]]:
    """Normalise a constraint spec (module docstring) to a list of {"type": ..., **kwargs} dicts."""
    if isinstance(spec, str):
        spec = json.loads(spec)
    if isinstance(spec, dict) and "instruction_id_list" in spec:
        kwargs_list = spec.get("kwargs") or [{} for _ in spec["instruction_id_list"]]
        spec = [{"type": t, **(k or {})} for t, k in zip(spec["instruction_id_list"], kwargs_list, strict=True)]
    if isinstance(spec, dict):
        spec = [spec]
    if not isinstance(spec, list) or not all(isinstance(c, dict) and "type" in c for c in spec):
        raise ValueError(f"ifeval: constraints must be a list of {{'type': ..., **kwargs}} dicts, got {spec!r:.200}")
    return spec


def check_constraint(text: str, constraint: dict[str, Any]) -> bool:
    """Whether `text` satisfies one constraint; ValueError for an unknown type or wrong kwargs."""
    kind = str(constraint["type"]).rsplit(":", 1)[-1]
    checker = _CHECKERS.get(kind)
    if checker is None:
        raise ValueError(
            f"ifeval: unknown constraint type {constraint['type']!r}; known: {', '.join(constraint_types())}"
        )
    kwargs = {k: v for k, v in constraint.items() if k != "type" and v is not None}
    try:
        return bool(checker(text, **kwargs))
    except TypeError as e:
        raise ValueError(f"ifeval: bad arguments for {constraint['type']!r}: {e}") from e


@register_reward("ifeval")
def ifeval_reward(completion_text: str, metadata: dict) -> float | None:
    """Fraction of the row's constraints that the answer (text after the reasoning block) satisfies."""
    spec = metadata.get("constraints", metadata.get("ground_truth"))
    if spec is None:
        return None
    constraints = parse_constraints(spec)
    if not constraints:
        return None
    text = final_answer_text(completion_text).strip()
    return sum(check_constraint(text, c) for c in constraints) / len(constraints)
