"""`rlvr eval` runs episodes for rows routed to an environment (their `env` column), with the real transformers
engine on the tiny model and the tool jobs in a local verifier pool; rows without one are generated as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from rlvr.cli import main as rlvr_main
from rlvr.config import default_config
from rlvr.envs.base import Observation, StepResult
from rlvr.envs.registration import register_env
from rlvr.envs.tasks import lookup_rows
from rlvr.models.tiny import build_tiny_model_dir


class TwoTurnEnv:
    """Whatever the model says: an observation after the first turn, reward 1 after the second."""

    def __init__(self, **_: Any) -> None:
        self.steps = 0

    def reset(self, row: dict[str, Any]) -> Observation:
        return Observation(messages=[{"role": "user", "content": str(row["prompt"])}])

    def step(self, turn_text: str, turn_token_ids: list[int]) -> StepResult:
        self.steps += 1
        if self.steps == 2:
            return StepResult(None, {"two_turns": 1.0}, done=True)
        return StepResult(Observation(text="4821"))


register_env("two_turn_eval_test")(TwoTurnEnv)  # the data's env column names registered environments only


def test_rlvr_eval_runs_episodes_for_env_rows(tmp_path: Path) -> None:
    rows = lookup_rows("test", 3)
    for r in rows[:2]:
        r["env"] = "two_turn_eval_test"
    del rows[2]["env"]  # stays single-turn: scored by its verifier (math), wrong for a random model
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = [r["prompt"] for r in rows] + [r["ground_truth"] for r in rows]
    model = build_tiny_model_dir(default_config().model, corpus, tmp_path / "tiny", seed=0)
    stops = list(range(1, 200))  # a random model seldom emits EOS: most tokens end a turn
    cfg = {
        "data": {"apply_chat_template": False},
        "generation": {"stop_token_ids": stops, "max_new_tokens": 4},
        "env": {"max_turns": 3, "max_tokens_per_turn": 4, "max_total_tokens": 256},
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    args = ["eval", "--model", str(model), "--dataset", str(data), "--config", str(tmp_path / "cfg.yaml")]
    args += ["--num-samples", "2", "--device", "cpu", "--output", str(tmp_path / "out"), "--no-majority"]
    assert rlvr_main(args) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["metrics"]
    assert summary["num_prompts"] == 3 and summary["num_samples"] == 6
    completions = [json.loads(line) for line in (tmp_path / "out" / "completions.jsonl").read_text().splitlines()]
    totals = sorted(c["total"] for c in completions if c["total"] is not None)
    assert totals.count(1.0) == 4  # the 4 episodes earned their environment's reward, the 2 plain samples nothing
