"""Registry and composite scorer: routing, weights, primary/correct, None handling, errors."""

import sys
from pathlib import Path

import pytest

from rlvr.rewards.registry import get_reward, known_rewards, register_reward
from rlvr.rewards.scorer import RewardFunctionSpec, RewardScorer, RewardsSettings

sys.path.insert(0, str(Path(__file__).parent))

BUILTINS = {
    "math",
    "math_boxed_strict",
    "gsm8k",
    "ifeval",
    "code",
    "code_binary",
    "format_think_answer",
    "format_partial",
    "tag_count",
    "reasoning_steps",
    "length",
    "cosine_length",
    "soft_overlong",
    "repetition",
    "exact_match",
    "f1",
}


def test_builtins_registered():
    assert BUILTINS <= set(known_rewards())


def test_unknown_name_lists_known():
    with pytest.raises(ValueError, match=r"unknown reward function 'nope'; known: .*math"):
        RewardScorer(RewardsSettings(functions=[RewardFunctionSpec("nope")]))


def test_bad_params_raise_at_build():
    with pytest.raises(ValueError, match="bad params"):
        RewardScorer(RewardsSettings(functions=[RewardFunctionSpec("repetition", params={"ngram": 2})]))


def test_register_and_import_path():
    @register_reward("rw_test_len")
    def rw_test_len(completion_text, metadata, scale: float = 1.0):
        return scale * len(completion_text)

    scorer = RewardScorer(
        RewardsSettings(
            functions=[RewardFunctionSpec("rw_test_len", 0.5, {"scale": 2.0}), RewardFunctionSpec("rw_helpers:crash")]
        )
    )
    result = scorer.score("abc", {})
    assert result.scores == {"rw_test_len": 6.0, "rw_helpers:crash": 0.5}
    assert result.total == pytest.approx(3.5) and result.correct is None and result.status == "ok"
    assert get_reward("rw_helpers:hang").fn("x", {}) == 1.0


def test_routing_weights_and_primary():
    scorer = RewardScorer(
        RewardsSettings(functions=[RewardFunctionSpec("format_partial", 0.5), RewardFunctionSpec("gsm8k", 2.0)])
    )
    result = scorer.score("<think>a</think> 12", {"verifier": ["math", "gsm8k"], "ground_truth": ["7", "12"]})
    # gsm8k is configured and routed: scored once, weight 2, with its paired ground truth.
    assert result.scores == {"format_partial": 0.5, "gsm8k": 1.0, "math": 0.0}
    assert result.total == pytest.approx(0.25 + 2.0 + 0.0)
    assert result.correct is False  # primary defaults to the first routed verifier, math


def test_routed_twice_and_custom_column():
    scorer = RewardScorer(RewardsSettings(verifier_column="dataset", primary="gsm8k"))
    result = scorer.score("12", {"dataset": ["gsm8k", "gsm8k"], "ground_truth": ["12", "13"]})
    assert result.scores == {"gsm8k": 1.0, "gsm8k#1": 0.0} and result.total == 1.0 and result.correct is True


def test_none_scores_and_all_none():
    scorer = RewardScorer(RewardsSettings(functions=[RewardFunctionSpec("math"), RewardFunctionSpec("tag_count")]))
    r = scorer.score("no gold", {})
    assert r.scores == {"math": None, "tag_count": 0.0} and r.total == 0.0
    r = RewardScorer(RewardsSettings(functions=[RewardFunctionSpec("math")])).score("x", {})
    assert r.total is None and r.status == "ok"


def test_unknown_routed_verifier_is_row_error():
    scorer = RewardScorer(RewardsSettings())
    r = scorer.score("x", {"verifier": ["gsm8k", "made_up"], "ground_truth": ["1", "2"]})
    assert r.status == "error" and "made_up" in r.error and "known:" in r.error
    assert r.scores == {"gsm8k": 0.0, "made_up": None} and r.total == 0.0


def test_raising_function_is_row_error():
    scorer = RewardScorer(RewardsSettings(functions=[RewardFunctionSpec("rw_helpers:crash")]))
    r = scorer.score("raise", {})
    assert r.status == "error" and "RuntimeError: boom" in r.error and r.total is None


def test_from_config_duck_typed():
    class Fn:
        name, weight, params = "gsm8k", 3.0, {}

    class Cfg:
        functions = [Fn()]
        verifier_column = "v"
        num_workers = 1
        timeout_s = 2.0
        max_queue = 8
        primary = None
        custom = ["rw_helpers"]

    settings = RewardsSettings.from_config(Cfg())
    assert settings.functions[0].weight == 3.0 and settings.verifier_column == "v" and settings.max_queue == 8
    assert RewardScorer(Cfg()).score("1", {"ground_truth": "1"}).total == 3.0
    assert RewardsSettings.from_config({"functions": [{"name": "f1"}]}).functions[0].name == "f1"
