"""bench/resummarize.py: earlier bench output re-summarized from the metrics files beside it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
G = ROOT / "docs" / "gpu-results"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "resummarize.py"), *args], capture_output=True, text=True, timeout=120
    )


def _step(i: int, t: float) -> dict:
    return {
        "step": i,
        "time": t,
        "time/step": 1.0,
        "time/train": 2.0,
        "time/generation": 5.0,
        "time/wait_generation": 0.1,
        "time/reward": 0.01,
        "time/sync": 0.1,
        "sync/bytes": 1e9,
        "rollout/num_samples": 256,
        "rollout/prompt_len_mean": 5,
        "rollout/completion_len_mean": 512,
    }


def test_rewrites_rlvr_lines_and_the_summary_from_the_metrics(tmp_path: Path) -> None:
    """A colocated async-1 run whose second step came 2 s after the warm-up (rollouts made during it) and then
    every 6.5 s: the old line averaged the fast step in; the new one is the steady state, and the TRL ratio in
    the summary follows. Other lines are kept; a second pass changes nothing."""
    rows = [_step(i + 1, t) for i, t in enumerate([0.0, 2.0, 8.5, 15.0, 21.5, 28.0])]
    (tmp_path / "colocate1-base-1-2.metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = [
        {
            "kind": "setup",
            "card": "NVIDIA H200",
            "shape": "qwen2.5-0.5b",
            "peak_flops": 989e12,
            "N_matmul": 5e8,
            "L": 24,
            "d": 896,
            "vocab": 151936,
        },
        {
            "kind": "rlvr",
            "config": "colocate1",
            "tag": "base",
            "shape": "qwen2.5-0.5b",
            "card": "NVIDIA H200",
            "gpus": 1,
            "learners": 1,
            "engines": 1,
            "colocate": True,
            "async_steps": 1,
            "extra": "",
            "rc": 0,
            "peak_mem_gib": {"0": 60.0},
            "tokens_per_s_per_gpu": 24000.0,
        },
        {"kind": "trl", "tokens_per_s_per_gpu": 10000.0, "step_wall_s": 13.2},
        {"kind": "summary", "card": "NVIDIA H200", "shape": "qwen2.5-0.5b", "elapsed_s": 400.0, "rlvr_trl_ratio": 2.4},
    ]
    f = tmp_path / "bench.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in lines))
    proc = _run("--write", str(f))
    assert proc.returncode == 0, proc.stderr
    new = [json.loads(x) for x in f.read_text().splitlines()]
    run = next(r for r in new if r["kind"] == "rlvr")
    assert run["step_walls_s"] == [6.5, 6.5, 6.5, 6.5] and run["steps_skipped"] == 2
    assert run["tokens_per_s_per_gpu"] == round(256 * 517 / 6.5, 1) and run["peak_mem_gib"] == {"0": 60.0}
    summary = new[-1]
    assert summary["kind"] == "summary" and summary["elapsed_s"] == 400.0
    assert summary["rlvr_trl_ratio"] == round(run["tokens_per_s_per_gpu"] / 10000.0, 3)
    assert [r["kind"] for r in new] == ["setup", "rlvr", "trl", "summary"]
    before = f.read_text()
    assert _run("--write", str(f)).returncode == 0 and f.read_text() == before


def test_committed_runs_are_already_resummarized(tmp_path: Path) -> None:
    """The committed W2 bench files are in the current method: re-summarizing them changes no figure."""
    for name, runs in [
        ("w2_split4_1.5b_4xH200", {}),
        ("w2_lean_split2_1.5b_2xH200", {t: f"w2_split2_1.5b_{t}_2xH200" for t in ("plain", "lean", "staged")}),
    ]:
        shutil.copy(G / f"{name}.jsonl", tmp_path / f"{name}.jsonl")
        args = [str(tmp_path / f"{name}.jsonl")]
        for tag, m in runs.items():
            args += ["--metrics", f"split2_async1:{tag}={G / (m + '.metrics.jsonl')}"]
        if not runs:
            args += ["--metrics", f"split4_async1:base={G / (name + '.metrics.jsonl')}"]
        proc = _run(*args)
        assert proc.returncode == 0, proc.stderr
        old = [json.loads(x) for x in (G / f"{name}.jsonl").read_text().splitlines()]
        new = [json.loads(x) for x in proc.stdout.splitlines()]
        figs = lambda ls: [(r.get("tag"), r.get("tokens_per_s_per_gpu")) for r in ls if r.get("kind") == "rlvr"]  # noqa: E731
        assert figs(new) == figs(old) and figs(old)


def test_bad_input_exits_2_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"kind": "setup"}\nnot json\n')
    proc = _run(str(bad))
    assert proc.returncode == 2 and "x.jsonl:2" in proc.stderr
    other = tmp_path / "y.jsonl"
    other.write_text('{"a": 1}\n')
    proc = _run(str(other))
    assert proc.returncode == 2 and "not bench/gpu_grpo.py output" in proc.stderr
    assert _run(str(tmp_path / "absent.jsonl")).returncode == 2
    assert _run("--metrics", "nokey", str(other)).returncode == 2
