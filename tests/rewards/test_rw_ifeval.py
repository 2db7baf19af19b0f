"""Table-driven tests of the IFEval-style checker: one positive and one negative case per constraint type."""

import json

import pytest

from rlvr.rewards.ifeval import check_constraint, constraint_types, parse_constraints
from rlvr.rewards.registry import get_reward

CASES = [
    # (constraint, passing text, failing text)
    ({"type": "keywords:existence", "keywords": ["tea", "cup"]}, "A cup of Tea.", "A cup of coffee."),
    ({"type": "keywords:forbidden_words", "forbidden_words": ["bad"]}, "All good.", "That is BAD."),
    ({"type": "keywords:frequency", "keyword": "cat", "frequency": 2, "relation": "at least"}, "cat cat", "cat"),
    (
        {"type": "keywords:letter_frequency", "letter": "z", "let_frequency": 2, "let_relation": "less than"},
        "zoo",
        "zzz",
    ),
    ({"type": "length_constraints:number_words", "num_words": 3, "relation": "less than"}, "one two", "one two three"),
    ({"type": "length_constraints:number_sentences", "num_sentences": 2, "relation": "at least"}, "Hi. Bye.", "Hi."),
    ({"type": "length_constraints:number_paragraphs", "num_paragraphs": 2}, "a\n***\nb", "a b"),
    (
        {
            "type": "length_constraints:nth_paragraph_first_word",
            "num_paragraphs": 2,
            "nth_paragraph": 2,
            "first_word": "then",
        },
        "First.\n\nThen more.",
        "First.\n\nAnd more.",
    ),
    ({"type": "detectable_format:json_format"}, '```json\n{"a": [1, {"b": 2}]}\n```', "{a: 1}"),
    ({"type": "detectable_format:number_bullet_lists", "num_bullets": 2}, "* a\n* b", "* a\n* b\n* c"),
    (
        {"type": "detectable_format:multiple_sections", "section_spliter": "Section", "num_sections": 2},
        "Section 1\nx\nSection 2\ny",
        "Section 1\nx",
    ),
    ({"type": "detectable_format:title"}, "<<My Title>>\ntext", "My Title\ntext"),
    ({"type": "detectable_format:number_highlighted_sections", "num_highlights": 2}, "*a* and *b*", "*a* only"),
    ({"type": "detectable_format:constrained_response"}, "My answer is yes.", "Yes."),
    ({"type": "detectable_content:postscript", "postscript_marker": "P.S."}, "Hi.\nP.S. bye", "Hi. bye"),
    ({"type": "detectable_content:number_placeholders", "num_placeholders": 2}, "[name] at [place]", "[name]"),
    ({"type": "change_case:english_lowercase"}, "all lower case", "Not lower"),
    ({"type": "change_case:english_capital"}, "ALL CAPS", "Not caps"),
    (
        {"type": "change_case:capital_word_frequency", "capital_frequency": 2, "capital_relation": "at least"},
        "THE BIG dog",
        "The BIG dog",
    ),
    ({"type": "startend:quotation"}, '"quoted"', 'not "quoted"'),
    ({"type": "startend:end_checker", "end_phrase": "Any questions?"}, "Done. Any questions?", "Any questions? Done."),
    ({"type": "punctuation:no_comma"}, "no commas here", "a, b"),
    ({"type": "combination:repeat_prompt", "prompt_to_repeat": "Say hi"}, "Say hi. Hi!", "Hi!"),
    ({"type": "combination:two_responses"}, "one\n******\ntwo", "one\n******\none"),
]


def test_at_least_15_types():
    assert len(constraint_types()) >= 15
    assert {c["type"].split(":")[-1] for c, _, _ in CASES} == set(constraint_types())


@pytest.mark.parametrize("constraint,good,bad", CASES, ids=[c["type"] for c, _, _ in CASES])
def test_constraint(constraint, good, bad):
    assert check_constraint(good, constraint)
    assert not check_constraint(bad, constraint)
    short = {**constraint, "type": constraint["type"].split(":")[-1]}  # prefix optional
    assert check_constraint(good, short)


def test_fraction_after_reasoning():
    spec = [
        {"type": "no_comma"},
        {"type": "english_lowercase"},
        {"type": "number_words", "num_words": 3, "relation": "at least"},
    ]
    fn = get_reward("ifeval").fn
    assert fn("<think>Hmm, WELL</think>fine by me", {"ground_truth": spec}) == 1.0
    assert fn("<think>ok</think>Fine, by me", {"ground_truth": spec}) == pytest.approx(1 / 3)
    assert fn("<think>fine by me now</think>", {"ground_truth": spec}) == pytest.approx(
        1 / 3
    )  # empty answer: only no_comma
    assert fn("", {"ground_truth": spec}) == pytest.approx(1 / 3)
    assert fn("<think>only thinking", {"ground_truth": json.dumps(spec)}) == pytest.approx(1 / 3)


def test_adversarial_inputs():
    fn = get_reward("ifeval").fn
    spec = [{"type": "json_format"}, {"type": "number_words", "num_words": 10, "relation": "at least"}]
    assert fn("word " * 20000, {"ground_truth": spec}) == 0.5  # 100 kB
    assert fn('{"a": {"b": {"c": "日本語"}}}', {"ground_truth": spec}) == 0.5  # unicode, nested braces
    assert fn("{{{{}}}}", {"ground_truth": spec}) == 0.0


def test_ifeval_native_format_and_errors():
    spec = {
        "instruction_id_list": ["punctuation:no_comma", "detectable_format:title"],
        "kwargs": [{}, {"unused": None}],
    }
    assert parse_constraints(spec) == [
        {"type": "punctuation:no_comma"},
        {"type": "detectable_format:title", "unused": None},
    ]
    assert get_reward("ifeval").fn("<<t>> x", {"ground_truth": spec}) == 1.0
    assert get_reward("ifeval").fn("x", {}) is None
    with pytest.raises(ValueError, match="unknown constraint type"):
        get_reward("ifeval").fn("x", {"ground_truth": [{"type": "dance"}]})
    with pytest.raises(ValueError, match="bad arguments"):
        get_reward("ifeval").fn("x", {"ground_truth": [{"type": "no_comma", "what": 1}]})
