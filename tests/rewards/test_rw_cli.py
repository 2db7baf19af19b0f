"""`rlvr reward` (run_reward): single completion, JSONL in/out, usage errors, and `python -m` entry."""

import json
import subprocess
import sys

from rlvr.rewards.cli import RewardArgs, run_reward


def test_single_completion(capsys):
    rc = run_reward(RewardArgs(fn=["math"], reference="42", completion=r"so \boxed{42}", num_workers=0))
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["scores"] == {"math": 1.0} and out["total"] == 1.0 and out["correct"] is True
    assert out["status"] == "ok"


def test_jsonl_with_pool(tmp_path, capsys):
    rows = [
        {"completion": r"\boxed{2}", "verifier": "math", "ground_truth": "2"},
        {"completion": "7", "verifier": "gsm8k", "ground_truth": "8", "completion_token_ids": [1, 2]},
        {"completion": "x", "verifier": "nope"},
    ]
    src, dst = tmp_path / "rows.jsonl", tmp_path / "scored.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    rc = run_reward(
        RewardArgs(
            input=str(src),
            output=str(dst),
            fn=["soft_overlong"],
            weights=[1.0],
            params=["soft_overlong.max_tokens=2", "soft_overlong.cache_tokens=1"],
            num_workers=1,
        )
    )
    assert rc == 2  # a row failed to score (unknown verifier): every row is still written
    scored = [json.loads(line) for line in dst.read_text().splitlines()]
    assert scored[0]["scores"] == {"soft_overlong": 0.0, "math": 1.0}
    assert scored[1]["scores"] == {"soft_overlong": -1.0, "gsm8k": 0.0} and scored[1]["ground_truth"] == "8"
    assert scored[2]["status"] == "error"
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == 3 and summary["status"] == {"ok": 2, "error": 1}


def test_usage_errors(capsys):
    assert run_reward(RewardArgs(completion="x")) == 2
    assert run_reward(RewardArgs(fn=["nope"], completion="x", num_workers=0)) == 2
    assert run_reward(RewardArgs(fn=["math"], completion="x", params=["math.zzz=1"], num_workers=0)) == 2
    assert "unknown reward function 'nope'" in capsys.readouterr().err


def test_module_entry_point():
    proc = subprocess.run(
        [sys.executable, "-m", "rlvr.rewards.cli", "--fn", "gsm8k", "--reference", "#### 5", "--completion", "it is 5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "scores": {"gsm8k": 1.0},
        "total": 1.0,
        "correct": True,
        "status": "ok",
        "error": None,
        "elapsed_s": json.loads(proc.stdout)["elapsed_s"],
    }


def test_no_heavy_imports():
    code = (
        "import sys, rlvr.rewards.pool, rlvr.rewards.cli, rlvr.rewards.builtin\n"
        "bad = [m for m in ('ray', 'vllm', 'deepspeed', 'wandb', 'torch') if m in sys.modules]\n"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
