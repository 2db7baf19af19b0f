"""GPU throughput benchmark of `rlvr train` (issue 7): tokens/s/GPU, phases, weight sync, learner MFU, padding,
prompt accounting, async speedup, and rollout inside rlvr vs standalone vLLM -- one JSON line per measurement.

    python3 bench/gpu_grpo.py --configs colocate1,split2_async0,split2_async1 --shape qwen2.5-0.5b \
        --steps 5 --max-new-tokens 512 --prompts-per-step 32 --group-size 8 --out $OUT

Configurations (`--configs`, comma separated): `colocate1[_asyncK]` (learner + vLLM on one GPU, CUDA IPC sync,
sleep/wake), `splitG[_lL]_asyncK` (G GPUs, L learners (default G//2) + G-L engines, NCCL sync). Configs that
need more GPUs than the machine has are reported as skipped. Extra lanes:
- `standalone`: vLLM's `LLM` alone on the same model dir, prompts (rlvr's own PromptStream), n, max_tokens,
  ignore_eos, logprobs=0, gpu_memory_utilization: one step-sized batch with n=G (plain), the same batch the way
  rlvr submits it (n=1 requests with per-sample seeds), one with vLLM's flat log-probs and no detokenizing (lean,
  as rlvr's engine asks by default), and one 4-step batch (continuous-batching ceiling). The summary's
  `rollout_over_standalone_by_run` divides each run's `engine_rollout_tokens_per_s` (one engine's completion
  tokens/s while it generates) by the plain batch's rate.
- `learner`: `bench/gpu_learner.py`'s microbench (the exact LearnerWorker.train_batch on a synthetic packed
  batch of the same shape), once per `--learner-variants` flag set: the cheap before/after for the MFU knobs
  without Ray/vLLM start-up, plus an attention probe at the pack length.
- `trl` (issue 14): TRL's `GRPOTrainer` with vLLM colocate on the same model dir, prompts, prompt count, G,
  completion length (every completion runs to the limit: vLLM's ignore_eos) and bf16, with gradient checkpointing,
  beta 0, vLLM memory 0.35, 32 completions per micro-step and P*G/32 accumulation steps (`bench/trl_lane.py`, in its
  own process, beside the colocated rlvr runs on GPU 0: on the last GPU, or the one before it where the
  standalone/learner lane takes the last (>= 3 GPUs); with --serial or too few GPUs on GPU 0 after them; skipped with a message where trl is absent:
  install the `bench` extra). The summary's `rlvr_trl_ratio` = rlvr colocate1 tokens/s/GPU / TRL tokens/s/GPU, same card, same run:

    python3 bench/gpu_grpo.py --configs colocate1 --lanes trl --shape qwen2.5-0.5b --steps 6 --budget-s 560 \
        --run-timeout-s 290 --out $OUT
On a machine with >= 2 GPUs the standalone + learner lane runs on the last GPU while `colocate1` runs on GPU 0.

Full fine-tuning vs LoRA (issue 20): `--lora-compare R` runs every configuration a second time with
`--learner.lora-rank R --learner.lora-alpha 2R --learner.lr --lora-lr` and ends with one `full_vs_lora` line per
configuration: weight-sync cycle, learner send, engine load, bytes, step time (wall and time/step), train time, and
peak GPU memory per GPU (nvidia-smi's memory.used sampled every 0.5 s during each run: learner and engine together
where they share a GPU). Every run records `peak_mem_gib` the same way. The 1.5B comparison on one GPU:

    python3 bench/gpu_grpo.py --shape qwen2.5-1.5b --configs colocate1 --lanes none --steps 6 --lora-compare 16 \
        --extra "--rollout.colocate-sleep False" --out $OUT

Every rlvr run is `python3 -m rlvr.cli train` in its own process group with RLVR_IGNORE_EOS=1 (fixed workload:
every completion runs to max-new-tokens), filter-zero-variance off, eval off, checkpoints off; each is killed
(SIGTERM, then SIGKILL) at its share of `--budget-s`, and whatever steps it logged are still reported.
Figures average steps 2..N (step 1 is warm-up). MFU = (6 N + 6 L d S) * tokens / (t_train * learner GPUs * peak),
N = matmul parameters incl. the lm_head, S = mean sample length, tokens = prompt + completion tokens trained;
peak 989e12 (H100/H200 bf16 dense datasheet; ~790e12 is what H100 GEMMs reach). It is MFU, not HFU: gradient
checkpointing's recompute is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
import trl_lane  # noqa: E402  (same directory; no torch or trl at import)
from gpu_learner import BEFORE, emit, model_facts, peak_for, run_variants  # noqa: E402  (same directory)
from gpu_procs import PeakMemory, gpu_env, gpu_names, physical, run_guarded, tail, visible_devices  # noqa: E402,F401
from grpo_summary import (  # noqa: E402,F401
    engine_rollout_rate,
    gpu_time_share,
    summarize_run,
    summary_line,
    trl_summary,
)

from rlvr.models.shaped import SHAPES  # noqa: E402  (no torch at import)

DEFAULT_LEARNER_VARIANTS = ";".join(
    [f"before={BEFORE}", "base=", "gc_4k=--model.gradient-checkpointing True --learner.pack-length 4096"]
)


# ----------------------------------------------------------------------------- configurations
def parse_config(name: str) -> dict[str, Any]:
    m = re.fullmatch(r"colocate1(?:_async(\d+))?", name)
    if m:
        return {
            "name": name,
            "gpus": 1,
            "learners": 1,
            "engines": 1,
            "colocate": True,
            "async_steps": int(m.group(1)) if m.group(1) is not None else 1,
        }
    m = re.fullmatch(r"split(\d+)(?:_l(\d+))?(?:_async(\d+))?", name)
    if m:
        g = int(m.group(1))
        lrn = int(m.group(2)) if m.group(2) else max(1, g // 2)
        if g < 2 or not 1 <= lrn < g:
            raise ValueError(f"config {name}: need >= 2 GPUs and 1 <= learners < GPUs")
        return {
            "name": name,
            "gpus": g,
            "learners": lrn,
            "engines": g - lrn,
            "colocate": False,
            "async_steps": int(m.group(3)) if m.group(3) is not None else 1,
        }
    raise ValueError(f"unknown config {name!r}: use colocate1[_asyncK] or splitG[_lL][_asyncK]")


def common_flags(a: argparse.Namespace, model_dir: str) -> list[str]:
    return [
        "--model.path",
        model_dir,
        "--data.datasets",
        "builtin:copy4",
        "--data.apply-chat-template",
        "False",
        "--rollout.filter-zero-variance",
        "False",
        "--eval.every-n-steps",
        "0",
        "--eval.at-step-0",
        "False",
        "--checkpoint.save-final",
        "False",
        "--checkpoint.every-n-steps",
        "0",
        "--checkpoint.output-dir",
        a.runs_dir,
        "--logging.console-progress",
        "False",
        "--num-steps",
        str(a.steps),
        "--generation.max-new-tokens",
        str(a.max_new_tokens),
        "--generation.num-samples",
        str(a.group_size),
        "--rollout.prompts-per-step",
        str(a.prompts_per_step),
        "--learner.lr",
        "1e-6",
    ]


def train_argv(a: argparse.Namespace, c: dict[str, Any], model_dir: str, run_name: str) -> list[str]:
    preset = "configs/gpu-1x-colocate.yaml" if c["colocate"] else "configs/gpu-2x.yaml"
    argv = [
        "--config",
        preset,
        *common_flags(a, model_dir),
        "--rollout.async-steps",
        str(c["async_steps"]),
        "--cluster.num-learners",
        str(c["learners"]),
        "--cluster.num-engines",
        str(c["engines"]),
        "--cluster.gpus-per-node",
        str(c["gpus"]),
        "--logging.run-name",
        run_name,
    ]
    return argv + shlex.split(a.extra)


def run_config(
    a: argparse.Namespace,
    c: dict[str, Any],
    gpus: list[int],
    model_dir: str,
    facts: dict,
    card: str,
    peak: float | None,
    timeout_s: float,
    out_dir: Path,
    tag: str,
    extra_note: str = "",
) -> dict:
    run_name = f"{c['name']}-{tag}-{os.getpid()}-{int(time.time())}"
    argv = train_argv(a, c, model_dir, run_name)
    cmd = [sys.executable, "-m", "rlvr.cli", "train", *argv]
    rec: dict[str, Any] = {
        "kind": "rlvr",
        "config": c["name"],
        "tag": tag,
        "shape": a.shape,
        "card": card,
        "gpus": c["gpus"],
        "learners": c["learners"],
        "engines": c["engines"],
        "colocate": c["colocate"],
        "async_steps": c["async_steps"],
        "prompts_per_step": a.prompts_per_step,
        "group_size": a.group_size,
        "max_new_tokens": a.max_new_tokens,
        "steps": a.steps,
        "extra": a.extra,
        "peak_flops": peak,
        "note": extra_note,
        "run_name": run_name,  # its metrics file beside bench.jsonl: <run_name>.metrics.jsonl
    }
    if a.dry_run:
        rec["cmd"] = "CUDA_VISIBLE_DEVICES=%s RLVR_IGNORE_EOS=1 %s" % (",".join(physical(gpus)), shlex.join(cmd))
        rec["flags_ok"] = check_flags(argv)
        return rec
    res = run_guarded(cmd, gpu_env(gpus), timeout_s, out_dir / f"{run_name}.log", gpus)
    rec.update(res)
    mpath = Path(a.runs_dir) / run_name / "metrics.jsonl"
    rows = []
    if mpath.is_file():
        rows = [json.loads(l) for l in mpath.read_text().splitlines() if l.strip()]
        try:
            (out_dir / f"{run_name}.metrics.jsonl").write_text(mpath.read_text())
        except OSError:
            pass
    rec.update(summarize_run(rows, c, facts, peak))
    if res["rc"] != 0 or not rows:
        rec["log_tail"] = tail(out_dir / f"{run_name}.log")
    return rec


def check_flags(argv: list[str]) -> Any:
    """Dry run: do the flags parse and validate the way `rlvr train` would take them?"""
    try:
        from rlvr.cli import parse_train_args

        cfg = parse_train_args(argv).experiment
        return {
            "ok": True,
            "num_steps": cfg.num_steps,
            "gc": cfg.model.gradient_checkpointing,
            "zero": cfg.learner.zero_stage,
            "pack_length": cfg.learner.pack_length,
            "micro_batch_rows": cfg.learner.micro_batch_rows,
            "vllm_mem": cfg.rollout.vllm_gpu_memory_utilization,
        }
    except BaseException as e:  # tyro exits on bad flags
        return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}


# ----------------------------------------------------------------------------- child: standalone vLLM
def child_standalone(spec: dict[str, Any]) -> None:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    from rlvr.cli import parse_train_args
    from rlvr.data import PromptStream

    cfg = parse_train_args(spec["argv"]).experiment
    tok = AutoTokenizer.from_pretrained(spec["model_dir"])
    stream = PromptStream(cfg, tok)
    P, G, M = cfg.rollout.prompts_per_step, cfg.generation.num_samples, cfg.generation.max_new_tokens
    reqs = [stream.next_request() for _ in range(6 * P)]
    reqs = [r for r in reqs if r is not None]
    prompts = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in reqs]
    t0 = time.perf_counter()
    llm = LLM(
        model=spec["model_dir"],
        dtype="bfloat16",
        seed=cfg.seed,
        gpu_memory_utilization=cfg.rollout.vllm_gpu_memory_utilization,
        max_model_len=cfg.data.max_prompt_tokens + M,
        enable_prefix_caching=cfg.rollout.vllm_enable_prefix_caching,
        enforce_eager=cfg.rollout.vllm_enforce_eager,
        logprobs_mode="processed_logprobs",
    )
    start_s = time.perf_counter() - t0
    base = dict(
        temperature=cfg.generation.temperature,
        top_p=cfg.generation.top_p,
        top_k=cfg.generation.top_k,
        max_tokens=M,
        logprobs=0,
        ignore_eos=True,
    )
    common = {
        "kind": "standalone_vllm",
        "card": spec["card"],
        "prompts_per_step": P,
        "group_size": G,
        "max_new_tokens": M,
        "gpu_memory_utilization": cfg.rollout.vllm_gpu_memory_utilization,
        "engine_start_s": round(start_s, 1),
    }
    llm.generate(prompts[:8], SamplingParams(**{**base, "max_tokens": 16}, n=G), use_tqdm=False)  # warm-up

    def measure(label: str, batch: list, params: Any, seqs: int) -> None:
        t = time.perf_counter()
        outs = llm.generate(batch, params, use_tqdm=False)
        dt = time.perf_counter() - t
        comp = sum(len(o.token_ids) for r in outs for o in r.outputs)
        prm = sum(len(r.prompt_token_ids) * len(r.outputs) for r in outs)
        emit(
            {
                **common,
                "mode": label,
                "sequences": seqs,
                "seconds": round(dt, 3),
                "completion_tokens": comp,
                "completion_tokens_per_s": round(comp / dt, 1),
                "tokens_per_s": round((comp + prm) / dt, 1),
            },
            None,
        )

    which = spec["modes"]
    if "step_plain" in which:  # one step's batch, n=G per prompt
        measure("step_plain", prompts[P : 2 * P], SamplingParams(**base, n=G), P * G)
    if "step_rlvr_like" in which:  # the same batch the way rlvr submits it: n=1 requests, a seed per sample
        batch, params = [], []
        for r in reqs[2 * P : 3 * P]:
            for j in range(G):
                batch.append({"prompt_token_ids": list(r.prompt_token_ids)})
                seed = None if r.sampling.seed is None else int(r.sampling.seed) + j
                params.append(SamplingParams(**base, n=1, seed=seed))
        measure("step_rlvr_like", batch, params, P * G)
    if "step_lean" in which:  # n=G with vLLM's flat log-probs and no detokenizing: vLLM's outputs at their leanest
        lean = SamplingParams(**base, n=G, flat_logprobs=True, detokenize=False)
        measure("step_lean", prompts[5 * P : 6 * P], lean, P * G)
    if "ceiling" in which:  # four steps at once: the continuous-batching ceiling
        measure("ceiling_4steps", prompts[P : 5 * P], SamplingParams(**base, n=G), 4 * P * G)


# ----------------------------------------------------------------------------- lanes
def lane_standalone_learner(
    a: argparse.Namespace,
    gpu: int,
    model_dir: str,
    facts: dict,
    card: str,
    peak: float | None,
    deadline: float,
    out_dir: Path,
    results: dict,
) -> None:
    split = parse_config("split2_async0")
    argv = train_argv(a, split, model_dir, "standalone")
    if "standalone" in a.lanes:
        spec = {
            "argv": argv,
            "model_dir": model_dir,
            "card": card,
            "modes": ["step_plain", "step_rlvr_like", "step_lean", "ceiling"],
        }
        budget = min(a.standalone_timeout_s, deadline - time.time())
        if a.dry_run:
            emit(
                {"kind": "standalone_vllm", "gpu": gpu, "timeout_s": round(budget), "spec": spec},
                out_dir / "bench.jsonl",
            )
        else:
            results["standalone"] = run_child("standalone", spec, [gpu], budget, out_dir)
    if "learner" in a.lanes:
        variants = [tuple(v.split("=", 1)) if "=" in v else (v, v) for v in a.learner_variants.split(";") if v.strip()]
        learner_argv = train_argv(a, parse_config("split2_async0"), model_dir, "learner")
        budget = deadline - time.time() if not a.dry_run else a.standalone_timeout_s
        spec = {
            "argv": learner_argv,
            "model_dir": model_dir,
            "card": card,
            "facts": facts,
            "peak": peak,
            "variants": variants,
            "samples": a.learner_samples,
            "reps": 1,
            "timeout_s": budget,
            "pack_length": 4096,
            "shape": a.shape,
        }
        if a.dry_run:
            emit(
                {"kind": "learner_microbench", "gpu": gpu, "spec": {k: v for k, v in spec.items() if k != "facts"}},
                out_dir / "bench.jsonl",
            )
        elif budget > 30:
            results["learner"] = run_child("learner", spec, [gpu], budget, out_dir)


def run_child(mode: str, spec: dict[str, Any], gpus: list[int], timeout_s: float, out_dir: Path) -> list[dict]:
    spec_path = out_dir / f"{mode}.spec.json"
    spec_path.write_text(json.dumps(spec))
    log = out_dir / f"{mode}.log"
    res = run_guarded(
        [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--child-spec", str(spec_path)],
        gpu_env(gpus),
        timeout_s,
        log,
    )
    recs = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"kind"' in line:
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    for r in recs:
        emit(r, out_dir / "bench.jsonl")
    if res["rc"] != 0 or not recs:
        emit({"kind": f"{mode}_status", **res, "log_tail": tail(log)}, out_dir / "bench.jsonl")
    return recs


# ----------------------------------------------------------------------------- lane: TRL (issue 14)
def trl_spec(a: argparse.Namespace, model_dir: str, card: str) -> dict[str, Any]:
    """What bench/trl_lane.py runs: the `rlvr train` flags of the colocate1 lane (model dir, prompts, P, G, M, seed,
    lr) and TRL's own settings."""
    return {
        "argv": train_argv(a, parse_config("colocate1"), model_dir, "trl"),
        "card": card,
        "steps": a.steps,
        "micro_batch": a.trl_micro_batch,
        "vllm_gpu_memory_utilization": a.trl_vllm_mem,
        "dtype": a.trl_dtype or None,
        "overrides": a.trl_overrides,
        "output_dir": str(Path(a.runs_dir) / f"trl-{os.getpid()}-{int(time.time())}"),
    }


def lane_trl(
    a: argparse.Namespace,
    gpu: int,
    num_gpus: int,
    model_dir: str,
    card: str,
    timeout_s: float,
    out_dir: Path,
    results: dict,
) -> None:
    """TRL's GRPOTrainer (vLLM colocate) on GPU `gpu` in its own process; one `trl` line, also in results["trl"]."""
    jl = out_dir / "bench.jsonl"
    spec = trl_spec(a, model_dir, card)
    rec: dict[str, Any] = {
        "kind": "trl",
        "config": "trl_colocate1",
        "shape": a.shape,
        "card": card,
        "gpus": 1,
        "prompts_per_step": a.prompts_per_step,
        "group_size": a.group_size,
        "max_new_tokens": a.max_new_tokens,
        "steps": a.steps,
    }
    results["trl"] = rec
    missing = trl_lane.trl_missing()
    script = Path(__file__).resolve().parent / "trl_lane.py"
    spec_path = out_dir / "trl.spec.json"
    if a.dry_run:  # the spec is written, so the printed command runs by hand
        spec_path.write_text(json.dumps(spec))
        rec.update(dry_run=True, gpu=gpu, timeout_s=round(timeout_s))
        rec["cmd"] = (
            f"CUDA_VISIBLE_DEVICES={physical([gpu])[0]} "
            f"{shlex.join([sys.executable, str(script), '--spec', str(spec_path)])}"
        )
        try:
            w = trl_lane.workload(spec["argv"])
            rec.update(workload=w, grpo_config=trl_lane.grpo_config_kwargs(w, spec))
        except BaseException as e:  # tyro exits on bad flags
            rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        if missing:
            rec["skipped"] = missing
        emit(rec, jl)
        return
    if missing or num_gpus < 1 or timeout_s < 60:
        rec["skipped"] = missing or ("no GPU" if num_gpus < 1 else f"budget left {timeout_s:.0f}s")
        emit(rec, jl)
        return
    spec_path.write_text(json.dumps(spec))
    log = out_dir / "trl.log"
    res = run_guarded([sys.executable, str(script), "--spec", str(spec_path)], gpu_env([gpu]), timeout_s, log, [gpu])
    rec.update(res, timeout_s=round(timeout_s))
    lines = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith('{"kind": "trl_'):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    for r in lines:
        if r["kind"] == "trl_skipped":
            rec["skipped"] = r.get("skipped")
        elif r["kind"] == "trl_start":
            rec.update(
                {k: r.get(k) for k in ("versions", "grpo_config", "effective", "startup_s", "prompt_ids_match_rlvr")}
            )
        elif r["kind"] == "trl_done":
            rec.update({k: v for k, v in r.items() if k != "kind"})
    steps = [r for r in lines if r["kind"] == "trl_step"]
    rec.update(trl_lane.summarize_steps(steps))
    rec["steps_raw"] = steps
    if res["rc"] != 0 or not steps:
        rec["log_tail"] = tail(log)
    emit(rec, jl)


# ----------------------------------------------------------------------------- main
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="colocate1,split2_async0,split2_async1")
    p.add_argument("--lanes", default="standalone,learner", help="extra lanes: standalone, learner, trl (or 'none')")
    p.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(SHAPES))
    p.add_argument(
        "--lora-compare",
        type=int,
        default=0,
        metavar="RANK",
        help="run every config again with LoRA of this rank and print full_vs_lora lines (0: off)",
    )
    p.add_argument("--lora-lr", type=float, default=1e-5, help="learning rate of the --lora-compare runs")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--prompts-per-step", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--extra", default="", help="flags appended to every rlvr train command (and learner variants)")
    p.add_argument(
        "--extra-configs",
        default="",
        help="';'-separated CONFIG:TAG=FLAGS runs repeated with extra flags, e.g. "
        "'split2_async1:fast=--model.gradient-checkpointing False'",
    )
    p.add_argument(
        "--learner-variants",
        default=DEFAULT_LEARNER_VARIANTS,
        help="';'-separated NAME=FLAGS for the learner microbench",
    )
    p.add_argument("--learner-samples", type=int, default=64, help="samples in the learner microbench batch")
    p.add_argument("--budget-s", type=float, default=420.0, help="total wall budget of this script")
    p.add_argument("--run-timeout-s", type=float, default=170.0, help="cap per rlvr run")
    p.add_argument(
        "--reserve-per-run-s",
        type=float,
        default=100.0,
        help="budget kept back for each later rlvr run when capping the current one",
    )
    p.add_argument("--standalone-timeout-s", type=float, default=240.0)
    p.add_argument("--trl-timeout-s", type=float, default=270.0, help="cap of the trl lane's run")
    p.add_argument(
        "--trl-micro-batch",
        type=int,
        default=trl_lane.MICRO_BATCH,
        help="trl lane: per_device_train_batch_size (completions); accumulation = prompts x group size / this",
    )
    p.add_argument("--trl-vllm-mem", type=float, default=trl_lane.VLLM_GPU_MEMORY, help="trl lane: vLLM's share")
    p.add_argument(
        "--trl-dtype",
        default="",
        choices=["", "float32", "bfloat16"],
        help="trl lane: model_init_kwargs dtype ('' = TRL's default, float32 weights under bf16 autocast)",
    )
    p.add_argument("--trl-args", default="", help="trl lane: JSON object of GRPOConfig fields that override the lane's")
    p.add_argument(
        "--lane-share",
        type=float,
        default=0.42,
        help="with >= 2 GPUs the standalone+learner lane must end by this fraction of --budget-s "
        "(multi-GPU runs wait for it)",
    )
    p.add_argument("--serial", action="store_true", help="no concurrent lane next to colocate1")
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/rlvr-bench-out"))
    p.add_argument("--runs-dir", default="/tmp/rlvr-bench-runs")
    p.add_argument("--model-dir", default=None, help="default /tmp/rlvr-bench-model-<shape>")
    p.add_argument("--dry-run", action="store_true", help="print what would run, run nothing on GPUs")
    p.add_argument("--child", choices=["standalone", "learner"], help=argparse.SUPPRESS)
    p.add_argument("--child-spec", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        spec = json.loads(Path(a.child_spec).read_text())
        (child_standalone if a.child == "standalone" else run_variants)(spec)
        return 0

    t_start = time.time()
    deadline = t_start + a.budget_s
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    jl = out_dir / "bench.jsonl"
    a.lanes = [x for x in a.lanes.split(",") if x and x != "none"]
    unknown = sorted(set(a.lanes) - {"standalone", "learner", "trl"})
    if unknown:
        p.error(f"--lanes: unknown lane(s) {unknown}; use standalone, learner, trl or none")
    try:
        a.trl_overrides = json.loads(a.trl_args) if a.trl_args.strip() else {}
    except json.JSONDecodeError as e:
        p.error(f"--trl-args is not JSON: {e}")
    if not isinstance(a.trl_overrides, dict):
        p.error("--trl-args must be a JSON object of GRPOConfig fields, e.g. '{\"vllm_enable_sleep_mode\": true}'")
    if "trl" in a.lanes and (a.trl_micro_batch <= 0 or (a.prompts_per_step * a.group_size) % a.trl_micro_batch):
        p.error(
            f"--trl-micro-batch {a.trl_micro_batch} must divide --prompts-per-step x --group-size "
            f"= {a.prompts_per_step * a.group_size}"
        )
    configs = [parse_config(x) for x in a.configs.split(",") if x]
    extra_runs = []
    for item in [x for x in a.extra_configs.split(";") if x.strip()]:
        head, _, flags = item.partition("=")
        cname, _, tag = head.partition(":")
        extra_runs.append((parse_config(cname.strip()), tag.strip() or "extra", flags))
    if a.lora_compare:
        r = a.lora_compare
        extra_runs += [
            (c, f"lora_r{r}", f"--learner.lora-rank {r} --learner.lora-alpha {2 * r} --learner.lr {a.lora_lr}")
            for c in configs
        ]
    names = [] if a.dry_run else gpu_names()  # a dry run plans for the GPUs it is given (default 2), not the host's
    num_gpus = (len(visible_devices()) or 2) if a.dry_run else len(names)
    card = names[0] if names else "unknown"
    peak = peak_for(card)
    model_dir = a.model_dir or f"/tmp/rlvr-bench-model-{a.shape}"
    t = time.time()
    if not a.dry_run:
        from rlvr.data import builtin_corpus
        from rlvr.models.shaped import build_shaped_model_dir

        build_shaped_model_dir(a.shape, list(builtin_corpus("copy4")), model_dir, 0)  # run.py's corpus and seed
        facts = model_facts(model_dir)
    else:
        from rlvr.models.shaped import VOCAB_SIZE  # no torch needed for the arithmetic

        s = SHAPES[a.shape]
        facts = model_facts_from(s, VOCAB_SIZE)
    emit(
        {
            "kind": "setup",
            "card": card,
            "gpus": num_gpus,
            "peak_flops": peak,
            "shape": a.shape,
            "model_dir": model_dir,
            "model_build_s": round(time.time() - t, 1),
            **facts,
            "dry_run": a.dry_run,
            "budget_s": a.budget_s,
        },
        jl,
    )

    results: dict[str, Any] = {}
    todo = [(c, "base", "") for c in configs] + extra_runs
    runnable = [(c, tag, fl) for c, tag, fl in todo if c["gpus"] <= num_gpus]
    for c, tag, _ in todo:
        if c["gpus"] > num_gpus:
            emit(
                {
                    "kind": "rlvr",
                    "config": c["name"],
                    "tag": tag,
                    "skipped": f"needs {c['gpus']} GPUs, have {num_gpus}",
                },
                jl,
            )

    def do_run(c: dict, tag: str, flags: str, gpus: list[int], remaining_runs: int) -> None:
        left = deadline - time.time()  # keep --reserve-per-run-s for each run still to come
        timeout = min(a.run_timeout_s, max(30.0, left - a.reserve_per_run_s * (remaining_runs - 1)))
        if not a.dry_run and left < 45:
            emit({"kind": "rlvr", "config": c["name"], "tag": tag, "skipped": f"budget left {left:.0f}s"}, jl)
            return
        saved = a.extra
        a.extra = (a.extra + " " + flags).strip()
        rec = run_config(a, c, gpus, model_dir, facts, card, peak, timeout, out_dir, tag)
        a.extra = saved
        rec["timeout_s"] = round(timeout)
        results[(c["name"], tag)] = rec
        emit(rec, jl)

    lane_thread = None
    side_gpu = num_gpus - 1
    side_lanes = [x for x in a.lanes if x in ("standalone", "learner")]
    parallel = num_gpus >= 2 and not a.serial and bool(side_lanes)
    if parallel:  # standalone vLLM then the learner microbench on the last GPU, next to colocate1 on GPU 0
        lane_deadline = (
            t_start + a.lane_share * a.budget_s if any(not c["colocate"] for c, _, _ in runnable) else deadline
        )
        lane_deadline = max(lane_deadline, time.time() + 60)
        lane_thread = threading.Thread(
            target=lane_standalone_learner,
            daemon=True,
            args=(a, side_gpu, model_dir, facts, card, peak, lane_deadline, out_dir, results),
        )
        lane_thread.start()
    order = sorted(runnable, key=lambda x: (not x[0]["colocate"], x[0]["gpus"]))
    trl_todo = "trl" in a.lanes
    trl_thread = None
    if trl_todo and not a.serial and (num_gpus >= 3 or (num_gpus == 2 and not parallel)):
        # TRL beside colocate1 on GPU 0: on the last GPU, or the one before it where the side lane takes the last
        trl_gpu = num_gpus - 2 if parallel else num_gpus - 1
        trl_thread = threading.Thread(
            target=lane_trl,
            daemon=True,
            args=(a, trl_gpu, num_gpus, model_dir, card, min(a.trl_timeout_s, a.budget_s), out_dir, results),
        )
        trl_thread.start()
        trl_todo = False

    def do_trl(runs_after: int) -> None:  # on GPU 0 after the colocated runs, before the multi-GPU ones
        left = deadline - time.time()
        timeout = min(a.trl_timeout_s, left - a.reserve_per_run_s * runs_after)
        lane_trl(a, 0, num_gpus, model_dir, card, a.trl_timeout_s if a.dry_run else timeout, out_dir, results)

    for i, (c, tag, flags) in enumerate(order):
        if trl_todo and not c["colocate"]:
            do_trl(len(order) - i)
            trl_todo = False
        if trl_thread is not None and not c["colocate"]:  # multi-GPU runs need TRL's GPU back
            trl_thread.join()
            trl_thread = None
        if c["colocate"] or not parallel:
            do_run(c, tag, flags, [0] if c["gpus"] == 1 else list(range(c["gpus"])), len(order) - i + trl_todo)
            continue
        if lane_thread is not None:  # multi-GPU runs need the side GPU back
            lane_thread.join()
            lane_thread = None
        do_run(c, tag, flags, list(range(c["gpus"])), len(order) - i)
    if trl_todo:
        do_trl(0)
    if trl_thread is not None:
        trl_thread.join()
    if lane_thread is not None:
        lane_thread.join()
    if not parallel and side_lanes and num_gpus >= 1:
        lane_standalone_learner(a, 0, model_dir, facts, card, peak, deadline, out_dir, results)

    emit(summary_line(a, results, card, peak, t_start, jl), jl)
    return 0


def model_facts_from(shape: dict[str, Any], vocab: int) -> dict[str, Any]:
    d, L, inter = shape["hidden_size"], shape["num_hidden_layers"], shape["intermediate_size"]
    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    kv_dim = d // heads * kv
    return {
        "N_matmul": L * (2 * d * d + 2 * d * kv_dim + 3 * d * inter) + vocab * d,
        "L": L,
        "d": d,
        "heads": heads,
        "kv_heads": kv,
        "vocab": vocab,
    }


if __name__ == "__main__":
    sys.exit(main())
