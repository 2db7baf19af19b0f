"""bench/gpu_grpo.py's helpers and the GPU test harness, on CPU (nothing here touches a GPU).

GPU numbers in the GPU bench and the GPU test harness are indices among the GPUs the process was given
(CUDA_VISIBLE_DEVICES), so jobs started side by side on one host with different CUDA_VISIBLE_DEVICES stay on their
own GPUs. Before, both pinned their children to physical GPU 0 and 1: a bench given GPU 3 ran (and measured its
memory) on GPU 0 beside another job. And the bench's one line per run carries issue 14's W2 figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import gpu_grpo

    return gpu_grpo


@pytest.mark.parametrize(
    "visible, gpus, expect",
    [
        (None, [0], ["0"]),
        (None, [0, 1], ["0", "1"]),
        ("3", [0], ["3"]),
        ("2,3", [0, 1], ["2", "3"]),
        ("2, 3", [1], ["3"]),
        ("GPU-aaa,GPU-bbb", [1], ["GPU-bbb"]),
    ],
)
def test_bench_runs_use_the_gpus_it_was_given(bench, monkeypatch, visible, gpus, expect) -> None:
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert bench.physical(gpus) == expect
    assert bench.gpu_env(gpus)["CUDA_VISIBLE_DEVICES"] == ",".join(expect)


def test_peak_memory_samples_the_runs_own_gpu(bench, monkeypatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    smi = "0, GPU-a, 60000\n1, GPU-b, 100\n2, GPU-c, 100\n3, GPU-d, 20480\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=smi, stderr=""))
    mem = bench.PeakMemory([0])
    mem._sample()
    assert mem.result() == {"0": 20.0}  # GPU 3's 20 GiB, keyed by the run's GPU number; not GPU 0's 58.6 GiB
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-b")
    mem = bench.PeakMemory([0])
    mem._sample()
    assert mem.result() == {"0": round(100 / 1024, 2)}


def test_gpu_names_lists_only_the_given_gpus(bench, monkeypatch) -> None:
    smi = "0, GPU-a, NVIDIA H100 80GB HBM3\n1, GPU-b, NVIDIA H200\n"
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=smi, stderr=""))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert bench.gpu_names() == ["NVIDIA H200"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert bench.gpu_names() == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]


@pytest.mark.parametrize(
    "visible, gpu, expect", [(None, "1", "1"), ("2", "0", "2"), ("4,5", "1", "5"), ("4,5", "0,1", "4,5")]
)
def test_gpu_test_workers_pin_within_the_given_gpus(visible, gpu, expect) -> None:
    """tests/gpu/gpu_helpers._pin runs in each spawned worker: run it in a fresh interpreter, as there."""
    env = {"PATH": "/usr/bin:/bin"}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    code = (
        f"import sys, os; sys.path.insert(0, {str(ROOT / 'tests' / 'gpu')!r}); from gpu_helpers import _pin; "
        f"_pin({gpu!r}); print(os.environ['CUDA_VISIBLE_DEVICES'])"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expect


def _step(i: int, t: float, **extra: float) -> dict[str, float]:
    base = {
        "step": i,
        "time": t,
        "time/step": 1.0,
        "time/train": 0.5,
        "time/generation": 0.4,
        "time/wait_generation": 0.1,
        "time/reward": 0.01,
        "time/sync": 0.1,
        "sync/bytes": 1e9,
        "rollout/num_samples": 8,
        "rollout/prompt_len_mean": 5,
        "rollout/completion_len_mean": 10,
    }
    return {**base, **extra}


def test_summary_reports_the_staged_sync_and_the_step_wall_spread(bench) -> None:
    """bench/gpu_grpo.py's one line per run carries what issue 14's W2 asks: generation lost per sync, the staged
    receive, whether every engine staged, and step wall p90/p50."""
    c = {"gpus": 2, "async_steps": 1, "colocate": False, "learners": 1}
    facts = {"N_matmul": 1e6, "L": 2, "d": 8, "vocab": 16}
    times = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 13.0]  # measured: 9 steps of 1 s, one of 3 s
    rows = [
        _step(i, t, **{"sync/engine_paused_s_max": 0.05, "sync/engine_stage_s_max": 0.4, "sync/engine_staged_min": 1.0})
        for i, t in enumerate(times)
    ]
    rows[-1]["sync/engine_staged_min"] = 0.0  # one sync fell back to the paused path
    out = bench.summarize_run(rows, c, facts, None)
    ws = out["weight_sync"]
    assert ws["engine_paused_s_max"] == 0.05 and ws["engine_stage_s_max"] == 0.4 and ws["engine_staged_min"] == 0.0
    assert out["step_wall_p90_over_p50"] == 1.0  # 9 of 10 walls are 1 s: p90 is still 1 s
    rows = rows[:-1] + [dict(rows[-1], time=30.0)]  # the last step now takes 21 s
    rows += [dict(rows[-1], step=12, time=52.0)]
    assert bench.summarize_run(rows, c, facts, None)["step_wall_p90_over_p50"] == 20.0
    plain = [_step(i, t) for i, t in enumerate(times)]
    assert bench.summarize_run(plain, c, facts, None)["weight_sync"]["engine_staged_min"] is None


def test_summary_leaves_out_the_steps_fed_by_the_warm_up(bench) -> None:
    """With async_steps K the K steps after the warm-up train on rollouts made during it and come fast (here 2.2 s
    against a steady 6.4 s); averaging them in overstated tokens/s. They are left out, the synchronous loop's
    second step is not, and a run with too few steps keeps at least one."""
    facts = {"N_matmul": 1e6, "L": 2, "d": 8, "vocab": 16}
    times = [0.0, 2.2, 8.6, 15.0, 21.4, 27.8]
    rows = [_step(i + 1, t) for i, t in enumerate(times)]
    a1 = bench.summarize_run(rows, {"gpus": 1, "async_steps": 1, "colocate": True, "learners": 1}, facts, None)
    assert a1["steps_skipped"] == 2 and a1["steps_measured"] == 4
    assert a1["step_walls_s"] == [6.4, 6.4, 6.4, 6.4] and a1["step_wall_s"] == pytest.approx(6.4)
    assert a1["tokens_per_s"] == pytest.approx(8 * 15 / 6.4, abs=0.1)  # rounded to 0.1
    a0 = bench.summarize_run(rows, {"gpus": 1, "async_steps": 0, "colocate": True, "learners": 1}, facts, None)
    assert a0["steps_skipped"] == 1 and a0["step_walls_s"][0] == 2.2
    short = bench.summarize_run(rows[:2], {"gpus": 2, "async_steps": 2, "colocate": False, "learners": 1}, facts, None)
    assert short["steps_skipped"] == 1 and short["steps_measured"] == 1 and short["step_walls_s"] == [2.2]


def test_dry_run_prints_the_gpus_the_runs_would_use(tmp_path) -> None:
    """The printed commands name the same GPUs the real runs get (gpu_env), within CUDA_VISIBLE_DEVICES."""
    import json

    env = {**__import__("os").environ, "CUDA_VISIBLE_DEVICES": "2,3"}
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_grpo.py"),
            "--dry-run",
            "--configs",
            "split2_async1",
            "--lanes",
            "none",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    runs = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{") and '"kind": "rlvr"' in l]
    assert runs and all(r["cmd"].startswith("CUDA_VISIBLE_DEVICES=2,3 ") for r in runs)


def test_gpu_time_share_splits_each_gpu_kind_s_step(bench: Any) -> None:
    """Issue 14's scaling-table columns: learner GPUs train / sync / idle, engine GPUs generating / sync / idle."""
    split = bench.gpu_time_share(5.0, 2.0, 0.3, 0.9, 0.2, False)
    assert split["learner_gpu"] == {"train": 0.4, "sync": 0.06, "idle": 0.54}
    assert split["engine_gpu"] == {"generating": 0.86, "sync": 0.04, "idle": 0.1}
    assert "shared_gpu" not in split
    # colocated with sleep mode: engine busy 40 %, learner 50 %: neither works in 10 % (no overlap) .. 50 % (full)
    colo = bench.gpu_time_share(10.0, 4.5, 0.5, 0.4, float("nan"), True)
    assert colo["shared_gpu"] and colo["shared_idle_min"] == 0.1 and colo["shared_idle_max"] == 0.5
    assert colo["engine_gpu"] == {"generating": 0.4, "sync": 0.0, "idle": 0.6}
    old = bench.gpu_time_share(10.0, 4.5, 0.5, float("nan"), 0.1, False)  # a run log without engine counters
    assert old["engine_gpu"] == {"generating": None, "sync": 0.01, "idle": None}
    assert bench.gpu_time_share(float("nan"), 1.0, 0.1, 0.5, 0.1, False) is None


def test_engine_rollout_rate_is_per_engine_while_generating(bench: Any) -> None:
    """Issue 14 W1 compares rlvr's generation with standalone vLLM on the same batch: async 0 over the generation
    phase; async 1 (generation overlaps training) over the engines' generating share of the step wall, per engine."""
    a0 = {"async_steps": 0, "engines": 1}
    assert bench.engine_rollout_rate(1000.0, 5.0, 2.0, 0.4, 0.0, a0) == 500.0
    assert bench.engine_rollout_rate(1000.0, 5.0, 2.0, 0.4, 0.0, {"async_steps": 0, "engines": 2}) == 250.0
    a1 = {"async_steps": 1, "engines": 2}
    # 10 s steps, engines busy 90 % of which 1 s a step is generation lost to the sync: 80 % generating
    assert bench.engine_rollout_rate(16000.0, 10.0, 3.0, 0.9, 1.0, a1) == 1000.0
    assert bench.engine_rollout_rate(16000.0, 10.0, 3.0, 0.9, float("nan"), a1) == round(16000 / 9 / 2, 1)
    assert bench.engine_rollout_rate(16000.0, 10.0, 3.0, float("nan"), 1.0, a1) is None  # no engine counters
    assert bench.engine_rollout_rate(16000.0, 10.0, 3.0, 0.05, 1.0, a1) is None  # nothing left generating


def test_summary_gives_each_run_s_rollout_over_standalone(bench: Any, tmp_path: Path) -> None:
    import argparse

    results = {
        ("colocate1", "base"): {"tokens_per_s_per_gpu": 20000.0, "engine_rollout_tokens_per_s": 18000.0},
        ("colocate1", "sleep"): {"tokens_per_s_per_gpu": 12000.0, "engine_rollout_tokens_per_s": 21000.0},
        ("split2_async1", "base"): {"tokens_per_s_per_gpu": 9000.0, "engine_rollout_tokens_per_s": None},
        "standalone": [
            {"kind": "standalone_vllm", "mode": "step_plain", "completion_tokens_per_s": 20000.0},
            {"kind": "standalone_vllm", "mode": "step_rlvr_like", "completion_tokens_per_s": 18000.0},
        ],
    }
    a = argparse.Namespace(shape="qwen2.5-0.5b")
    out = bench.summary_line(a, results, "card", None, 0.0, tmp_path / "b.jsonl")
    assert out["rollout_over_standalone_by_run"] == {"colocate1": 0.9, "colocate1:sleep": 1.05}
    assert out["standalone.step_plain.completion_tokens_per_s"] == 20000.0
    results["standalone"] = results["standalone"][1:]  # no one-step n=G batch: no ratio, not another batch's
    assert "rollout_over_standalone_by_run" not in bench.summary_line(a, results, "card", None, 0.0, tmp_path / "d")
    del results["standalone"]
    assert "rollout_over_standalone_by_run" not in bench.summary_line(a, results, "card", None, 0.0, tmp_path / "c")
