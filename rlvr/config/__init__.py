"""rlvr's typed configuration: sections, presets, loading and validation (standard library + PyYAML only)."""

from rlvr.config.errors import ConfigError
from rlvr.config.loading import from_dict, load_config, read_yaml, to_dict, to_yaml
from rlvr.config.presets import default_config
from rlvr.config.sections import (
    AlgorithmConfig,
    CheckpointConfig,
    ClusterConfig,
    DataConfig,
    EnvConfig,
    EvalConfig,
    ExperimentConfig,
    GenerationConfig,
    LearnerConfig,
    LoggingConfig,
    ModelConfig,
    RewardFunctionConfig,
    RewardsConfig,
    RolloutConfig,
)
from rlvr.config.validation import check_resources, validate

__all__ = [
    "AlgorithmConfig",
    "CheckpointConfig",
    "ClusterConfig",
    "ConfigError",
    "DataConfig",
    "EnvConfig",
    "EvalConfig",
    "ExperimentConfig",
    "GenerationConfig",
    "LearnerConfig",
    "LoggingConfig",
    "ModelConfig",
    "RewardFunctionConfig",
    "RewardsConfig",
    "RolloutConfig",
    "check_resources",
    "default_config",
    "from_dict",
    "load_config",
    "read_yaml",
    "to_dict",
    "to_yaml",
    "validate",
]
