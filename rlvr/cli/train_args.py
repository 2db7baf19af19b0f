"""`rlvr train`'s arguments: the command dataclass and the parser that layers preset, flags and validation.

Its own module so that `rlvr.cli` (the dispatcher) and `rlvr.launch.ray_job` (which takes the same train
flags) both import it, and neither imports the other.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import tyro

from rlvr.cli.flags import parse, reward_function_spec
from rlvr.config import ConfigError, ExperimentConfig, default_config, from_dict, read_yaml, validate
from rlvr.config.presets import DEMO_PRESET, demo_flags


@dataclasses.dataclass
class TrainCommand:
    """Train a policy with GRPO-family RL from verifiable rewards."""

    experiment: Annotated[ExperimentConfig, tyro.conf.arg(name="")]
    config: str | None = None
    """YAML preset to start from (e.g. configs/gpu-2x.yaml); flags given here override it. Without one, the
    demo preset (configs/tiny-cpu.yaml, built in) is the base."""
    dry_run: bool = False
    """Print the resolved config as YAML and exit without training."""
    reward_functions: Annotated[list[str] | None, tyro.conf.arg(name="rewards.functions")] = None
    """Reward functions applied to every completion, replacing the config's `rewards.functions`: items
    `NAME[,weight=W][,PARAM=VALUE]...`, e.g. `--rewards.functions math soft_overlong,weight=0.5,max_tokens=512`
    (`rlvr reward --list` shows the names and params)."""


def train_description(with_config: bool) -> str:
    """`rlvr train --help`'s text: which defaults the flags show, and what the demo preset changes."""
    if with_config:
        return f"{TrainCommand.__doc__}\n\nDefaults shown are the values of the --config file."
    return (
        f"{TrainCommand.__doc__}\n\nDefaults shown are the code defaults: what a config file gets for any field "
        f"it leaves out (the README's config reference lists the same). `rlvr train` without --config runs "
        f"the demo preset {DEMO_PRESET} (built in; a tiny model learns a copy task on CPU), which is these "
        f"defaults plus: {demo_flags()}"
    )


def _extract_config_path(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def parse_train_args(argv: list[str]) -> TrainCommand:
    """Parse `rlvr train` arguments into a validated command (raises ConfigError on bad input). The base is the
    --config file, else the demo preset; `--help` without --config shows the code defaults."""
    path = _extract_config_path(argv)
    path = path if path and path != "None" else None
    helping = any(a in ("-h", "--help") for a in argv)
    base = from_dict(read_yaml(path)) if path else ExperimentConfig() if helping else default_config()
    cmd = parse(
        TrainCommand,
        argv,
        "rlvr train",
        train_description(path is not None),
        default=TrainCommand(experiment=base, config=path),
    )
    if cmd.reward_functions is not None:
        try:
            specs = [reward_function_spec(item) for item in cmd.reward_functions]
        except ValueError as e:
            raise ConfigError(str(e)) from e
        cmd.experiment = from_dict({"rewards": {"functions": specs}}, base=cmd.experiment)
    validate(cmd.experiment)
    return cmd
