"""The `rlvr` command: train / eval / reward / launch / submit / dashboard.

`rlvr train` layers, in order: the built-in tiny CPU default (or `--config PATH`), then every field given on
the command line (tyro, `--section.field value`), then validation. `--dry-run` prints the resolved YAML and
exits. Subcommands whose capability has not landed exit 2 with "not implemented yet".
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated, Callable

import tyro

from rlvr.config import ConfigError, ExperimentConfig, default_config, from_dict, read_yaml, to_yaml, validate

SUBCOMMANDS: dict[str, str] = {
    "train": "Train a policy with GRPO-family RL from verifiable rewards.",
    "eval": "Evaluate a model or checkpoint: pass@1, pass@k, maj@k, rewards per verifier.",
    "reward": "Score completions with rlvr's reward functions (one JSON object per completion).",
    "launch": "Start or join a Ray cluster, check its resources, and run training as a Ray job.",
    "submit": "Write (and submit) a Beaker, Kubernetes or Slurm job spec for a training run.",
    "dashboard": "Serve a live local dashboard of one or more run directories.",
    "export": "Merge a LoRA checkpoint into its base model: rlvr export --merge RUN_DIR/checkpoints/step_N OUT.",
    "models": "List, fetch and convert real pretrained models without a model hub (rlvr models fetch NAME).",
}


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
    from rlvr.config.presets import DEMO_PRESET, demo_flags

    if with_config:
        return f"{TrainCommand.__doc__}\n\nDefaults shown are the values of the --config file."
    return (f"{TrainCommand.__doc__}\n\nDefaults shown are the code defaults: what a config file gets for any field "
            f"it leaves out (the README's config reference lists the same). `rlvr train` without --config runs "
            f"the demo preset {DEMO_PRESET} (built in; a tiny model learns a copy task on CPU), which is these "
            f"defaults plus: {demo_flags()}")


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
    from rlvr.cli_flags import parse, reward_function_spec

    path = _extract_config_path(argv)
    path = path if path and path != "None" else None
    helping = any(a in ("-h", "--help") for a in argv)
    base = from_dict(read_yaml(path)) if path else ExperimentConfig() if helping else default_config()
    cmd = parse(TrainCommand, argv, "rlvr train", train_description(path is not None),
                default=TrainCommand(experiment=base, config=path))
    if cmd.reward_functions is not None:
        try:
            specs = [reward_function_spec(item) for item in cmd.reward_functions]
        except ValueError as e:
            raise ConfigError(str(e)) from e
        cmd.experiment = from_dict({"rewards": {"functions": specs}}, base=cmd.experiment)
    validate(cmd.experiment)
    return cmd


def _train(argv: list[str]) -> int:
    from rlvr.orchestration.health import StopSignals

    # SIGINT/SIGTERM only set a flag from here until the process exits: a signal during parsing or start-up is
    # answered once start-up is done (exit 75, nothing lost), one during shut-down changes nothing; never a
    # KeyboardInterrupt traceback or Python's default exit. (The handlers are not restored on the way out.)
    signals = StopSignals().__enter__()
    try:
        cmd = parse_train_args(argv)
    except ConfigError as e:
        print(f"rlvr train: config error: {e}", file=sys.stderr)
        return 2
    if cmd.config is None:
        from rlvr.config.presets import DEMO_PRESET

        print(f"rlvr train: no --config given: running the demo preset ({DEMO_PRESET}); `rlvr train --help` "
              "lists what it changes from the defaults", file=sys.stderr)
    if cmd.dry_run:
        sys.stdout.write(to_yaml(cmd.experiment))
        return 0
    from rlvr.orchestration.run import train

    try:
        return train(cmd.experiment, signals)
    except ValueError as e:  # bad input found before or during start-up (data rows, model path, checkpoint)
        print(f"rlvr train: error: {e}", file=sys.stderr)
        return 2


def _not_implemented(name: str, issue: int) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        if any(a in ("-h", "--help") for a in argv):
            print(f"usage: rlvr {name} ...\n\n{SUBCOMMANDS[name]}\n\nStatus: not implemented yet (issue {issue}).")
            return 0
        print(f"rlvr {name}: not implemented yet (tracked in issue {issue})", file=sys.stderr)
        return 2

    return run


def _reward(argv: list[str]) -> int:
    try:
        from rlvr.cli_flags import parse
        from rlvr.rewards.cli import RewardArgs, help_description, run_reward
    except ImportError:
        return _not_implemented("reward", 4)(argv)
    args = parse(RewardArgs, argv, "rlvr reward", help_description())
    return run_reward(args)


def _lazy(module: str, name: str, issue: int) -> Callable[[list[str]], int]:
    """Dispatch to `module.main(argv)` once the capability exists, else "not implemented yet"."""

    def run(argv: list[str]) -> int:
        import importlib

        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("rlvr"):
                return _not_implemented(name, issue)(argv)
            raise
        return mod.main(argv)

    return run


HANDLERS: dict[str, Callable[[list[str]], int]] = {
    "train": _train,
    "reward": _reward,
    "eval": _lazy("rlvr.eval.cli", "eval", 9),
    "launch": _lazy("rlvr.orchestration.launch", "launch", 8),
    "submit": _lazy("rlvr.orchestration.submit", "submit", 8),
    "dashboard": _lazy("rlvr.telemetry.dashboard", "dashboard", 9),
    "export": _lazy("rlvr.learner.export", "export", 20),
    "models": _lazy("rlvr.models.pretrained", "models", 22),
}


def _usage() -> str:
    lines = ["usage: rlvr {" + ",".join(SUBCOMMANDS) + "} [--help] ...", "",
             "rlvr: reinforcement learning from verifiable rewards (GRPO, DAPO, Dr. GRPO, GSPO, CISPO, SAPO).", "",
             "commands:"]
    lines += [f"  {name:<10} {text}" for name, text in SUBCOMMANDS.items()]
    lines += ["", "Run `rlvr <command> --help` for the command's flags. `rlvr train` alone runs the tiny CPU demo."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Console entry point."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["train"]
    if argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] not in HANDLERS:
        print(f"rlvr: unknown command {argv[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return HANDLERS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
