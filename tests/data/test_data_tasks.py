"""Built-in tasks: row shape, disjoint and deterministic splits, and the copy reward on hand cases."""

from __future__ import annotations

import pytest

from rlvr.data import BUILTIN_TASKS, builtin_corpus, builtin_rows, copy_reward
from rlvr.data.tasks import COPY4_ALPHABET, COPY4_LEN, COPY_ALPHABET, TOOL_LOOKUP_KEYS, TOOL_LOOKUP_LEN


def test_copy_rows_shape() -> None:
    rows = builtin_rows("copy", "train", 50, seed=0)
    assert len(rows) == 50
    for r in rows:
        assert set(r) == {"prompt", "ground_truth", "verifier"}
        assert r["verifier"] == "copy"
        assert r["prompt"] == r["ground_truth"] + "="
        assert 3 <= len(r["ground_truth"]) <= 6
        assert set(r["ground_truth"]) <= set(COPY_ALPHABET)


def test_copy4_rows_shape_and_held_out_size() -> None:
    rows = builtin_rows("copy4", "train", 200, seed=0)
    for r in rows:
        assert r["verifier"] == "copy"
        assert r["prompt"] == r["ground_truth"] + "="
        assert len(r["ground_truth"]) == COPY4_LEN
        assert set(r["ground_truth"]) <= set(COPY4_ALPHABET)
    # the demo evaluates on the first 64 test rows: enough distinct held-out strings to measure copying
    assert len({r["prompt"] for r in builtin_rows("copy4", "test", 64, seed=0)}) >= 40
    # the tokenizer corpus covers exactly the task's characters (a character-level vocabulary when unmerged)
    assert set("".join(builtin_corpus("copy4"))) == set(COPY4_ALPHABET) | {"="}


def _item(task: str, row: dict) -> object:
    """What a split owns: the prompt; for `tool-lookup` (4 prompts, one per key) the (key, answer) pair."""
    return (row["prompt"], row["ground_truth"]) if task == "tool-lookup" else row["prompt"]


@pytest.mark.parametrize("task", BUILTIN_TASKS)
def test_splits_disjoint_and_test_deterministic(task: str) -> None:
    train = {_item(task, r) for r in builtin_rows(task, "train", 2000, seed=3)}
    test = builtin_rows(task, "test", 200, seed=3)
    assert train.isdisjoint(_item(task, r) for r in test)
    assert builtin_rows(task, "test", 200, seed=99) == test  # the test split ignores the seed
    assert builtin_rows(task, "train", 20, seed=1) == builtin_rows(task, "train", 20, seed=1)
    assert builtin_rows(task, "train", 20, seed=1) != builtin_rows(task, "train", 20, seed=2)


def test_arith_rows() -> None:
    for r in builtin_rows("arith", "train", 30, seed=0):
        a, b = r["prompt"].rstrip("=").split("+")
        assert r["ground_truth"] == str(int(a) + int(b))


def test_corpus_covers_every_character() -> None:
    corpus = "".join(builtin_corpus("copy"))
    chars = set("".join(r["prompt"] for r in builtin_rows("copy", "test", 200, 0)))
    assert chars <= set(corpus)


def test_unknown_task_and_split() -> None:
    with pytest.raises(ValueError, match="unknown built-in task"):
        builtin_rows("nope", "train", 1, 0)
    with pytest.raises(ValueError, match="splits"):
        builtin_rows("copy", "validation", 1, 0)


@pytest.mark.parametrize(
    ("completion", "target", "expected"),
    [
        ("abc", "abc", 1.0),
        (" abc\n", "abc", 1.0),  # surrounding whitespace is stripped
        ("abd", "abc", 2 / 3),
        ("abcabc", "abc", 3 / 6),  # overlong answers are penalised
        ("ab", "abcd", 2 / 4),
        ("cba", "abc", 1 / 3),
        ("", "abc", 0.0),
        ("", "", 1.0),
        ("xyz", "abc", 0.0),
    ],
)
def test_copy_reward_hand_cases(completion: str, target: str, expected: float) -> None:
    assert copy_reward(completion, {"ground_truth": target}) == pytest.approx(expected)


def test_copy_reward_numeric_ground_truth() -> None:
    assert copy_reward("13", {"ground_truth": 13}) == 1.0
    assert copy_reward("12", {"ground_truth": "13"}) == 0.5


@pytest.mark.parametrize(
    ("completion", "finish", "expected"),
    [
        ("bdac", "stop", 1.0),  # the exact string, then a stop: the only way to score 1
        ("bdac", "length", 4 / 5),  # right characters but cut at the token limit: no credit for the end
        ("bdab", "stop", 4 / 5),  # a wrong character; stopping after 4 characters still earns the end slot
        ("bda", "stop", 3 / 5),  # stopped one character early: the end slot is not earned
        ("bdacc", "stop", 4 / 6),  # ran on past the answer
        ("", "stop", 0.0),
        ("bdac", "abort", 4 / 5),
    ],
)
def test_copy_reward_asks_for_the_stop_when_the_finish_reason_is_known(
    completion: str, finish: str, expected: float
) -> None:
    assert copy_reward(completion, {"ground_truth": "bdac", "finish_reason": finish}) == pytest.approx(expected)


def test_scorer_passes_the_finish_reason_to_reward_functions() -> None:
    """The trainer's scoring path (driver) and `rlvr eval` (score_samples) put the engine's finish_reason into
    the metadata the reward functions see: a cut-off exact string is not `correct`."""
    import rlvr.rewards.builtin  # noqa: F401  (registers the built-in verifiers, "copy" among them)
    from rlvr.eval.runner import score_samples
    from rlvr.rewards.scorer import RewardScorer, RewardsSettings
    from rlvr.types import Sample

    def sample(text: str, finish: str) -> Sample:
        return Sample(
            prompt_id="p:0:0",
            sample_index=0,
            prompt_token_ids=[1],
            completion_token_ids=[2, 3, 4, 5, 0],
            completion_text=text,
            logprobs=[-0.1] * 5,
            finish_reason=finish,
            metadata={"ground_truth": "bdac", "verifier": "copy"},
            version_start=0,
            version_end=0,
        )

    scorer = RewardScorer(RewardsSettings())
    stopped, cut = score_samples(scorer, [sample("bdac", "stop"), sample("bdac", "length")])
    assert stopped.total == pytest.approx(1.0) and stopped.correct
    assert cut.total == pytest.approx(0.8) and not cut.correct


def test_tool_lookup_rows_need_the_tool() -> None:
    rows = builtin_rows("tool-lookup", "train", 400, seed=0)
    for r in rows:
        assert set(r) == {"prompt", "ground_truth", "verifier", "env", "table"}
        assert (r["verifier"], r["env"]) == ("copy", "tool_lookup_tiny")
        assert r["prompt"] in TOOL_LOOKUP_KEYS and set(r["table"]) == {r["prompt"]}
        assert r["ground_truth"] == r["table"][r["prompt"]] and len(r["ground_truth"]) == TOOL_LOOKUP_LEN
        assert set(r["ground_truth"]) <= set(COPY4_ALPHABET) and r["ground_truth"] not in r["prompt"]
    # the prompt does not determine the answer: the same key has many values across rows
    assert all(len({r["ground_truth"] for r in rows if r["prompt"] == k}) > 20 for k in TOOL_LOOKUP_KEYS)
    # every character of prompts, tables, calls ("B?") and failed-call observations ("!") is in the corpus
    corpus = set("".join(builtin_corpus("tool-lookup")))
    test = builtin_rows("tool-lookup", "test", 200, seed=0)
    texts = [r["prompt"] + "?" + "".join(r["table"].values()) for r in rows + test]
    assert set("".join(texts)) | {"!"} <= corpus
