"""The one logger factory: every record is tagged with the process role and rank.

Library code never prints; it asks `get_logger(__name__)`. `setup_logging(role, rank, level, path)` is
called once per process (driver, each actor) and may add a file handler (the run's events.log).

A quiet console: below `DEBUG`, the console (stderr, which Ray forwards from the actors to the driver's
terminal) shows warnings and errors, plus the few records logged with `extra=CONSOLE` (where the run is, a
resume); everything at `level` goes to the file handler. Library progress bars (transformers' weight loading
and saving, huggingface_hub) are turned off unless the level is `DEBUG`. An actor started with
`RLVR_EVENTS_LOG` in its environment (runs on a local cluster that rlvr starts) appends to that file too.
"""

from __future__ import annotations

import logging
import os
import sys

_FORMAT = "%(asctime)s %(levelname).1s [%(rlvr_role)s%(rlvr_rank)s] %(name)s: %(message)s"


CONSOLE = {"rlvr_console": True}
"""`logger.info(..., extra=CONSOLE)`: shown on the console at every level (see the module docstring)."""
EVENTS_LOG_ENV = "RLVR_EVENTS_LOG"


class _ConsoleFilter(logging.Filter):
    def __init__(self, min_level: int) -> None:
        super().__init__()
        self.min_level = min_level

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= self.min_level or bool(getattr(record, "rlvr_console", False))


def quiet_progress_bars() -> None:
    """Turn off transformers' and huggingface_hub's tqdm bars in this process (and processes it starts)."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read when huggingface_hub/transformers are imported
    if "transformers" in sys.modules:
        import transformers

        transformers.utils.logging.disable_progress_bar()


class _RoleFilter(logging.Filter):
    def __init__(self, role: str, rank: int | None) -> None:
        super().__init__()
        self.role, self.rank = role, rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rlvr_role = self.role
        record.rlvr_rank = "" if self.rank is None else f":{self.rank}"
        return True


def setup_logging(role: str = "driver", rank: int | None = None, level: str = "INFO", path: str | None = None) -> None:
    """Configure the `rlvr` logger of this process (idempotent: replaces earlier rlvr handlers). Actors pass no
    `path` and append to $RLVR_EVENTS_LOG when it is set."""
    root = logging.getLogger("rlvr")
    root.setLevel(level)
    root.propagate = False
    for h in list(root.handlers):
        root.removeHandler(h)
        h.close()
    console = logging.StreamHandler(sys.stderr)
    if level != "DEBUG":
        console.addFilter(_ConsoleFilter(logging.WARNING))
        quiet_progress_bars()
    handlers: list[logging.Handler] = [console]
    if path:
        handlers.append(logging.FileHandler(path))
    elif role != "driver" and os.environ.get(EVENTS_LOG_ENV):
        try:
            handlers.append(logging.FileHandler(os.environ[EVENTS_LOG_ENV]))
        except OSError:  # a run directory this actor cannot reach (another node): its console still has it
            pass
    for h in handlers:
        h.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        h.addFilter(_RoleFilter(role, rank))
        root.addHandler(h)


def get_logger(name: str) -> logging.Logger:
    """A logger under the `rlvr` namespace (pass `__name__`)."""
    return logging.getLogger(name if name.startswith("rlvr") else f"rlvr.{name}")
