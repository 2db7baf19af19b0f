"""Bad input to `rlvr train` gives a clear error (exit 2, naming file/row/field/name) or a counted skip; never a hang."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
FAST = [
    "--eval.every-n-steps",
    "0",
    "--eval.at-step-0",
    "False",
    "--logging.console-progress",
    "False",
    "--rollout.prompts-per-step",
    "4",
    "--generation.num-samples",
    "4",
    "--num-steps",
    "2",
]


def _train(tmp_path: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "rlvr.cli",
        "train",
        "--checkpoint.output-dir",
        str(tmp_path / "runs"),
        "--logging.run-name",
        "bad",
        *FAST,
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def test_missing_column_lists_every_bad_row(tmp_path):
    out = _train(tmp_path, "--data.datasets", "builtin:copy", str(FIXTURES / "bad_rows.jsonl"))
    assert out.returncode == 2, out.stderr[-2000:]
    err = out.stderr
    assert "bad_rows.jsonl" in err
    for line in ("2", "3", "4", "5", "6"):  # 1-based lines of the bad rows (every one, not just the first)
        assert f"bad_rows.jsonl:{line}" in err, err[-2000:]
    assert "prompt" in err and "ground_truth" in err


def test_empty_dataset_is_an_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = _train(tmp_path, "--data.datasets", "builtin:copy", str(empty))
    assert out.returncode == 2
    assert "empty.jsonl" in out.stderr and "empty" in out.stderr.lower()


def test_unknown_verifier_in_a_row_names_it(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "ab=", "ground_truth": "ab", "verifier": "no_such_verifier"}) + "\n")
    out = _train(tmp_path, "--data.datasets", "builtin:copy", str(data))
    assert out.returncode == 2
    assert "no_such_verifier" in out.stderr and "rows.jsonl:1" in out.stderr


def test_unknown_reward_function_in_config_names_it(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("rewards:\n  functions:\n    - {name: no_such_reward}\n")
    out = _train(tmp_path, "--config", str(preset))
    assert out.returncode == 2
    assert "no_such_reward" in out.stderr and "math" in out.stderr  # lists known names


def test_model_path_without_config_is_an_error(tmp_path):
    out = _train(tmp_path, "--model.path", str(tmp_path))
    assert out.returncode == 2 and "config.json" in out.stderr


@pytest.mark.slow
def test_too_long_prompts_are_skipped_and_counted(tmp_path, ray_cluster):
    data = tmp_path / "mixed.jsonl"
    rows = [{"prompt": "abc=", "ground_truth": "abc", "verifier": "copy"} for _ in range(30)]
    rows += [{"prompt": "abcdef" * 10 + "=", "ground_truth": "x", "verifier": "copy"} for _ in range(10)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = _train(
        tmp_path,
        "--data.datasets",
        "builtin:copy",
        str(data),
        "--data.weights",
        "0.0",
        "1.0",
        "--data.max-prompt-tokens",
        "16",
        "--data.apply-chat-template",
        "False",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    last = json.loads((tmp_path / "runs" / "bad" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["data/prompts_dropped_too_long"] > 0
    assert last["data/prompts_pulled"] == sum(
        last[f"data/prompts_{k}"]
        for k in ("trained", "filtered", "dropped_stale", "dropped_too_long", "skipped_bad_row", "failed", "in_flight")
    )
