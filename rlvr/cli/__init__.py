"""The `rlvr` command line.

- `dispatch`: the subcommands (`rlvr train | eval | reward | launch | submit | dashboard | export | models`) and
  `main`, which hands each one its arguments.
- `train_args`: `rlvr train`'s arguments: the layered config (default or `--config`, then flags, then validation).
- `flags`: the tyro parsing every subcommand shares (booleans as `--flag` / `--flag False`, list flags).
"""

from rlvr.cli.dispatch import HANDLERS, SUBCOMMANDS, TrainCommand, main, parse_train_args, train_description

__all__ = ["HANDLERS", "SUBCOMMANDS", "TrainCommand", "main", "parse_train_args", "train_description"]
