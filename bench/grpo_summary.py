"""What bench/gpu_grpo.py reports: a run's metrics.jsonl turned into its one JSON line (tokens/s/GPU, phases, weight
sync, MFU, GPU time shares), the TRL comparison, and the bench's closing `summary` line."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from gpu_learner import emit, mfu, rnd


def mean(xs: list[float]) -> float:
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return sum(xs) / len(xs) if xs else float("nan")


def summarize_run(rows: list[dict[str, Any]], c: dict[str, Any], facts: dict[str, Any], peak: float | None) -> dict:
    steps = [r for r in rows if "time/train" in r]
    out: dict[str, Any] = {"steps_logged": len(steps)}
    if not steps:
        return out
    # Step 1 is warm-up (engine start, compile). With async_steps K the next K steps train on rollouts the engines
    # made during that warm-up, so they come faster than the loop can keep up; they are left out too (while at
    # least one step remains), so the figures are the steady state.
    skip = min(1 + max(0, int(c.get("async_steps", 0))), len(steps) - 1) if len(steps) > 1 else 0
    meas = steps[skip:]
    out["steps_measured"] = len(meas) if skip else 0  # 0: only the warm-up step is available
    out["steps_skipped"] = skip

    def m(k: str) -> float:
        return mean([r.get(k, float("nan")) for r in meas])

    # wall per step: gap between consecutive metric records (all of the loop), falling back to time/step
    walls = [steps[i]["time"] - steps[i - 1]["time"] for i in range(max(1, skip), len(steps))] or [
        steps[0]["time/step"]
    ]
    wall = mean(walls)
    samples = m("rollout/num_samples")
    p_len, c_len = m("rollout/prompt_len_mean"), m("rollout/completion_len_mean")
    tokens = samples * (p_len + c_len)
    staged = [r["sync/engine_staged_min"] for r in meas if "sync/engine_staged_min" in r]  # staged sync: 1, or 0
    gen, wait, reward, train, sync = (
        m("time/generation"),
        m("time/wait_generation"),
        m("time/reward"),
        m("time/train"),
        m("time/sync"),
    )
    sync_bytes = m("sync/bytes")
    out.update(
        {
            "prompt_len_mean": rnd(p_len, 1),
            "completion_len_mean": rnd(c_len, 1),
            "samples_per_step": rnd(samples, 1),
            "tokens_per_step": rnd(tokens, 0),
            "step_wall_s": rnd(wall, 3),
            "time_step_s": rnd(m("time/step"), 3),
            "tokens_per_s": rnd(tokens / wall, 1),
            "tokens_per_s_per_gpu": rnd(tokens / wall / c["gpus"], 1),
            "phase_s": {
                "generation": rnd(gen, 3),
                "wait_generation": rnd(wait, 3),
                "reward": rnd(reward, 3),
                "logprob_recompute": "inside train (one optimizer step per batch: l_old = stopgrad)",
                "train": rnd(train, 3),
                "engine_sleep_inside_train": rnd(m("time/engine_sleep"), 3),
                "sync_cycle": rnd(sync, 3),
                "learner_idle": rnd(max(0.0, wall - train - sync), 3),
                # engines wait through train + sync when nothing runs ahead (async0) or they sleep (colocated)
                "engine_idle_est": rnd(train + sync, 3) if c["async_steps"] == 0 or c["colocate"] else None,
            },
            "engine_rollout_tokens_per_s": engine_rollout_rate(
                samples * c_len, wall, gen, m("perf/engine_busy_frac"), m("sync/engine_paused_s_max"), c
            ),
            "weight_sync": {
                "cycle_s": rnd(sync, 4),
                "learner_send_s": rnd(m("sync/seconds"), 4),
                "engine_load_s_max": rnd(m("sync/engine_load_s_max"), 4),
                "engine_pause_s_max": rnd(m("sync/engine_pause_s_max"), 4),
                "engine_receive_load_s_max": rnd(m("sync/engine_receive_load_s_max"), 4),
                "engine_finish_s_max": rnd(m("sync/engine_finish_s_max"), 4),
                "engine_total_s_max": rnd(m("sync/engine_total_s_max"), 4),
                # generation lost per sync (the whole update, or only the load with --rollout.vllm-staged-sync),
                # the background receive, and whether every engine staged (1) or some paused instead (0)
                "engine_paused_s_max": rnd(m("sync/engine_paused_s_max"), 4),
                "engine_stage_s_max": rnd(m("sync/engine_stage_s_max"), 4),
                "engine_staged_min": min(staged) if staged else None,
                # the driver's wall per phase: engines paused for the session (CUDA IPC), the transfer (NCCL/gloo:
                # the whole collective, send and receive together), what the engines still did after the learner's
                # send returned (CUDA IPC: finish the session; NCCL: ~0), and (colocated with sleep) the wake-ups
                "wall_begin_s": rnd(m("sync/wall_begin_s"), 4),
                "wall_send_s": rnd(m("sync/wall_send_s"), 4),
                "wall_receive_s": rnd(m("sync/wall_receive_s"), 4),
                "wall_wake_s": rnd(m("sync/wall_wake_s"), 4),
                "gb": rnd(sync_bytes / 1e9, 3),
                "cycle_gb_per_s": rnd(sync_bytes / 1e9 / sync, 2) if sync else None,
                "send_gb_per_s": rnd(m("sync/gb_per_s"), 2),
            },
            "learner_mfu": rnd(mfu(facts, tokens, p_len + c_len, train, c["learners"], peak), 4),
            "learner_tokens_per_s_per_gpu": rnd(tokens / train / c["learners"], 1),
            "padding_waste": rnd(1 - m("perf/padded_token_efficiency"), 4),
            "pack_waste": rnd(1 - m("perf/packing_efficiency"), 4),
            "packed_rows": rnd(m("perf/num_packed_rows"), 1),
            "micro_batches_per_rank": rnd(m("perf/micro_batches_per_rank"), 1),
            "staleness_mean": rnd(m("rollout/staleness_mean"), 3),
            "truncated_rate": rnd(m("rollout/truncated_rate"), 3),
        }
    )
    last = steps[-1]
    out["prompts"] = {k.split("/", 1)[1]: last.get(k) for k in sorted(last) if k.startswith("data/prompts_")}
    out["step_walls_s"] = [round(w, 2) for w in walls]
    ordered = sorted(walls)
    p50, p90 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, math.ceil(0.9 * len(ordered)) - 1)]
    out["step_wall_p90_over_p50"] = rnd(p90 / p50, 3) if p50 > 0 else None  # issue 14 W2: <= 1.3
    out["train_s_per_step"] = [round(r["time/train"], 2) for r in steps]
    out["gpu_time_share"] = gpu_time_share(
        wall, train, sync, m("perf/engine_busy_frac"), m("sync/engine_paused_s_max"), c["colocate"]
    )
    return out


def engine_rollout_rate(
    completion_tokens: float, wall: float, gen: float, busy: float, paused: float, c: dict[str, Any]
) -> float | None:
    """Completion tokens per second of ONE engine while it generates: what bench/gpu_grpo.py's standalone lane
    measures for vLLM alone on the same batch (issue 14 W1: >= 0.9x). async 0: the step's tokens over the driver's
    generation phase (the engines generate only then). async >= 1 (generation overlaps training): the step's tokens
    over the step wall times the engines' generating share (`perf/engine_busy_frac` less the generation lost to the
    weight sync), per engine. None where the share is unknown (older logs) or zero."""
    engines = max(1, int(c.get("engines", 1)))
    if c["async_steps"] == 0:
        return rnd(completion_tokens / gen / engines, 1) if gen and gen == gen else None
    if busy != busy or not wall or wall != wall:
        return None
    generating = busy - (0.0 if paused != paused else paused / wall)
    if generating <= 0:
        return None
    return rnd(completion_tokens / (wall * generating) / engines, 1)


def gpu_time_share(
    wall: float, train: float, sync: float, busy: float, paused: float, colocate: bool
) -> dict[str, Any] | None:
    """Issue 14's scaling-table columns: the share of a step's wall each kind of GPU spends per activity.
    learner GPUs: train, sync (the learner's side of the weight sync, `time/sync`), idle (the rest: waiting for
    rollouts). engine GPUs: generating (requests in flight, `perf/engine_busy_frac`, less the generation lost to
    the sync), sync (generation lost per sync: `sync/engine_paused_s_max`), idle. Colocated, both are the one GPU:
    its shares can overlap (an awake engine generates while the learner trains), so the share in which neither
    works lies between `shared_idle_min` (no overlap, as with sleep mode) and `shared_idle_max` (full overlap).
    None without a step wall."""
    if not wall or wall != wall:
        return None
    r3 = lambda x: None if x != x else round(max(0.0, min(1.0, x)), 3)  # noqa: E731  (nan -> None)
    lrn = {"train": r3(train / wall), "sync": r3(sync / wall), "idle": r3(1 - (train + sync) / wall)}
    if busy != busy:  # no engine counters (older run logs)
        eng: dict[str, Any] = {"generating": None, "sync": r3(paused / wall), "idle": None}
    else:
        lost = 0.0 if paused != paused else paused / wall
        eng = {"generating": r3(busy - lost), "sync": r3(lost), "idle": r3(1 - busy)}
    out: dict[str, Any] = {"learner_gpu": lrn, "engine_gpu": eng}
    if colocate:
        out["shared_gpu"] = True
        if busy == busy:
            out["shared_idle_min"] = r3(1 - busy - (train + sync) / wall)
            out["shared_idle_max"] = r3(1 - max(busy, (train + sync) / wall))
    return out


def trl_summary(
    base: dict[str, dict[str, Any]], trl: dict[str, Any] | None, results: dict[Any, Any] | None = None
) -> dict[str, Any]:
    """The summary's TRL keys: `trl.tokens_per_s_per_gpu` and `rlvr_trl_ratio` = rlvr's colocated tokens/s/GPU (the
    preset as it is: the `base` run) over TRL's (None when either side has no figure), or `trl.skipped`; and
    `rlvr_trl_ratio_by_run`: the same for every one-GPU rlvr run of `results` (CONFIG or CONFIG:TAG)."""
    if trl is None:
        return {}
    out: dict[str, Any] = {"trl.tokens_per_s_per_gpu": trl.get("tokens_per_s_per_gpu")}
    if trl.get("skipped"):
        out["trl.skipped"] = trl["skipped"]
    name = "colocate1" if "colocate1" in base else next((n for n in base if n.startswith("colocate1")), None)
    rlvr_rate = (base.get(name) or {}).get("tokens_per_s_per_gpu") if name else None
    trl_rate = trl.get("tokens_per_s_per_gpu")
    out["rlvr_trl_ratio"] = round(rlvr_rate / trl_rate, 3) if rlvr_rate and trl_rate else None
    out["rlvr_trl_ratio_config"] = name
    by_run = {}
    for key, r in (results or {}).items():
        if isinstance(key, tuple) and r.get("gpus") == 1 and r.get("tokens_per_s_per_gpu") and trl_rate:
            by_run[key[0] if key[1] == "base" else f"{key[0]}:{key[1]}"] = round(
                r["tokens_per_s_per_gpu"] / trl_rate, 3
            )
    if by_run:
        out["rlvr_trl_ratio_by_run"] = by_run
    return out


def side(r: dict[str, Any]) -> dict[str, Any]:
    """One run's figures for the full_vs_lora line."""
    ws = r.get("weight_sync") or {}
    return {
        "sync_cycle_s": ws.get("cycle_s"),
        "learner_send_s": ws.get("learner_send_s"),
        "engine_load_s_max": ws.get("engine_load_s_max"),
        "sync_gb": ws.get("gb"),
        "step_wall_s": r.get("step_wall_s"),
        "time_step_s": r.get("time_step_s"),
        "train_s": (r.get("phase_s") or {}).get("train"),
        "peak_mem_gib_per_gpu": r.get("peak_mem_gib"),
        "steps_measured": r.get("steps_measured"),
        "rc": r.get("rc"),
        "timed_out": r.get("timed_out"),
    }


def summary_line(
    a: argparse.Namespace, results: dict[Any, Any], card: str, peak: float | None, t_start: float, jl: Path
) -> dict[str, Any]:
    """The bench's last line: per-run figures, async and standalone ratios, the TRL comparison, and the learner
    micro-bench; emits the `full_vs_lora` lines of `--lora-compare` on the way."""
    import time

    summary: dict[str, Any] = {
        "kind": "summary",
        "card": card,
        "peak_flops": peak,
        "shape": a.shape,
        "elapsed_s": round(time.time() - t_start, 1),
    }
    base = {k[0]: v for k, v in results.items() if isinstance(k, tuple) and k[1] == "base"}
    for name, r in base.items():
        summary[f"{name}.tokens_per_s_per_gpu"] = r.get("tokens_per_s_per_gpu")
        summary[f"{name}.learner_mfu"] = r.get("learner_mfu")
        summary[f"{name}.sync_cycle_s"] = (r.get("weight_sync") or {}).get("cycle_s")
    a0, a1 = base.get("split2_async0", {}), base.get("split2_async1", {})
    if a0.get("tokens_per_s") and a1.get("tokens_per_s"):
        summary["async1_over_async0"] = round(a1["tokens_per_s"] / a0["tokens_per_s"], 3)
    sa = {r.get("mode"): r for r in results.get("standalone", []) if r.get("kind") == "standalone_vllm"}
    rate = a0.get("engine_rollout_tokens_per_s")
    for mode, r in sa.items():
        summary[f"standalone.{mode}.completion_tokens_per_s"] = r.get("completion_tokens_per_s")
        if rate:
            summary[f"rollout_over_standalone.{mode}"] = round(rate / r["completion_tokens_per_s"], 3)
    # every run's engine rate against standalone vLLM on one step's batch (n=G per prompt) in the same bench run;
    # an async run's engine may hold more than one step's requests at once (see `prompts_in_flight`)
    ref = (sa.get("step_plain") or {}).get("completion_tokens_per_s")
    by_run = {
        k[0] if k[1] == "base" else f"{k[0]}:{k[1]}": round(r["engine_rollout_tokens_per_s"] / ref, 3)
        for k, r in results.items()
        if isinstance(k, tuple) and r.get("engine_rollout_tokens_per_s") and ref
    }
    if by_run:
        summary["rollout_over_standalone_by_run"] = by_run
    for k, r in results.items():
        if isinstance(k, tuple) and k[1] != "base":
            summary[f"{k[0]}:{k[1]}.tokens_per_s_per_gpu"] = r.get("tokens_per_s_per_gpu")
            summary[f"{k[0]}:{k[1]}.learner_mfu"] = r.get("learner_mfu")
    for (name, tag), r in [(k, v) for k, v in results.items() if isinstance(k, tuple) and k[1].startswith("lora_r")]:
        full = base.get(name)
        if full is not None:
            emit(
                {
                    "kind": "full_vs_lora",
                    "config": name,
                    "shape": a.shape,
                    "card": card,
                    "lora": tag,
                    "full": side(full),
                    tag: side(r),
                },
                jl,
            )
            summary[f"{name}:{tag}.sync_cycle_s"] = (r.get("weight_sync") or {}).get("cycle_s")
    summary.update(trl_summary(base, results.get("trl"), results))
    lb = [r for r in results.get("learner", []) if r.get("kind") == "learner_microbench" and "mfu" in r]
    if lb:
        summary["learner_microbench_mfu"] = {r["variant"]: r["mfu"] for r in lb}
    return summary
