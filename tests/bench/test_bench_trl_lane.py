"""bench/gpu_grpo.py's `trl` lane (issue 14) on CPU: the TRL configuration it builds is rlvr's colocate1 workload
(prompts, G, completion length, bf16, gradient checkpointing, beta 0, 32 x P*G/32 batches), the lane is skipped with
a message where trl is absent, bad lane flags name the flag, and the figures (tokens/s per GPU, `rlvr_trl_ratio`)
come out of the step lines the way the rlvr lane computes its own. With trl installed, bench/trl_lane.py also runs
for real on a tiny model on CPU (transformers generation instead of vLLM)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def _trl_installed() -> bool:
    try:
        importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _dry_run(tmp_path: Path, *flags: str, gpus: str = "0,1") -> subprocess.CompletedProcess:
    """A dry run plans for the GPUs it is given, whatever the host has (here 2 unless `gpus` says otherwise)."""
    return subprocess.run(
        [sys.executable, str(BENCH / "gpu_grpo.py"), "--dry-run", "--out", str(tmp_path), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": gpus},
    )


def _lines(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(l) for l in (tmp_path / "bench.jsonl").read_text().splitlines() if l.strip()]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    """bench/gpu_grpo.py imported in-process (its sibling modules come from bench/)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_grpo

    return gpu_grpo


@pytest.mark.parametrize(
    "flags, micro, accum",
    [
        ((), 32, 8),  # issue 14's W1: 32 prompts x 8 samples, 512 tokens; 32 completions x 8 accumulation steps
        (
            ("--prompts-per-step", "16", "--group-size", "4", "--max-new-tokens", "256", "--trl-micro-batch", "16"),
            16,
            4,
        ),
    ],
)
def test_trl_lane_config_is_rlvr_colocate1_workload(tmp_path: Path, flags: tuple, micro: int, accum: int) -> None:
    proc = _dry_run(tmp_path, "--configs", "colocate1", "--lanes", "trl", "--steps", "6", *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = _lines(tmp_path)
    rlvr = next(l for l in lines if l["kind"] == "rlvr")
    trl = next(l for l in lines if l["kind"] == "trl")
    summary = next(l for l in lines if l["kind"] == "summary")
    assert "error" not in trl, trl.get("error")
    assert rlvr["flags_ok"]["ok"], rlvr["flags_ok"]
    cfg, w = trl["grpo_config"], trl["workload"]
    P, G, M = rlvr["prompts_per_step"], rlvr["group_size"], rlvr["max_new_tokens"]
    # the same workload as the rlvr lane, read from the same flags
    assert (w["prompts_per_step"], w["group_size"], w["max_new_tokens"]) == (P, G, M)
    assert f"--model.path {w['model_dir']} " in rlvr["cmd"]
    assert cfg["num_generations"] == G and cfg["max_completion_length"] == M and cfg["max_steps"] == 6
    assert cfg["per_device_train_batch_size"] == micro and cfg["gradient_accumulation_steps"] == accum
    assert micro * accum == P * G  # one optimizer step = one generation of P prompts x G samples
    assert cfg["bf16"] is True and cfg["beta"] == 0.0
    assert cfg["gradient_checkpointing"] is True  # as TRL users run it; rlvr's preset takes its fast path
    assert cfg["use_vllm"] is True and cfg["vllm_mode"] == "colocate" and cfg["vllm_gpu_memory_utilization"] == 0.35
    assert cfg["generation_kwargs"] == {"ignore_eos": True}  # completions run to M, as RLVR_IGNORE_EOS=1 does
    assert cfg["vllm_max_model_length"] == w["max_prompt_tokens"] + M
    assert (cfg["temperature"], cfg["top_p"], cfg["top_k"]) == (w["temperature"], w["top_p"], w["top_k"])
    assert cfg["learning_rate"] == w["lr"] and cfg["report_to"] == "none"
    assert trl["gpu"] == 1 and "trl_lane.py --spec" in trl["cmd"]  # beside colocate1 on GPU 0 (dry run: 2 GPUs)
    assert summary["rlvr_trl_ratio"] is None and summary["rlvr_trl_ratio_config"] == "colocate1"
    if _trl_installed():
        assert "skipped" not in trl and "trl.skipped" not in summary
    else:
        assert "trl is not installed" in trl["skipped"] and ".[bench]" in trl["skipped"]
        assert summary["trl.skipped"] == trl["skipped"]


def test_trl_lane_runs_on_gpu_0_after_colocate1_when_serial(tmp_path: Path) -> None:
    """--serial (or one GPU, or a standalone/learner lane on the second of two GPUs): TRL waits for the rlvr runs on
    GPU 0. With 3 GPUs and a side lane, TRL takes GPU 1 beside them (the side lane GPU 2)."""
    for name, lanes in (("serial", ["--lanes", "trl", "--serial"]), ("side_lane", ["--lanes", "trl,learner"])):
        out = tmp_path / name
        proc = _dry_run(out, "--configs", "colocate1", "--steps", "6", *lanes)
        assert proc.returncode == 0, proc.stderr[-3000:]
        trl = next(l for l in _lines(out) if l["kind"] == "trl")
        assert trl["gpu"] == 0, (name, trl["gpu"])
    proc = _dry_run(tmp_path / "three", "--configs", "colocate1", "--lanes", "trl,standalone", gpus="0,1,2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert next(l for l in _lines(tmp_path / "three") if l["kind"] == "trl")["gpu"] == 1
    proc = _dry_run(tmp_path / "one", "--configs", "colocate1", "--lanes", "trl", gpus="3")  # one GPU: after rlvr
    assert proc.returncode == 0, proc.stderr[-3000:]
    trl = next(l for l in _lines(tmp_path / "one") if l["kind"] == "trl")
    assert trl["gpu"] == 0 and trl["cmd"].startswith("CUDA_VISIBLE_DEVICES=3 ")


def test_trl_lane_overrides_and_dtype_reach_the_config(tmp_path: Path) -> None:
    proc = _dry_run(
        tmp_path,
        "--configs",
        "colocate1",
        "--lanes",
        "trl",
        "--trl-dtype",
        "bfloat16",
        "--trl-args",
        '{"vllm_enable_sleep_mode": true}',
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = next(l for l in _lines(tmp_path) if l["kind"] == "trl")["grpo_config"]
    assert cfg["model_init_kwargs"] == {"dtype": "bfloat16"} and cfg["vllm_enable_sleep_mode"] is True


@pytest.mark.parametrize(
    "flags, named",
    [
        (("--lanes", "trl", "--trl-micro-batch", "7"), "--trl-micro-batch"),
        (("--lanes", "trl", "--trl-args", "[1, 2]"), "--trl-args"),
        (("--lanes", "trl", "--trl-args", "{not json"), "--trl-args"),
        (("--lanes", "trl,tlr"), "--lanes"),
    ],
)
def test_bad_trl_lane_flags_name_the_flag(tmp_path: Path, flags: tuple, named: str) -> None:
    proc = _dry_run(tmp_path, "--configs", "colocate1", *flags)
    assert proc.returncode == 2 and named in proc.stderr, proc.stderr[-2000:]


def test_trl_lane_skipped_cleanly_without_trl(bench: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No trl: one `trl` line with the install hint, nothing started, and the summary says why it has no ratio."""
    import trl_lane

    real_version = importlib.metadata.version

    def no_trl(name: str) -> str:
        if name == "trl":
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", no_trl)
    assert "pip install -e '.[bench]'" in trl_lane.trl_missing()

    def must_not_run(*a: Any, **k: Any) -> None:
        raise AssertionError("the trl lane started a process without trl")

    monkeypatch.setattr(bench, "run_guarded", must_not_run)
    a = _args(bench, tmp_path)
    results: dict[str, Any] = {}
    bench.lane_trl(a, 0, 1, "/nonexistent-model", "NVIDIA H100", 300.0, tmp_path, results)
    (line,) = _lines(tmp_path)
    assert line["kind"] == "trl" and "trl is not installed" in line["skipped"]
    summary = bench.trl_summary({"colocate1": {"tokens_per_s_per_gpu": 20000.0}}, results["trl"])
    assert summary["rlvr_trl_ratio"] is None and summary["trl.skipped"] == line["skipped"]

    code = (  # the lane script itself, where trl is absent: a skip line, exit 0
        "import importlib.metadata as m, runpy, sys\n"
        "real = m.version\n"
        "def version(name):\n"
        "    if name == 'trl':\n"
        "        raise m.PackageNotFoundError(name)\n"
        "    return real(name)\n"
        "m.version = version\n"
        "sys.argv = ['trl_lane.py', '--spec', 'unused.json']\n"
        f"runpy.run_path({str(BENCH / 'trl_lane.py')!r}, run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["kind"] == "trl_skipped"


def _args(bench: Any, tmp_path: Path, **over: Any) -> Any:
    import argparse

    a = argparse.Namespace(
        shape="qwen2.5-0.5b",
        steps=6,
        max_new_tokens=512,
        prompts_per_step=32,
        group_size=8,
        runs_dir=str(tmp_path / "runs"),
        extra="",
        trl_micro_batch=32,
        trl_vllm_mem=0.35,
        trl_dtype="",
        trl_overrides={},
        dry_run=False,
    )
    for k, v in over.items():
        setattr(a, k, v)
    return a


def _step(step: int, t_begin: float, t_end: float, prompt_tokens: int = 32 * 8 * 13, m: int = 512) -> dict:
    return {
        "kind": "trl_step",
        "step": step,
        "t_begin": t_begin,
        "t_end": t_end,
        "in_step_s": t_end - t_begin,
        "samples": 256,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 256 * m,
        "completion_len_min": m,
        "completion_len_max": m,
        "generate_s": 4.0,
        "sync_weights_s": 0.25,
    }


def test_trl_step_lines_give_tokens_per_s_like_the_rlvr_lane(bench: Any) -> None:
    import trl_lane

    # step 1 is warm-up (20 s); steps 2..4 end 14, 16 and 12 s after the previous one
    steps = [_step(1, 100.0, 120.0), _step(2, 120.1, 134.0), _step(3, 134.1, 150.0), _step(4, 150.1, 162.0)]
    out = trl_lane.summarize_steps(list(reversed(steps)))
    tokens = 256 * 13 + 256 * 512
    assert out["steps_logged"] == 4 and out["steps_measured"] == 3
    assert out["step_wall_s"] == pytest.approx(14.0)
    assert out["tokens_per_step"] == tokens
    assert out["tokens_per_s_per_gpu"] == pytest.approx(tokens / 14.0, abs=0.1)
    assert out["prompt_len_mean"] == 13.0 and out["completion_len_mean"] == 512.0 and out["completion_len_min"] == 512
    assert out["warmup_step_s"] == 20.0 and out["step_walls_s"] == [14.0, 16.0, 12.0]
    assert out["phase_s"]["vllm_generate"] == 4.0
    only = trl_lane.summarize_steps([_step(1, 0.0, 20.0)])  # one step: its own time, and nothing measured
    assert only["steps_measured"] == 0 and only["step_wall_s"] == 20.0
    assert trl_lane.summarize_steps([]) == {"steps_logged": 0}

    trl = {"tokens_per_s_per_gpu": out["tokens_per_s_per_gpu"]}
    rate = 1.5 * out["tokens_per_s_per_gpu"]
    summary = bench.trl_summary({"colocate1": {"tokens_per_s_per_gpu": rate}}, trl)
    assert summary["rlvr_trl_ratio"] == 1.5 and summary["trl.tokens_per_s_per_gpu"] == out["tokens_per_s_per_gpu"]
    assert bench.trl_summary({}, trl)["rlvr_trl_ratio"] is None  # no rlvr colocated run: no ratio
    results = {  # every one-GPU run gets its own ratio; multi-GPU runs and runs without a figure none
        ("colocate1", "base"): {"gpus": 1, "tokens_per_s_per_gpu": rate},
        ("colocate1", "awake"): {"gpus": 1, "tokens_per_s_per_gpu": 2 * rate},
        ("colocate1", "crashed"): {"gpus": 1},
        ("split2_async1", "base"): {"gpus": 2, "tokens_per_s_per_gpu": rate},
    }
    by_run = bench.trl_summary({"colocate1": results[("colocate1", "base")]}, trl, results)["rlvr_trl_ratio_by_run"]
    assert by_run == {"colocate1": 1.5, "colocate1:awake": 3.0}
    assert bench.trl_summary({"colocate1": {}}, None) == {}


def test_lane_trl_reads_the_lane_process_output(bench: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """lane_trl turns the lane process's JSON lines (whatever else it logs between them) into one `trl` line."""
    import trl_lane

    monkeypatch.setattr(trl_lane, "trl_missing", lambda: None)
    calls = []

    def fake_run(cmd: list[str], env: dict, timeout_s: float, log_path: Path, gpus: list | None = None) -> dict:
        calls.append((cmd, env["CUDA_VISIBLE_DEVICES"], gpus))
        spec = json.loads(Path(cmd[cmd.index("--spec") + 1]).read_text())
        start = {"kind": "trl_start", "startup_s": 50.0, "versions": {"trl": "1.16.0"}, "grpo_config": {"x": 1}}
        log_path.write_text(
            "INFO vLLM started\n"
            + json.dumps(start)
            + "\n"
            + "\n".join(json.dumps(_step(i + 1, 60.0 + 14 * i, 74.0 + 14 * i)) + "\n{'loss': 0.0}" for i in range(3))
            + '\n{"kind": "trl_done", "train_s": 42.0}\n'
        )
        assert spec["steps"] == 6 and spec["micro_batch"] == 32 and spec["argv"][:2] == ["--config", spec["argv"][1]]
        return {"rc": 0, "timed_out": False, "wall_s": 100.0, "peak_mem_gib": {"0": 60.0}}

    monkeypatch.setattr(bench, "run_guarded", fake_run)
    results: dict[str, Any] = {}
    bench.lane_trl(_args(bench, tmp_path), 0, 1, "/m", "NVIDIA H100 80GB HBM3", 300.0, tmp_path, results)
    (line,) = _lines(tmp_path)
    assert calls and calls[0][1] == "0" and calls[0][2] == [0] and calls[0][0][1].endswith("trl_lane.py")
    assert line["kind"] == "trl" and line["card"] == "NVIDIA H100 80GB HBM3" and "skipped" not in line
    assert line["steps_measured"] == 2 and line["step_wall_s"] == 14.0 and line["peak_mem_gib"] == {"0": 60.0}
    assert line["tokens_per_s_per_gpu"] == pytest.approx((256 * 13 + 256 * 512) / 14.0, abs=0.1)
    assert line["startup_s"] == 50.0 and line["train_s"] == 42.0 and "log_tail" not in line
    assert results["trl"] is not None and results["trl"]["tokens_per_s_per_gpu"] == line["tokens_per_s_per_gpu"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_trl_lane_runs_trl_on_a_tiny_model_on_cpu(tmp_path: Path) -> None:
    """The lane script for real (trl installed): TRL's GRPOTrainer on rlvr's prompts, every completion M tokens,
    the step lines' token counts those of prompts + completions. transformers generates instead of vLLM (CPU)."""
    pytest.importorskip("trl")
    pytest.importorskip("torch")
    from rlvr.config.sections import ModelConfig
    from rlvr.data import builtin_corpus
    from rlvr.models.tiny import build_tiny_model_dir

    model = build_tiny_model_dir(ModelConfig(), builtin_corpus("copy4"), tmp_path / "model", 0)
    P, G, M = 2, 2, 8
    argv = ["--config", "configs/gpu-1x-colocate.yaml", "--model.path", str(model), "--data.datasets", "builtin:copy4"]
    argv += ["--data.apply-chat-template", "False", "--generation.max-new-tokens", str(M)]
    argv += ["--generation.num-samples", str(G), "--rollout.prompts-per-step", str(P)]
    spec = {
        "argv": argv,
        "steps": 3,
        "micro_batch": 2,
        "use_vllm": False,
        "output_dir": str(tmp_path / "out"),
        "overrides": {"use_cpu": True, "bf16": False},
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    proc = subprocess.run(
        [sys.executable, str(BENCH / "trl_lane.py"), "--spec", str(tmp_path / "spec.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(l) for l in proc.stdout.splitlines() if l.startswith('{"kind": "trl_')]
    start = next(l for l in lines if l["kind"] == "trl_start")
    steps = [l for l in lines if l["kind"] == "trl_step"]
    assert start["effective"]["generation_batch_size"] == P * G and start["effective"]["steps_per_generation"] == 2
    assert start["prompt_ids_match_rlvr"] is True and start["versions"]["trl"] == importlib.metadata.version("trl")
    assert [s["step"] for s in steps] == [1, 2, 3]
    for s in steps:
        assert s["samples"] == P * G and s["completion_len_min"] == s["completion_len_max"] == M
        assert s["completion_tokens"] == P * G * M
    seen = [s["num_input_tokens_seen"] for s in steps]  # TRL's own count of prompt + completion tokens
    assert [b - a for a, b in zip([0] + seen, seen)] == [s["prompt_tokens"] + s["completion_tokens"] for s in steps]


def test_multi_gpu_runs_wait_for_the_trl_lane(bench: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TRL runs beside colocate1 on the last GPU; a split run needs that GPU, so it starts only once TRL is done."""
    import time

    events: list[str] = []

    def slow_trl(a: Any, gpu: int, *args: Any) -> None:
        time.sleep(0.5)
        events.append(f"trl done on {gpu}")

    real_run = bench.run_config

    def run(a: Any, c: dict, gpus: list, *args: Any, **kw: Any) -> dict:
        events.append(f"run {c['name']} on {gpus}")
        return real_run(a, c, gpus, *args, **kw)

    monkeypatch.setattr(bench, "lane_trl", slow_trl)
    monkeypatch.setattr(bench, "run_config", run)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    argv = [
        "gpu_grpo.py",
        "--dry-run",
        "--out",
        str(tmp_path),
        "--configs",
        "colocate1,split2_async1",
        "--lanes",
        "trl",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    assert bench.main() == 0
    assert events == ["run colocate1 on [0]", "trl done on 1", "run split2_async1 on [0, 1]"], events
