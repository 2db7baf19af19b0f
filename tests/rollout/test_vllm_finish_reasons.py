"""vLLM's finish reasons as rlvr's: only vLLM's own "abort" is an abort (an episode restarts, then is unscored); any
other reason ("error", "repetition", one added later) is a truncation, so a policy cannot leave a low score that
way. Pure mapping: runs without vllm."""

from __future__ import annotations

import pytest

from rlvr.rollout.vllm_engine import finish_reason


@pytest.mark.parametrize(
    ("reason", "ours"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("abort", "abort"),
        ("repetition", "length"),
        ("error", "length"),
        (None, "length"),
    ],
)
def test_finish_reasons(reason: str, ours: str) -> None:
    assert finish_reason(reason) == ours
