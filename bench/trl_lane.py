"""The `trl` lane of bench/gpu_grpo.py (issue 14): TRL's `GRPOTrainer` with vLLM colocate on rlvr's own workload.

    python3 bench/trl_lane.py --spec SPEC.json      (gpu_grpo.py writes the spec, runs this in its own process
                                                     group on one GPU and reads the JSON lines it prints)

The workload is the one rlvr's `colocate1` lane runs, read from the same `rlvr train` flags (the spec's `argv`):
the same model directory (random weights of a real shape), the same prompts (rlvr's PromptStream over
builtin:copy4, raw text, the first prompts-per-step x steps requests), prompts per step P, samples per prompt G,
completion length M, temperature/top-p/top-k, seed and learning rate. TRL runs it the way its users do:
`use_vllm=True, vllm_mode="colocate"`, `vllm_gpu_memory_utilization` 0.35, gradient checkpointing, `beta=0`,
`bf16=True` (TRL's mixed precision: the model loads in TRL's default float32 unless the spec's `dtype` says
otherwise), `per_device_train_batch_size` 32 completions and P*G/32 accumulation steps, so one optimizer step is one
generation of P prompts x G samples. Every completion runs to M tokens (`generation_kwargs={"ignore_eos": True}`,
the vLLM SamplingParams flag rlvr's lane sets through RLVR_IGNORE_EOS=1). The reward is random (it only has to give
non-zero advantages so that every sample trains).

Output, one JSON line each: `trl_start` (versions, the GRPOConfig arguments, start-up seconds), one `trl_step` per
optimizer step (perf_counter times of step begin/end, prompt and completion tokens of that step's generation, host
seconds in vLLM generate and in the weight sync), `trl_done`. gpu_grpo.py turns them into its `trl` line with
`summarize_steps`: wall per step = gap between consecutive step ends, tokens/s over steps 2..N (step 1 is warm-up),
as its rlvr lane does.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TRL_VERSION = "1.16.0"
INSTALL_HINT = "pip install -e '.[bench]' (trl==1.16.0; vLLM from the gpu extra)"
MICRO_BATCH = 32  # completions per device per micro-step, as in issue 14's TRL measurement
VLLM_GPU_MEMORY = 0.35


def trl_missing() -> str | None:
    """None when trl is installed, else the message the lane is skipped with."""
    try:
        importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        return f"trl lane skipped: trl is not installed here; {INSTALL_HINT}"
    return None


def trl_version() -> str | None:
    try:
        return importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        return None


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj, default=str), flush=True)


# ----------------------------------------------------------------------------- the workload and TRL's arguments
def workload(argv: list[str]) -> dict[str, Any]:
    """The fields of rlvr's lane that the TRL run copies, from the same `rlvr train` flags."""
    from rlvr.cli import parse_train_args

    cfg = parse_train_args(argv).experiment
    return {
        "model_dir": cfg.model.path,
        "prompts_per_step": cfg.rollout.prompts_per_step,
        "group_size": cfg.generation.num_samples,
        "max_new_tokens": cfg.generation.max_new_tokens,
        "max_prompt_tokens": cfg.data.max_prompt_tokens,
        "temperature": cfg.generation.temperature,
        "top_p": cfg.generation.top_p,
        "top_k": cfg.generation.top_k,
        "seed": cfg.seed,
        "lr": cfg.learner.lr,
        "gradient_checkpointing": cfg.model.gradient_checkpointing,
        "dtype": cfg.model.dtype,
    }


def grpo_config_kwargs(w: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """`GRPOConfig(**kwargs)` for the lane: rlvr's workload `w`, TRL's usual single-GPU settings, then the spec's
    `overrides` (a dict of GRPOConfig fields)."""
    P, G, M = w["prompts_per_step"], w["group_size"], w["max_new_tokens"]
    mb = int(spec.get("micro_batch") or MICRO_BATCH)
    if mb <= 0 or (P * G) % mb:
        raise ValueError(
            f"--trl-micro-batch {mb} must be a positive divisor of prompts-per-step x group-size = {P}x{G} = {P * G}"
        )
    use_vllm = bool(spec.get("use_vllm", True))
    kw: dict[str, Any] = {
        "output_dir": spec["output_dir"],
        "max_steps": int(spec["steps"]),
        "per_device_train_batch_size": mb,  # completions, not prompts
        "gradient_accumulation_steps": P * G // mb,  # -> generation_batch_size P*G: one generation per step
        "num_generations": G,
        "max_completion_length": M,
        "temperature": w["temperature"],
        "top_p": w["top_p"],
        "top_k": w["top_k"],
        "learning_rate": w["lr"],
        "beta": 0.0,
        "bf16": True,
        "gradient_checkpointing": True,
        "use_vllm": use_vllm,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": float(spec.get("vllm_gpu_memory_utilization") or VLLM_GPU_MEMORY),
        "vllm_max_model_length": w["max_prompt_tokens"] + M,  # as rlvr's engine sizes max_model_len
        # every completion runs to M: vLLM's ignore_eos (transformers' generate: min_new_tokens)
        "generation_kwargs": {"ignore_eos": True} if use_vllm else {"min_new_tokens": M},
        "seed": w["seed"],
        "logging_steps": 1,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
    }
    if spec.get("dtype"):
        kw["model_init_kwargs"] = {"dtype": spec["dtype"]}
    kw.update(spec.get("overrides") or {})
    return kw


def lane_prompts(argv: list[str], tokenizer: Any, count: int) -> tuple[list[str], list[int], bool]:
    """The first `count` prompts of rlvr's PromptStream for these flags: texts, token counts, and whether the
    tokenizer call TRL makes (`tokenizer(text=...)`) gives the same ids as rlvr's."""
    from rlvr.cli import parse_train_args
    from rlvr.data import PromptStream

    stream = PromptStream(parse_train_args(argv).experiment, tokenizer)
    texts, lens, same = [], [], True
    for _ in range(count):
        r = stream.next_request()
        if r is None:
            break
        texts.append(r.prompt_text)
        lens.append(len(r.prompt_token_ids))
        same = same and list(tokenizer(text=r.prompt_text)["input_ids"]) == list(r.prompt_token_ids)
    if not texts:
        raise ValueError("the lane's prompt stream gave no prompts")
    return texts, lens, same


# ----------------------------------------------------------------------------- step lines -> one figure
def summarize_steps(steps: list[dict[str, Any]], gpus: int = 1) -> dict[str, Any]:
    """The figures of one TRL run from its `trl_step` lines, the way gpu_grpo's rlvr lane computes its own:
    wall per step = gap between consecutive step ends (steps 2..N; step 1 alone gives its begin-to-end time and
    `steps_measured` 0), tokens per step = prompt + completion tokens of the step's generation."""
    steps = sorted(steps, key=lambda r: r["step"])
    out: dict[str, Any] = {"steps_logged": len(steps)}
    if not steps:
        return out
    meas = steps[1:] if len(steps) > 1 else steps
    out["steps_measured"] = len(meas) if len(steps) > 1 else 0
    walls = [steps[i]["t_end"] - steps[i - 1]["t_end"] for i in range(1, len(steps))] or [
        steps[0]["t_end"] - steps[0]["t_begin"]
    ]

    def m(key: str) -> float:
        xs = [r[key] for r in meas if r.get(key) is not None]
        return sum(xs) / len(xs) if xs else float("nan")

    wall = sum(walls) / len(walls)
    tokens = m("prompt_tokens") + m("completion_tokens")
    samples = m("samples")

    def r(x: float, n: int) -> float | None:
        return None if math.isnan(x) or math.isinf(x) else round(x, n)

    out.update(
        {
            "samples_per_step": r(samples, 1),
            "prompt_len_mean": r(m("prompt_tokens") / samples, 1) if samples else None,
            "completion_len_mean": r(m("completion_tokens") / samples, 1) if samples else None,
            "completion_len_min": min(
                (s["completion_len_min"] for s in meas if "completion_len_min" in s), default=None
            ),
            "tokens_per_step": r(tokens, 0),
            "step_wall_s": r(wall, 3),
            "tokens_per_s": r(tokens / wall, 1) if wall > 0 else None,
            "tokens_per_s_per_gpu": r(tokens / wall / gpus, 1) if wall > 0 else None,
            "phase_s": {
                "in_step": r(m("in_step_s"), 3),
                "vllm_generate": r(m("generate_s"), 3),
                "sync_weights": r(m("sync_weights_s"), 3),
            },
            "step_walls_s": [round(x, 2) for x in walls],
            "warmup_step_s": round(steps[0]["t_end"] - steps[0]["t_begin"], 2),
        }
    )
    return out


# ----------------------------------------------------------------------------- the run (needs trl, and vLLM on GPU)
def run(spec: dict[str, Any]) -> None:
    t_proc = time.perf_counter()
    import datasets
    import torch
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    w = workload(spec["argv"])
    kwargs = grpo_config_kwargs(w, spec)
    P, G = w["prompts_per_step"], w["group_size"]
    tok = AutoTokenizer.from_pretrained(w["model_dir"])
    texts, lens, same_ids = lane_prompts(spec["argv"], tok, P * int(spec["steps"]))
    ds = datasets.Dataset.from_dict({"prompt": texts, "prompt_tokens": lens})

    step_stats: dict[str, Any] = {}
    rng = random.Random(w["seed"])

    def random_reward(prompts: list, completions: list, completion_ids: list, prompt_tokens: list, **_: Any) -> list:
        lengths = [len(c) for c in completion_ids]
        step_stats.update(
            samples=len(lengths),
            prompt_tokens=int(sum(prompt_tokens)),
            completion_tokens=int(sum(lengths)),
            completion_len_min=min(lengths),
            completion_len_max=max(lengths),
        )
        return [rng.random() for _ in completions]

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            step_stats.clear()
            step_stats.update(generate_s=0.0, sync_weights_s=0.0)
            self.t_begin = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t = time.perf_counter()
            emit(
                {
                    "kind": "trl_step",
                    "step": state.global_step,
                    "t_begin": round(self.t_begin - t_proc, 4),
                    "t_end": round(t - t_proc, 4),
                    "in_step_s": round(t - self.t_begin, 4),
                    "num_input_tokens_seen": int(state.num_input_tokens_seen),
                    **{k: round(v, 4) if isinstance(v, float) else v for k, v in step_stats.items()},
                }
            )

    args = GRPOConfig(**kwargs)
    trainer = GRPOTrainer(
        model=w["model_dir"], reward_funcs=random_reward, args=args, train_dataset=ds, callbacks=[StepTimer()]
    )
    vg = getattr(trainer, "vllm_generation", None)
    if vg is not None:  # host seconds inside vLLM's generate and the weight push (the trainer calls both on vg)
        for name in ("generate", "sync_weights"):
            orig = getattr(vg, name)

            def timed(*a: Any, _orig: Any = orig, _key: str = f"{name}_s", **k: Any) -> Any:
                t = time.perf_counter()
                try:
                    return _orig(*a, **k)
                finally:
                    step_stats[_key] = step_stats.get(_key, 0.0) + time.perf_counter() - t

            setattr(vg, name, timed)
    versions = {"trl": trl_version(), "torch": torch.__version__}
    try:
        versions["vllm"] = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        versions["vllm"] = None
    emit(
        {
            "kind": "trl_start",
            "startup_s": round(time.perf_counter() - t_proc, 1),
            "versions": versions,
            "workload": w,
            "grpo_config": kwargs,
            "effective": {
                "generation_batch_size": args.generation_batch_size,
                "steps_per_generation": args.steps_per_generation,
                "gradient_accumulation_steps": args.gradient_accumulation_steps,
                "bf16": args.bf16,
                "gradient_checkpointing": args.gradient_checkpointing,
                "model_dtype": str(next(trainer.model.parameters()).dtype),
            },
            "prompts": len(texts),
            "prompt_ids_match_rlvr": same_ids,
        }
    )
    if args.generation_batch_size != P * G:
        raise RuntimeError(f"TRL generation batch {args.generation_batch_size} != P*G = {P * G}")
    t = time.perf_counter()
    trainer.train()
    done: dict[str, Any] = {"kind": "trl_done", "train_s": round(time.perf_counter() - t, 1)}
    if torch.cuda.is_available():
        done["torch_max_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    emit(done)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", required=True, help="JSON file written by bench/gpu_grpo.py")
    a = p.parse_args()
    missing = trl_missing()
    if missing:
        emit({"kind": "trl_skipped", "skipped": missing})
        return 0
    run(json.loads(Path(a.spec).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
