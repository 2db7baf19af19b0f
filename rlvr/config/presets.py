"""The built-in default run: the tiny CPU demo that `rlvr train` runs with no arguments.

configs/ is not installed with the wheel, so this default lives in code; a test keeps it equal to
configs/tiny-cpu.yaml.
"""

from __future__ import annotations

from rlvr.config.sections import (
    AlgorithmConfig,
    CheckpointConfig,
    ClusterConfig,
    DataConfig,
    EvalConfig,
    ExperimentConfig,
    GenerationConfig,
    LearnerConfig,
    LoggingConfig,
    ModelConfig,
    RolloutConfig,
)


def default_config() -> ExperimentConfig:
    """The tiny CPU demo: a random-init tiny model learns to SOLVE the built-in `copy4` task with GRPO/DAPO.

    `copy4` ("bdac=" -> "bdac", 4 letters over "abcde") with a character-level tokenizer (tiny_vocab_size 0:
    no BPE merges, one token per character), answers capped at 5 tokens (4 letters + EOS). The copy reward
    gives a point per right letter and one for stopping right after the fourth, so 1.0 (`correct`, pass@1)
    is the exact string and then EOS. 400 steps of 16 prompts x 8 samples. Groups whose rewards are all equal
    are kept (zero advantage, no gradient) rather than filtered, so a policy that has solved the task keeps
    stepping instead of finding no informative group.

    Why these settings (bench/demo_learning.py, bench/gpu_learning.py; docs/gpu-results): lr 1e-3 (3e-3 reached
    partial credit, then collapsed: entropy fell to ~0.1 and eval reward from 0.54 to 0.26 by step 200); a
    completion that runs to the token limit without stopping scores 0 (`non_stop_penalty` 0.0: otherwise one
    GPU seed in three learned never to stop, stuck at 0.67 with every letter right); an entropy bonus of 0.03
    (at 0.01 one GPU seed in three locked a wrong letter in at entropy ~0.05, where every sample of a group
    agrees and no gradient is left to undo it). With all three, 3 of 3 seeds reach pass@1 1.0 on an H100.
    """
    return ExperimentConfig(
        model=ModelConfig(path="builtin:tiny", dtype="float32", tiny_vocab_size=0),
        data=DataConfig(
            datasets=["builtin:copy4"], apply_chat_template=False, max_prompt_tokens=32, num_builtin_rows=6400
        ),
        generation=GenerationConfig(num_samples=8, temperature=1.0, max_new_tokens=5),
        rollout=RolloutConfig(prompts_per_step=16, async_steps=1, filter_zero_variance=False),
        algorithm=AlgorithmConfig(entropy_coef=0.03, non_stop_penalty=0.0),
        learner=LearnerConfig(backend="torch", lr=1e-3, warmup_steps=5, pack_length=256),
        cluster=ClusterConfig(num_learners=1, num_engines=1, device="cpu"),
        eval=EvalConfig(every_n_steps=10, max_prompts=64),
        checkpoint=CheckpointConfig(output_dir="runs"),
        logging=LoggingConfig(),
        num_steps=400,
        seed=0,
    )


DEMO_PRESET = "configs/tiny-cpu.yaml"
"""The file equal to `default_config()` (a test keeps them equal)."""


def _flat(d: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "params":
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def demo_changes() -> dict[str, object]:
    """Dotted field -> value for every field where the demo preset differs from the code defaults."""
    import dataclasses

    demo, code = _flat(dataclasses.asdict(default_config())), _flat(dataclasses.asdict(ExperimentConfig()))
    return {k: v for k, v in demo.items() if code.get(k) != v}


def demo_flags() -> str:
    """The demo preset as flags over the code defaults: `--learner.lr 0.001 --num-steps 400 ...`."""

    def flag(key: str) -> str:
        *sections, name = key.split(".")
        return "--" + ".".join(sections + [name.replace("_", "-")])

    def value(v: object) -> str:
        return " ".join(map(str, v)) if isinstance(v, list) else str(v)

    return " ".join(f"{flag(k)} {value(v)}" for k, v in demo_changes().items())
