"""The `rlvr` command: train / eval / reward / launch / submit / dashboard.

`rlvr train` layers, in order: the built-in tiny CPU default (or `--config PATH`), then every field given on
the command line (tyro, `--section.field value`), then validation. `--dry-run` prints the resolved YAML and
exits. The other subcommands import their module on use and call its `main(argv)`.
"""

from __future__ import annotations

import sys
from typing import Callable

from rlvr.cli.train_args import TrainCommand, parse_train_args, train_description
from rlvr.config import ConfigError, to_yaml

__all__ = ["HANDLERS", "SUBCOMMANDS", "TrainCommand", "main", "parse_train_args", "train_description"]

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

        print(
            f"rlvr train: no --config given: running the demo preset ({DEMO_PRESET}); `rlvr train --help` "
            "lists what it changes from the defaults",
            file=sys.stderr,
        )
    if cmd.dry_run:
        sys.stdout.write(to_yaml(cmd.experiment))
        return 0
    from rlvr.orchestration.run import train

    try:
        return train(cmd.experiment, signals)
    except ValueError as e:  # bad input found before or during start-up (data rows, model path, checkpoint)
        print(f"rlvr train: error: {e}", file=sys.stderr)
        return 2


def _reward(argv: list[str]) -> int:
    from rlvr.cli.flags import parse
    from rlvr.rewards.cli import RewardArgs, help_description, run_reward

    args = parse(RewardArgs, argv, "rlvr reward", help_description())
    return run_reward(args)


def _lazy(module: str) -> Callable[[list[str]], int]:
    """Dispatch to `module.main(argv)`, imported on use (so `rlvr train` never imports ray's job client, the
    dashboard server, ...). An ImportError there is a real error and surfaces as one."""

    def run(argv: list[str]) -> int:
        import importlib

        return int(importlib.import_module(module).main(argv))

    return run


HANDLERS: dict[str, Callable[[list[str]], int]] = {
    "train": _train,
    "reward": _reward,
    "eval": _lazy("rlvr.eval.cli"),
    "launch": _lazy("rlvr.launch.ray_job"),
    "submit": _lazy("rlvr.launch.submit"),
    "dashboard": _lazy("rlvr.telemetry.dashboard"),
    "export": _lazy("rlvr.learner.export"),
    "models": _lazy("rlvr.models.pretrained"),
}


def _usage() -> str:
    lines = [
        "usage: rlvr {" + ",".join(SUBCOMMANDS) + "} [--help] ...",
        "",
        "rlvr: reinforcement learning from verifiable rewards (GRPO, DAPO, Dr. GRPO, GSPO, CISPO, SAPO).",
        "",
        "commands:",
    ]
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
