"""Validation of a built `ExperimentConfig`: impossible values and contradictions, each with the fix.

Checked once when the config is built (before any actor or GPU is claimed). Checks that need the live
cluster (GPUs Ray reports) are in `check_resources`, called by the driver and `rlvr launch`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rlvr.config.errors import ConfigError
from rlvr.config.sections import ExperimentConfig


def _require(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM 0.26 takes for `max_lora_rank` (vllm/config/lora.py `MaxLoRARanks`); the engine starts with the
smallest one >= learner.lora_rank."""
VLLM_LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Adapter targets the vLLM engine serves on Llama/Qwen-style models (it packs q/k/v into qkv_proj and gate/up
into gate_up_proj); embeddings and the lm_head it does not take from an RL adapter."""


def _validate_lora(cfg: ExperimentConfig) -> None:
    lr = cfg.learner
    _require(lr.lora_rank >= 0, f"--learner.lora-rank must be >= 0 (got {lr.lora_rank}; 0 turns LoRA off)")
    if lr.lora_rank == 0:
        return
    _require(lr.lora_alpha > 0, f"--learner.lora-alpha must be > 0 (got {lr.lora_alpha})")
    _require(0 <= lr.lora_dropout < 1, f"--learner.lora-dropout must be in [0, 1) (got {lr.lora_dropout})")
    _require(
        len(lr.lora_target_modules) > 0,
        "--learner.lora-target-modules is empty: name the projections "
        f"that get adapters, e.g. {' '.join(VLLM_LORA_MODULES)}",
    )
    _require(
        lr.zero_stage != 3,
        "--learner.lora-rank with --learner.zero-stage 3 is not supported: the adapters "
        "are about 1% of the weights and the frozen base is not partitioned for them; use --learner.zero-stage "
        "2 (or 0)",
    )
    if cfg.rollout.backend != "vllm":
        return
    _require(
        lr.lora_rank <= max(VLLM_LORA_RANKS),
        f"--learner.lora-rank {lr.lora_rank} exceeds the largest LoRA "
        f"rank vLLM serves ({max(VLLM_LORA_RANKS)}, its max_lora_rank choices: "
        f"{', '.join(map(str, VLLM_LORA_RANKS))}); lower the rank or use --rollout.backend transformers",
    )
    bad = [m for m in lr.lora_target_modules if m not in VLLM_LORA_MODULES]
    _require(
        not bad,
        f"--learner.lora-target-modules {' '.join(bad)}: the vLLM engine serves adapters on "
        f"{', '.join(VLLM_LORA_MODULES)} only; drop the others or use --rollout.backend transformers",
    )


EPISODE_TASKS = ("builtin:tool-lookup",)
"""Built-in tasks whose rows name an environment (`env` column)."""


def runs_episodes(cfg: ExperimentConfig) -> bool:
    """Whether the config alone says episodes run: `env.name`, or a built-in task of `EPISODE_TASKS` in the
    training or eval data (rows of the user's own files may name one too: `rollout.vllm_max_model_len`)."""
    names = [*cfg.data.datasets, *cfg.eval.datasets]
    return bool(cfg.env.name) or any(str(n) in EPISODE_TASKS for n in names)


def _validate_env(cfg: ExperimentConfig) -> None:
    """The `env` section's limits (the environment name and the model's context are checked at start-up, where
    the registry and the model are at hand: `rlvr.envs.settings.check_env`)."""
    e = cfg.env
    _require(e.max_turns >= 1, f"--env.max-turns must be >= 1 (got {e.max_turns})")
    _require(e.max_tokens_per_turn >= 1, f"--env.max-tokens-per-turn must be >= 1 (got {e.max_tokens_per_turn})")
    _require(e.tool_timeout_s > 0, f"--env.tool-timeout-s must be > 0 (got {e.tool_timeout_s})")
    _require(
        not e.name or e.max_total_tokens > cfg.data.max_prompt_tokens,
        f"--env.max-total-tokens ({e.max_total_tokens}) must exceed --data.max-prompt-tokens "
        f"({cfg.data.max_prompt_tokens}): an episode needs room for at least one generated token",
    )
    _require(
        not e.name or cfg.learner.pack_length >= e.max_total_tokens,
        f"--learner.pack-length ({cfg.learner.pack_length}) is shorter than an episode may grow: "
        f"--env.max-total-tokens = {e.max_total_tokens}; raise the pack length or lower the limit",
    )
    _require(
        all(isinstance(t, str) and t.strip() for t in e.tools),
        f"--env.tools holds an empty name: {e.tools!r}",
    )
    max_len = cfg.rollout.vllm_max_model_len
    _require(
        not (cfg.rollout.backend == "vllm" and 0 < max_len < e.max_total_tokens and runs_episodes(cfg)),
        f"--rollout.vllm-max-model-len ({max_len}) is shorter than an episode may grow "
        f"(--env.max-total-tokens {e.max_total_tokens}): raise it to at least {e.max_total_tokens} (or 0 for the "
        "automatic length) or lower --env.max-total-tokens",
    )
    a = cfg.algorithm
    if a.overlong_buffer > 0 and runs_episodes(cfg):
        from rlvr.algorithms.shaping import episode_length_cap

        cap = episode_length_cap(e)
        _require(
            a.overlong_buffer < cap,
            f"--algorithm.overlong-buffer ({a.overlong_buffer}) must be smaller than an episode's Lmax ({cap} = "
            f"min(--env.max-turns {e.max_turns} x --env.max-tokens-per-turn {e.max_tokens_per_turn}, "
            f"--env.max-total-tokens {e.max_total_tokens}))",
        )


def _non_finite(obj: Any, prefix: str = "") -> list[str]:
    """`--section.field` of every float setting (and float in a list or mapping) that is inf or nan: no setting
    means anything there, and range checks such as `lr > 0` let inf through."""
    out: list[str] = []
    for f in dataclasses.fields(obj):
        v, flag = (
            getattr(obj, f.name),
            f"{prefix}.{f.name.replace('_', '-')}" if prefix else f"--{f.name.replace('_', '-')}",
        )
        if dataclasses.is_dataclass(v):
            out += _non_finite(v, flag)
            continue
        values = v if isinstance(v, (list, tuple)) else list(v.values()) if isinstance(v, dict) else [v]
        for x in values:
            if dataclasses.is_dataclass(x) and not isinstance(x, type):
                out += _non_finite(x, flag)
            elif isinstance(x, float) and not math.isfinite(x):
                out.append(f"{flag} {x}")
    return out


def validate(cfg: ExperimentConfig) -> ExperimentConfig:
    """Raise `ConfigError` (a ValueError) naming the flag and the fix for the first problem found."""
    bad = _non_finite(cfg)
    _require(not bad, f"{', '.join(bad)}: settings must be finite numbers")
    name = cfg.logging.run_name
    _require(
        not name or (name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name),
        f"--logging.run-name {name!r}: a run name is one directory name inside --checkpoint.output-dir "
        "(no '/', not '.' or '..')",
    )
    g, r, a, lr, c = cfg.generation, cfg.rollout, cfg.algorithm, cfg.learner, cfg.cluster
    _require(
        g.num_samples >= 2,
        f"--generation.num-samples must be >= 2 for group-relative advantages "
        f"(got {g.num_samples}): with one sample per prompt every advantage is 0",
    )
    _require(g.temperature > 0, f"--generation.temperature must be > 0 (got {g.temperature})")
    _require(0 < g.top_p <= 1, f"--generation.top-p must be in (0, 1] (got {g.top_p})")
    _require(g.top_k >= 0, f"--generation.top-k must be >= 0 (got {g.top_k}; 0 turns it off)")
    _require(g.max_new_tokens >= 1, f"--generation.max-new-tokens must be >= 1 (got {g.max_new_tokens})")
    _require(a.clip_eps_low > 0, f"--algorithm.clip-eps-low must be > 0 (got {a.clip_eps_low})")
    _require(a.clip_eps_high > 0, f"--algorithm.clip-eps-high must be > 0 (got {a.clip_eps_high})")
    _require(
        a.clip_eps_low < 1,
        f"--algorithm.clip-eps-low must be < 1 (got {a.clip_eps_low}): the lower clip bound 1 - eps_low would be <= 0",
    )
    _require(
        a.clip_delta is None or a.clip_delta > 1 + a.clip_eps_high,
        f"--algorithm.clip-delta must exceed 1 + clip_eps_high = {1 + a.clip_eps_high} (got {a.clip_delta})",
    )
    _require(a.advantage_eps >= 0, f"--algorithm.advantage-eps must be >= 0 (got {a.advantage_eps})")
    _require(a.kl_beta >= 0, f"--algorithm.kl-beta must be >= 0 (got {a.kl_beta})")
    _require(a.tis_cap >= 1, f"--algorithm.tis-cap must be >= 1 (got {a.tis_cap})")
    _require(0 <= a.tis_min <= 1, f"--algorithm.tis-min must be in [0, 1] (got {a.tis_min})")
    _require(a.cispo_eps_max > 0, f"--algorithm.cispo-eps-max must be > 0 (got {a.cispo_eps_max})")
    _require(
        a.num_mini_batches >= 1 and a.num_epochs >= 1,
        "--algorithm.num-mini-batches and --algorithm.num-epochs must be >= 1",
    )
    _require(a.overlong_buffer >= 0, f"--algorithm.overlong-buffer must be >= 0 (got {a.overlong_buffer})")
    _require(
        a.overlong_buffer < g.max_new_tokens or a.overlong_buffer == 0,
        f"--algorithm.overlong-buffer ({a.overlong_buffer}) must be smaller than "
        f"--generation.max-new-tokens ({g.max_new_tokens})",
    )
    _require(
        not (a.mask_truncated and a.overlong_buffer > 0),
        "--algorithm.mask-truncated and --algorithm.overlong-buffer are mutually exclusive: truncated "
        "samples are either masked out of the loss or penalised, not both",
    )
    _require(
        not (a.loss == "gspo" and a.aggregation not in ("auto", "seq-mean-token-mean")),
        "--algorithm.loss gspo is a sequence-level loss: use --algorithm.aggregation auto or seq-mean-token-mean",
    )
    _require(r.prompts_per_step >= 1, f"--rollout.prompts-per-step must be >= 1 (got {r.prompts_per_step})")
    _require(r.async_steps >= 0, f"--rollout.async-steps must be >= 0 (got {r.async_steps})")
    _require(r.max_pull_factor >= 1, f"--rollout.max-pull-factor must be >= 1 (got {r.max_pull_factor})")
    _require(
        not (r.active_sampling and not r.filter_zero_variance),
        "--rollout.active-sampling needs --rollout.filter-zero-variance True (it tops up filtered groups)",
    )
    _require(0 < r.vllm_gpu_memory_utilization <= 1, "--rollout.vllm-gpu-memory-utilization must be in (0, 1]")
    if r.vllm_staged_sync:
        staged_needs = (
            ("--rollout.backend vllm", r.backend == "vllm"),
            (
                "--cluster.colocate False (colocated engines load CUDA IPC chunks, not an NCCL broadcast)",
                not c.colocate,
            ),
            (f"--cluster.engine-tp 1 (got {c.engine_tp})", c.engine_tp == 1),
            (
                f"--learner.lora-rank 0 (got {lr.lora_rank}: adapters sync apart from vLLM's weight transfer)",
                lr.lora_rank == 0,
            ),
        )
        missing = [what for what, ok in staged_needs if not ok]
        _require(not missing, "--rollout.vllm-staged-sync stages NCCL weight syncs; it needs " + "; ".join(missing))
    need = cfg.data.max_prompt_tokens + g.max_new_tokens
    _require(
        lr.pack_length >= need,
        f"--learner.pack-length ({lr.pack_length}) is shorter than the longest "
        f"sample: --data.max-prompt-tokens + --generation.max-new-tokens = {cfg.data.max_prompt_tokens} + "
        f"{g.max_new_tokens} = {need}; raise the pack length to at least {need}",
    )
    _require(lr.lr > 0, f"--learner.lr must be > 0 (got {lr.lr})")
    _require(
        lr.warmup_steps >= 0 and lr.max_grad_norm >= 0,
        "--learner.warmup-steps and --learner.max-grad-norm must be >= 0",
    )
    _require(lr.micro_batch_rows >= 1, "--learner.micro-batch-rows must be >= 1")
    _require(
        not (lr.attention == "mask" and cfg.model.attn_implementation in ("torch_varlen", "flash_attention_2")),
        f"--learner.attention mask passes a block-diagonal mask, which --model.attn-implementation "
        f"{cfg.model.attn_implementation} does not take: use --model.attn-implementation sdpa (or eager), "
        "or --learner.attention varlen",
    )
    _require(
        not (cfg.model.dtype == "float32" and cfg.model.attn_implementation in ("torch_varlen", "flash_attention_2")),
        f"--model.attn-implementation {cfg.model.attn_implementation} runs flash kernels, which compute in "
        "bfloat16/float16 only, but --model.dtype is float32: use --model.attn-implementation sdpa (or auto, "
        "which picks sdpa for float32), or --model.dtype bfloat16",
    )
    _require(lr.zero3_gather_mb > 0, f"--learner.zero3-gather-mb must be > 0 (got {lr.zero3_gather_mb})")
    _require(
        not (lr.offload_params and lr.zero_stage != 3),
        f"--learner.offload-params needs --learner.zero-stage 3 (got stage {lr.zero_stage})",
    )
    _require(
        not (lr.backend == "torch" and lr.zero_stage != 0),
        f"--learner.zero-stage {lr.zero_stage} needs --learner.backend deepspeed",
    )
    _require(
        c.num_learners >= 1 and c.num_engines >= 1 and c.engine_tp >= 1,
        "--cluster.num-learners, --cluster.num-engines and --cluster.engine-tp must be >= 1",
    )
    _require(
        not (r.backend == "vllm" and c.device == "cpu"),
        "--rollout.backend vllm needs GPUs: use --cluster.device auto/cuda or --rollout.backend transformers",
    )
    _require(not (c.colocate and c.device == "cpu"), "--cluster.colocate shares GPUs: it needs --cluster.device cuda")
    _require(
        not (c.colocate and c.engine_tp > 1),
        "--cluster.colocate supports --cluster.engine-tp 1 only "
        f"(got {c.engine_tp}): colocated engines share one GPU with a learner",
    )
    if c.gpus_per_node > 0 and c.device != "cpu":
        total = c.num_nodes * c.gpus_per_node
        if c.colocate:
            need_gpus = max(c.num_learners, c.num_engines * c.engine_tp)
            arith = f"max(num_learners {c.num_learners}, num_engines {c.num_engines} * engine_tp {c.engine_tp})"
        else:
            need_gpus = c.num_learners + c.num_engines * c.engine_tp
            arith = f"num_learners {c.num_learners} + num_engines {c.num_engines} * engine_tp {c.engine_tp}"
        _require(
            need_gpus <= total,
            f"GPU split does not fit: {arith} = {need_gpus} GPUs, but the cluster has "
            f"num_nodes {c.num_nodes} * gpus_per_node {c.gpus_per_node} = {total}; lower "
            "--cluster.num-learners / --cluster.num-engines or add nodes",
        )
        _require(
            c.engine_tp <= c.gpus_per_node,
            f"--cluster.engine-tp {c.engine_tp} exceeds the "
            f"{c.gpus_per_node} GPUs of one node: a tensor-parallel engine must fit on one node",
        )
    _require(cfg.num_steps >= 1, f"--num-steps must be >= 1 (got {cfg.num_steps})")
    _require(len(cfg.data.datasets) >= 1, "--data.datasets is empty: name at least one dataset")
    _require(
        not cfg.data.weights or len(cfg.data.weights) == len(cfg.data.datasets),
        f"--data.weights has {len(cfg.data.weights)} entries but --data.datasets has "
        f"{len(cfg.data.datasets)}: give one weight per dataset or none",
    )
    _require(
        all(w >= 0 for w in cfg.data.weights) and (not cfg.data.weights or sum(cfg.data.weights) > 0),
        "--data.weights must be non-negative with a positive sum",
    )
    _require(cfg.data.max_prompt_tokens >= 1, "--data.max-prompt-tokens must be >= 1")
    _require(cfg.eval.num_samples >= 1, "--eval.num-samples must be >= 1")
    _require(cfg.checkpoint.keep_last >= 1, "--checkpoint.keep-last must be >= 1")
    _require(
        c.max_restarts >= 0 and c.max_engine_restarts >= 0,
        "--cluster.max-restarts and --cluster.max-engine-restarts must be >= 0",
    )
    _require(
        c.heartbeat_timeout_s > 0 and c.actor_timeout_s > 0,
        "--cluster.heartbeat-timeout-s and --cluster.actor-timeout-s must be > 0",
    )
    _require(lr.max_consecutive_skips >= 1, "--learner.max-consecutive-skips must be >= 1")
    _validate_lora(cfg)
    _validate_env(cfg)
    _require(
        cfg.rewards.num_workers >= 1 and cfg.rewards.timeout_s > 0,
        "--rewards.num-workers must be >= 1 and --rewards.timeout-s > 0",
    )
    return cfg


def check_resources(cfg: ExperimentConfig, num_gpus: float, num_cpus: float) -> None:
    """Check the actors fit the resources Ray reports; the message shows the arithmetic."""
    c = cfg.cluster
    if c.device == "cpu" or (c.device == "auto" and num_gpus == 0):
        need = (c.num_learners + c.num_engines) * c.cpus_per_actor
        _require(
            need <= num_cpus,
            f"CPU actors do not fit: (num_learners {c.num_learners} + num_engines "
            f"{c.num_engines}) * cpus_per_actor {c.cpus_per_actor} = {need} CPUs, but Ray reports {num_cpus}",
        )
        return
    need_gpus = (
        max(c.num_learners, c.num_engines * c.engine_tp) if c.colocate else c.num_learners + c.num_engines * c.engine_tp
    )
    _require(
        need_gpus <= num_gpus,
        f"GPU split does not fit: num_learners {c.num_learners} + num_engines "
        f"{c.num_engines} * engine_tp {c.engine_tp} = {need_gpus} GPUs"
        f"{' (colocated: the larger of the two)' if c.colocate else ''}, but Ray reports {num_gpus:g}",
    )
