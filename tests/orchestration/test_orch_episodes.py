"""`rlvr train` runs environment episodes end to end: the real driver on a local Ray cluster, the tiny CPU model,
rows of the lookup task routed to `tool_lookup` by their `env` column (compact tool calls), tools in the verifier
actors' pools. Two training steps and an eval; then start-up errors in the `env` section exit 2 naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from rlvr.envs.tasks import lookup_rows


def _write_rows(path: Path, split: str, n: int) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in lookup_rows(split, n, seed=3)))


def _config(tmp_path: Path, **env: object) -> Path:
    train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    _write_rows(train, "train", 8)
    _write_rows(test, "test", 2)
    cfg = {
        "data": {"datasets": [str(train)], "max_prompt_tokens": 96},
        "eval": {"datasets": [str(test)], "every_n_steps": 2, "max_prompts": 2},
        "generation": {"num_samples": 2, "max_new_tokens": 8},
        "rollout": {"prompts_per_step": 2, "async_steps": 1, "filter_zero_variance": False},
        "learner": {"pack_length": 320},
        "env": {
            "tool_format": "compact",
            "params": {"instructions": "Answer."},
            "max_turns": 2,
            "max_tokens_per_turn": 8,
            "max_total_tokens": 320,
            "tool_timeout_s": 2.0,
            **env,
        },
        "checkpoint": {"output_dir": str(tmp_path / "runs"), "save_final": False},
        "logging": {"console_progress": False, "num_logged_samples": 4},
        "num_steps": 2,
    }
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(config: Path, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rlvr.cli", "train", "--config", str(config), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_train_runs_two_steps_of_tool_episodes(tmp_path: Path) -> None:
    proc = _train(_config(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [m for m in records if m["step"] > 0]  # step 0: the baseline eval's record
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["env/episodes"] == 4  # 2 prompts x 2 episodes, every one ended with a counted reason
        assert sum(v for k, v in m.items() if k.startswith("env/end_reason/")) == 4
        assert 1 <= m["env/turns_mean"] <= 2 and "env/observation_token_share_mean" in m
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]
    assert samples and all(s["turns"] and s["turns"][0]["role"] == "assistant" for s in samples)
    assert all(t["role"] in ("assistant", "tool") for s in samples for t in s["turns"])
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines() if line.strip()]
    assert [e["step"] for e in evals] == [0, 2] and all("eval/reward_mean" in e for e in evals)


def test_env_errors_at_start_exit_2_naming_the_field(tmp_path: Path) -> None:
    unknown = _train(_config(tmp_path, name="no_such_env"))
    assert unknown.returncode == 2 and "--env.name" in unknown.stderr and "no_such_env" in unknown.stderr
    too_long = _train(_config(tmp_path, max_total_tokens=4096), "--learner.pack-length", "4096")
    assert too_long.returncode == 2, too_long.stderr[-2000:]
    assert "--env.max-total-tokens" in too_long.stderr and "context" in too_long.stderr


def test_tools_cpu_preset_trains_from_a_fresh_clone(tmp_path: Path) -> None:
    """`rlvr train --config configs/tools-cpu.yaml` needs no preparation: its `builtin:tool-lookup` rows are made in
    code and routed to `tool_lookup_tiny` by their `env` column; two steps, evals at 0 and 2."""
    config = Path(__file__).resolve().parents[2] / "configs" / "tools-cpu.yaml"
    flags = ["--num-steps", "2", "--rollout.prompts-per-step", "2", "--generation.num-samples", "4"]
    flags += ["--eval.every-n-steps", "2", "--eval.max-prompts", "4", "--checkpoint.save-final", "False"]
    flags += ["--checkpoint.output-dir", str(tmp_path / "runs"), "--logging.console-progress", "False"]
    proc = _train(config, *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [m for m in records if m["step"] > 0]
    assert [m["step"] for m in steps] == [1, 2]
    for m in steps:
        assert m["env/episodes"] == 8  # 2 prompts x 4 episodes, each ended with a counted reason
        assert sum(v for k, v in m.items() if k.startswith("env/end_reason/")) == 8
        assert 1 <= m["env/turns_mean"] <= 2
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line.strip()]
    assert samples and all(s["turns"] and s["turns"][0]["role"] == "assistant" for s in samples)
    assert all(s["prompt"] in "ABCD" for s in samples)  # the prompt is a key, never the answer
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines() if line.strip()]
    assert [e["step"] for e in evals] == [0, 2] and all(0 <= e["eval/reward_mean"] <= 1.1 for e in evals)
