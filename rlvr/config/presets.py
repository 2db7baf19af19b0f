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
    """The tiny CPU demo: a random-init tiny model learns the built-in `copy` task with GRPO."""
    return ExperimentConfig(
        model=ModelConfig(path="builtin:tiny", dtype="float32"),
        data=DataConfig(datasets=["builtin:copy"], apply_chat_template=False, max_prompt_tokens=32),
        generation=GenerationConfig(num_samples=8, temperature=1.0, max_new_tokens=12),
        rollout=RolloutConfig(prompts_per_step=16, async_steps=1),
        algorithm=AlgorithmConfig(),
        learner=LearnerConfig(backend="torch", lr=3e-3, warmup_steps=5, pack_length=256),
        cluster=ClusterConfig(num_learners=1, num_engines=1, device="cpu"),
        eval=EvalConfig(every_n_steps=10, max_prompts=64),
        checkpoint=CheckpointConfig(output_dir="runs"),
        logging=LoggingConfig(),
        num_steps=60,
        seed=0,
    )
