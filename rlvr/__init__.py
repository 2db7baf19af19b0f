"""rlvr: reinforcement learning from verifiable rewards (GRPO and its descendants) on Ray.

Public API: `ExperimentConfig`, `load_config`, `train`. Importing `rlvr` stays light: torch, ray and the
rest load only when `train` runs.
"""

from __future__ import annotations

from rlvr.config import ExperimentConfig, load_config

__all__ = ["ExperimentConfig", "load_config", "train", "__version__"]
__version__ = "0.1.0"


def train(config: ExperimentConfig) -> int:
    """Run training for `config` (validated first); returns the process exit status (0 = success)."""
    from rlvr.config import validate
    from rlvr.orchestration.run import train as _train

    validate(config)
    return _train(config)
