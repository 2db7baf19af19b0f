"""`rlvr eval`: sampled evaluation of an HF model directory or an rlvr checkpoint, written to a directory.

Writes `<output>/summary.json` (the `rlvr.eval.runner` summary keys plus what was evaluated) and
`<output>/completions.jsonl` (one scored completion per line). Prints the headline numbers.

Reproducing an in-training eval: given a checkpoint `<run>/checkpoints/step_<n>/`, the run's
`<run>/config.yaml` is the base config (datasets, eval settings, rewards, seed, max_new_tokens), so the
requests, their per-prompt seeds and the scoring are those of the in-training eval at step n; flags given
here override it. Without a run config the built-in defaults are the base.

The vLLM engine is imported only when `--engine vllm` is asked for; without the `gpu` extra that fails with
a message naming it.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Literal

from rlvr.cli.flags import parse
from rlvr.config import ExperimentConfig, default_config, from_dict, read_yaml


@dataclasses.dataclass
class EvalArgs:
    """Evaluate a model or checkpoint: pass@1, pass@k, maj@k, rewards per verifier and dataset, lengths."""

    model: str
    """HF model directory or rlvr checkpoint directory (`<run>/checkpoints/step_<n>`)."""
    dataset: list[str] = dataclasses.field(default_factory=list)
    """Eval datasets (JSONL/Parquet files, hub names, `builtin:<task>`); empty: the run config's eval data."""
    output: str = "eval_out"
    """Directory for summary.json and completions.jsonl."""
    engine: Literal["transformers", "vllm"] = "transformers"
    """Generation engine (`vllm` needs the `gpu` extra)."""
    num_samples: int | None = None
    """Samples per prompt k (default: the config's eval.num_samples)."""
    ks: list[int] = dataclasses.field(default_factory=list)
    """pass@k / maj@k values to report (default: 1, 2, 4, ... up to num_samples, and num_samples)."""
    config: str | None = None
    """Base config YAML (default: the run's config.yaml when --model is a checkpoint, else built-in)."""
    split: str | None = None
    """Dataset split (default: the config's eval.split)."""
    max_prompts: int | None = None
    """Prompts evaluated (0 = all; default: the config's eval.max_prompts)."""
    greedy: bool | None = None
    """Greedy decoding (default: the config's eval.greedy when k = 1, sampling when k > 1)."""
    temperature: float | None = None
    """Sampling temperature (default: the config's generation.temperature)."""
    max_new_tokens: int | None = None
    """Completion length limit (default: the config's generation.max_new_tokens)."""
    seed: int | None = None
    """Seed of the per-prompt sampling seeds (default: the config's seed)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the transformers engine runs (`auto`: cuda when available)."""
    batch_size: int = 32
    """Sequences decoded together by the transformers engine."""
    no_majority: bool = False
    """Skip maj@k (no answer extraction)."""


def run_config_for(model: str) -> Path | None:
    """The run's config.yaml of a checkpoint directory `<run>/checkpoints/step_<n>`, if there is one."""
    path = Path(model).resolve()
    if path.parent.name == "checkpoints" and (path.parent.parent / "config.yaml").is_file():
        return path.parent.parent / "config.yaml"
    return None


_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


def code_references(data: Any, key: str = "") -> list[str]:
    """Every place a config names Python code to import: `rewards.custom` modules and any "pkg.module:attr"
    value (reward functions, environments, tools; `builtin:` names are rlvr's own data), as `key=value`
    strings."""
    if isinstance(data, dict):
        return [r for k, v in data.items() for r in code_references(v, f"{key}.{k}" if key else str(k))]
    if isinstance(data, list):
        if key == "rewards.custom":
            return [f"{key}={v}" for v in data]
        return [r for v in data for r in code_references(v, key)]
    code = isinstance(data, str) and _IMPORT_PATH.fullmatch(data) and not data.startswith("builtin:")
    return [f"{key}={data}"] if code else []


def resolve_config(args: EvalArgs) -> ExperimentConfig:
    """The experiment config that drives requests and scoring: base config + these flags (module docstring)."""
    base_path = args.config or run_config_for(args.model)
    data = read_yaml(str(base_path)) if base_path else None
    if data is not None and not args.config:
        # found beside the checkpoint, not named by the user: data, so it may not make eval import code
        named = code_references(data)
        if named:
            raise ValueError(
                f"{base_path} (the checkpoint's run config) names Python code to import ({', '.join(named)}); "
                f"rlvr eval runs no code named by a file it found on its own: pass --config {base_path} to use it"
            )
    cfg = from_dict(data) if data is not None else default_config()
    from rlvr.models import resolve_model_path

    cfg.model.path = resolve_model_path(args.model)  # builtin:<pretrained name> -> its fetched directory
    cfg.model.tokenizer_path = None
    model_dir = Path(cfg.model.path)
    if (model_dir / "adapter_config.json").is_file() and not any(model_dir.glob("model*.safetensors")):
        raise ValueError(
            f"--model {args.model} is a LoRA checkpoint (an adapter, not a model): merge it first with "
            f"`rlvr export --merge {args.model} OUT`, then evaluate OUT"
        )
    if args.dataset:
        cfg.eval.datasets = list(args.dataset)
    if args.split is not None:
        cfg.eval.split = args.split
    if args.max_prompts is not None:
        cfg.eval.max_prompts = args.max_prompts
    if args.num_samples is not None:
        if args.num_samples < 1:
            raise ValueError(f"--num-samples must be >= 1, got {args.num_samples}")
        cfg.eval.num_samples = args.num_samples
        if args.greedy is None and args.num_samples > 1:
            cfg.eval.greedy = False  # k identical greedy samples would make pass@k = pass@1
    if args.greedy is not None:
        cfg.eval.greedy = args.greedy
    if args.temperature is not None:
        cfg.generation.temperature = args.temperature
    if args.max_new_tokens is not None:
        cfg.generation.max_new_tokens = args.max_new_tokens
    if args.seed is not None:
        cfg.seed = args.seed
    return cfg


def default_ks(num_samples: int) -> list[int]:
    """1, 2, 4, ... below num_samples, and num_samples itself."""
    ks, k = [], 1
    while k < num_samples:
        ks.append(k)
        k *= 2
    return ks + [num_samples]


def build_engine(args: EvalArgs, cfg: ExperimentConfig) -> Any:
    """The generation engine for `args.engine` (vllm imported only here, only when asked for)."""
    if args.engine == "vllm":
        try:
            import vllm  # noqa: F401

            from rlvr.rollout.vllm_engine import VLLMEngine
        except ImportError as e:
            raise RuntimeError(
                "--engine vllm needs vLLM: pip install 'rlvr[gpu]' (the `gpu` extra) on a CUDA "
                f"machine, or use --engine transformers ({e})"
            ) from e
        return VLLMEngine(cfg.model.path, 0, cfg=cfg)
    import torch

    from rlvr.rollout.hf_engine import TransformersEngine

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = cfg.model.dtype if cfg.model.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")
    return TransformersEngine(cfg.model.path, 0, device=device, dtype=dtype, max_batch_size=args.batch_size)


def run_eval(args: EvalArgs) -> dict[str, Any]:
    """Evaluate and write the output directory; returns the summary.json content."""
    from transformers import AutoTokenizer

    from rlvr.data import eval_requests
    from rlvr.eval.metrics import default_answer_extractor
    from rlvr.eval.runner import evaluate
    from rlvr.rewards import RewardScorer, import_custom, known_rewards

    cfg = resolve_config(args)
    for path in cfg.rewards.custom:
        import_custom(path)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    requests = eval_requests(cfg, tokenizer, set(known_rewards()))
    if not requests:
        raise ValueError("no eval prompts: give --dataset (or a run config with eval data)")
    ks = sorted(set(args.ks or default_ks(cfg.eval.num_samples)))
    scorer = RewardScorer(cfg.rewards)
    engine = build_engine(args, cfg)
    from rlvr.eval.episodes import EpisodeGenerator

    generator = EpisodeGenerator(engine, cfg, tokenizer)  # rows routed to an environment run episodes
    start = time.perf_counter()
    try:
        summary, rows = evaluate(
            generator,
            requests,
            scorer,
            ks=ks,
            timeout_s=cfg.rollout.timeout_s,
            extract_answer=None if args.no_majority else default_answer_extractor,
        )
    finally:
        generator.close()
        engine.shutdown()
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "model": args.model,
        "datasets": cfg.eval.datasets or cfg.data.datasets,
        "split": cfg.eval.split,
        "num_samples": cfg.eval.num_samples,
        "greedy": cfg.eval.greedy,
        "seed": cfg.seed,
        "ks": ks,
        "engine": args.engine,
        "elapsed_s": time.perf_counter() - start,
        "metrics": summary,
    }
    (out / "summary.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    with (out / "completions.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")
    return result


def main(argv: list[str]) -> int:
    """`rlvr eval` entry point."""
    args = parse(EvalArgs, argv, "rlvr eval", EvalArgs.__doc__)
    try:
        result = run_eval(args)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"rlvr eval: {e}", file=sys.stderr)
        return 2
    m = result["metrics"]
    head = ", ".join(f"{k}={m[k]:.4f}" for k in sorted(m) if k.startswith(("pass@", "maj@")))
    print(
        f"rlvr eval: {int(m.get('num_prompts', 0))} prompts x {result['num_samples']}: {head}, "
        f"reward {m.get('reward/total_mean', float('nan')):.4f}, len {m.get('completion_len_mean', 0):.1f}, "
        f"stop {m.get('stop_rate', 0):.2f} -> {args.output}"
    )
    return 0
