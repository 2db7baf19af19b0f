"""`rlvr eval` on a checkpoint of a real tiny CPU run reproduces the in-training eval at that step.

Same run config (requests, per-prompt seeds, rewards), same weights -> the same sampled completions, so every
metric both compute is equal. The eval is sampled (k = 4, temperature 1), so equal rewards and lengths mean
equal samples, not just equal greedy argmaxes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.config import default_config, from_dict, validate
from rlvr.eval.cli import EvalArgs, run_eval

LEGACY = {"reward/total_mean": "eval/reward_mean"}
"""Summary key -> the trainer's basic-eval key, where the two differ."""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_rlvr_eval_reproduces_in_training_eval(tmp_path: Path, ray_cluster: str) -> None:
    from rlvr.orchestration.run import train

    cfg = validate(
        from_dict(
            {
                "rollout": {"prompts_per_step": 4},
                "generation": {"num_samples": 4},
                "eval": {"every_n_steps": 2, "at_step_0": False, "num_samples": 4, "greedy": False, "max_prompts": 8},
                "checkpoint": {"output_dir": str(tmp_path), "save_final": True},
                "logging": {"run_name": "evalmatch", "console_progress": False},
                "num_steps": 2,
            },
            base=default_config(),
        )
    )
    assert train(cfg) == 0
    run = tmp_path / "evalmatch"
    logged = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    at_step = next(r for r in logged if r["step"] == 2)
    result = run_eval(EvalArgs(model=str(run / "checkpoints" / "step_2"), output=str(tmp_path / "eval_out")))
    assert (result["num_samples"], result["greedy"], result["seed"]) == (4, False, cfg.seed)
    mine = result["metrics"]
    compared = {}
    for key, value in mine.items():
        for theirs in ("eval/" + key, LEGACY.get(key), "eval/" + key.removeprefix("reward/")):
            if theirs and theirs in at_step:
                compared[key] = (value, at_step[theirs])
                break
    assert {"pass@1", "reward/total_mean", "completion_len_mean", "stop_rate", "num_prompts"} <= set(compared)
    for key, (value, logged_value) in compared.items():
        assert value == pytest.approx(logged_value, rel=1e-9, abs=1e-12), key
