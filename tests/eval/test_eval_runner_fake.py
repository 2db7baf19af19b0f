"""`evaluate` with a scripted engine and the real reward scorer: rows, pass@k / maj@k and breakdown keys."""

from __future__ import annotations

import pytest

from rlvr.eval.metrics import maj_at_k, pass_at_k
from rlvr.eval.runner import evaluate, summarize_groups
from rlvr.rewards import RewardScorer, RewardsSettings
from rlvr.rewards.pool import VerifierPool
from rlvr.types import Group, PromptRequest, Sample

SCRIPT = {  # prompt_id -> completions (gsm8k verifier, gold in metadata)
    "arith:0:0": ["#### 4", "#### 5", "the answer is 4", "\\boxed{4}"],
    "arith:1:0": ["#### 7", "no idea", "#### 7", "#### 9"],
    "copy:0:0": ["abc", "abd", "abc", "abc"],
}


class ScriptedEngine:
    """Returns SCRIPT's completions, shuffled out of order, like an engine finishing groups in any order."""

    def generate(self, requests: list[PromptRequest], timeout_s: float = 600) -> list[Sample]:
        out = []
        for req in reversed(requests):
            for j, text in reversed(list(enumerate(SCRIPT[req.prompt_id][: req.num_samples]))):
                out.append(
                    Sample(
                        prompt_id=req.prompt_id,
                        sample_index=j,
                        prompt_token_ids=[1, 2],
                        completion_token_ids=list(range(len(text))),
                        completion_text=text,
                        logprobs=[0.0] * len(text),
                        finish_reason="length" if j == 1 else "stop",
                        version_start=3,
                        version_end=3,
                        metadata=dict(req.metadata),
                    )
                )
        return out


def _requests() -> list[PromptRequest]:
    return [
        PromptRequest(
            "arith:0:0",
            [1],
            4,
            metadata={"ground_truth": "4", "verifier": "gsm8k", "dataset": "arith"},
            prompt_text="2+2?",
        ),
        PromptRequest(
            "arith:1:0",
            [1],
            4,
            metadata={"ground_truth": "7", "verifier": "gsm8k", "dataset": "arith"},
            prompt_text="3+4?",
        ),
        PromptRequest(
            "copy:0:0", [1], 4, metadata={"ground_truth": "abc", "verifier": "exact_match"}, prompt_text="copy abc"
        ),
    ]


def test_evaluate_rows_and_summary() -> None:
    scorer = RewardScorer(RewardsSettings())
    summary, rows = evaluate(ScriptedEngine(), _requests(), scorer, ks=(1, 2, 4, 8))
    assert [(r["prompt_id"], r["sample_index"]) for r in rows][:5] == [
        ("arith:0:0", 0),
        ("arith:0:0", 1),
        ("arith:0:0", 2),
        ("arith:0:0", 3),
        ("arith:1:0", 0),
    ]
    assert rows[0]["prompt"] == "2+2?" and rows[0]["dataset"] == "arith" and rows[8]["dataset"] == "copy"
    correct = {pid: [r["correct"] for r in rows if r["prompt_id"] == pid] for pid in SCRIPT}
    expected = sum(pass_at_k(4, sum(map(bool, c)), 2) for c in correct.values()) / 3
    assert summary["pass@2"] == pytest.approx(expected)
    assert summary["pass@1"] == pytest.approx(summary["correct_rate"])
    assert "pass@8" not in summary and summary["num_prompts"] == 3 and summary["num_samples"] == 12
    answers = [r["answer"] for r in rows if r["prompt_id"] == "copy:0:0"]
    assert summary["dataset/copy/maj@4"] == pytest.approx(maj_at_k(answers, correct["copy:0:0"], 4)) == 1.0
    assert summary["truncated_rate"] == pytest.approx(0.25) and summary["stop_rate"] == pytest.approx(0.75)
    assert "reward/gsm8k_mean" in summary and "reward/exact_match_mean" in summary
    assert summary["dataset/arith/reward/gsm8k_mean"] == pytest.approx(summary["reward/gsm8k_mean"])
    assert summary["completion_len_max"] == max(r["completion_len"] for r in rows)


def test_evaluate_with_verifier_pool_matches_scorer() -> None:
    settings = RewardsSettings(num_workers=1)
    direct, _ = evaluate(ScriptedEngine(), _requests(), RewardScorer(settings), ks=(1, 4))
    with VerifierPool(settings) as pool:
        pooled, _ = evaluate(ScriptedEngine(), _requests(), pool, ks=(1, 4))
    assert pooled == pytest.approx(direct)


def test_summarize_groups_prefixes_and_matches_evaluate() -> None:
    scorer = RewardScorer(RewardsSettings())
    summary, _ = evaluate(ScriptedEngine(), _requests(), scorer, ks=(1, 4))
    samples = ScriptedEngine().generate(_requests())
    groups: dict[str, Group] = {}
    for s in sorted(samples, key=lambda s: (s.prompt_id, s.sample_index)):
        groups.setdefault(s.prompt_id, Group(s.prompt_id, [])).samples.append(s)
    for g in groups.values():
        g.rewards = [scorer.score(s.completion_text, s.metadata) for s in g.samples]
    prefixed, rows = summarize_groups(list(groups.values()), ks=(1, 4))
    assert prefixed == pytest.approx({"eval/" + k: v for k, v in summary.items()}) and len(rows) == 12
    with pytest.raises(ValueError, match="score them first"):
        summarize_groups([Group("x", samples[:2])])
