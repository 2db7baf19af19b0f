"""Table-driven tests of shaping/format rewards and string matchers."""

import math

import pytest

from rlvr.rewards.registry import get_reward

BIG = "word " * 20000

GOOD = "<think>\nreason\n</think>\n<answer>\n42\n</answer>"

CASES = [
    # (name, completion, metadata, params, expected)
    ("format_think_answer", GOOD, {}, {}, 1.0),
    ("format_think_answer", "<think>a</think><answer>b</answer>", {}, {}, 1.0),
    ("format_think_answer", "<think>a</think> text <answer>b</answer>", {}, {}, 0.0),
    ("format_think_answer", "<think>a</think><answer>b</answer><answer>c</answer>", {}, {}, 0.0),
    ("format_think_answer", "<think><think>a</think></think><answer>b</answer>", {}, {}, 0.0),
    ("format_think_answer", "", {}, {}, 0.0),
    ("format_think_answer", BIG, {}, {}, 0.0),
    ("format_partial", GOOD, {}, {}, 1.0),
    ("format_partial", "<think>a", {}, {}, 0.25),
    ("format_partial", "<think>a</think>", {}, {}, 0.5),
    ("format_partial", "<think>a</think><answer>b", {}, {}, 0.75),
    ("format_partial", "x<think>a</think><answer>b</answer>", {}, {}, 0.0),
    ("format_partial", "", {}, {}, 0.0),
    ("format_partial", "<think>日本</think><answer>{{b}}</answer>", {}, {}, 1.0),
    ("tag_count", GOOD, {}, {}, 1.0),
    ("tag_count", "<think>\nx\n</think>\n", {}, {}, 0.5),
    ("tag_count", "", {}, {}, 0.0),
    ("reasoning_steps", "Step 1: a\nStep 2: b\nStep 3: c", {}, {}, 1.0),
    ("reasoning_steps", "First, a. Finally, b.", {}, {}, 2 / 3),
    ("reasoning_steps", "just an answer", {}, {}, 0.0),
    ("reasoning_steps", "", {}, {"num_steps": 1}, 0.0),
    ("soft_overlong", "x", {"completion_token_ids": [0] * 100}, {"max_tokens": 200, "cache_tokens": 50}, 0.0),
    ("soft_overlong", "x", {"completion_token_ids": [0] * 175}, {"max_tokens": 200, "cache_tokens": 50}, -0.5),
    ("soft_overlong", "x", {"completion_token_ids": [0] * 300}, {"max_tokens": 200, "cache_tokens": 50}, -1.0),
    ("soft_overlong", "a " * 175, {}, {"max_tokens": 200, "cache_tokens": 50}, -0.5),  # word-count fallback
    ("repetition", "a b c d e f", {}, {}, 0.0),
    ("repetition", "a b c a b c a b c", {}, {}, -(1 - 3 / 7)),
    ("repetition", "a b", {}, {}, 0.0),
    ("repetition", "", {}, {}, 0.0),
    ("repetition", BIG, {}, {"max_penalty": -0.5}, -0.5 * (1 - 1 / 19998)),
    (
        "length",
        r"\boxed{1}",
        {"ground_truth": "1", "completion_token_ids": [0] * 10},
        {"min_tokens": 10, "max_tokens": 110},
        0.5,
    ),
    (
        "length",
        r"\boxed{1}",
        {"ground_truth": "1", "completion_token_ids": [0] * 110},
        {"min_tokens": 10, "max_tokens": 110},
        -0.5,
    ),
    (
        "length",
        r"\boxed{2}",
        {"ground_truth": "1", "completion_token_ids": [0] * 10},
        {"min_tokens": 10, "max_tokens": 110},
        0.0,
    ),
    (
        "length",
        r"\boxed{2}",
        {"ground_truth": "1", "completion_token_ids": [0] * 110},
        {"min_tokens": 10, "max_tokens": 110},
        -0.5,
    ),
    (
        "length",
        "x",
        {"completion_token_ids": [0] * 60, "group_min_tokens": 10, "group_max_tokens": 110},
        {"verifier": "none"},
        0.0,
    ),
    ("cosine_length", r"\boxed{1}", {"ground_truth": "1", "completion_token_ids": []}, {"max_tokens": 100}, 1.0),
    ("cosine_length", r"\boxed{1}", {"ground_truth": "1", "completion_token_ids": [0] * 100}, {"max_tokens": 100}, 0.5),
    ("cosine_length", r"\boxed{2}", {"ground_truth": "1", "completion_token_ids": []}, {"max_tokens": 100}, -1.0),
    (
        "cosine_length",
        r"\boxed{2}",
        {"ground_truth": "1", "completion_token_ids": [0] * 500},
        {"max_tokens": 100},
        -0.5,
    ),
    ("exact_match", "<answer>The Eiffel Tower!</answer>", {"ground_truth": "eiffel tower"}, {}, 1.0),
    ("exact_match", "<think><answer>Paris</answer></think>Lyon", {"ground_truth": "Paris"}, {}, 0.0),
    ("exact_match", "Paris", {"ground_truth": ["London", "paris"]}, {}, 1.0),
    ("exact_match", "", {"ground_truth": "Paris"}, {}, 0.0),
    ("exact_match", "Zürich", {"ground_truth": "zürich"}, {}, 1.0),
    ("f1", "<answer>the big red dog</answer>", {"ground_truth": "big dog"}, {}, 2 * (2 / 3) * 1 / (2 / 3 + 1)),
    ("f1", "cat", {"ground_truth": "dog"}, {}, 0.0),
    ("f1", "", {"ground_truth": "dog"}, {}, 0.0),
    ("f1", BIG, {"ground_truth": "word"}, {}, 2 * (1 / 20000) / (1 / 20000 + 1)),
]


@pytest.mark.parametrize(
    "name,completion,metadata,params,expected", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_shaping(name, completion, metadata, params, expected):
    assert get_reward(name).fn(completion, metadata, **params) == pytest.approx(expected)


def test_cosine_midpoint_is_cosine():
    fn = get_reward("cosine_length").fn
    value = fn("x", {"completion_token_ids": [0] * 25}, max_tokens=100, verifier="none")
    assert value == pytest.approx(0.5 + 0.25 * (1 + math.cos(math.pi / 4)))


@pytest.mark.parametrize("name", ["exact_match", "f1"])
def test_no_gold_is_none(name):
    assert get_reward(name).fn("x", {}) is None
