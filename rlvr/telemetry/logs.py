"""The one logger factory: every record is tagged with the process role and rank.

Library code never prints; it asks `get_logger(__name__)`. `setup_logging(role, rank, level, path)` is
called once per process (driver, each actor) and may add a file handler (the run's events.log).
"""

from __future__ import annotations

import logging
import sys

_FORMAT = "%(asctime)s %(levelname).1s [%(rlvr_role)s%(rlvr_rank)s] %(name)s: %(message)s"


class _RoleFilter(logging.Filter):
    def __init__(self, role: str, rank: int | None) -> None:
        super().__init__()
        self.role, self.rank = role, rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rlvr_role = self.role
        record.rlvr_rank = "" if self.rank is None else f":{self.rank}"
        return True


def setup_logging(role: str = "driver", rank: int | None = None, level: str = "INFO",
                  path: str | None = None) -> None:
    """Configure the `rlvr` logger of this process (idempotent: replaces earlier rlvr handlers)."""
    root = logging.getLogger("rlvr")
    root.setLevel(level)
    root.propagate = False
    for h in list(root.handlers):
        root.removeHandler(h)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if path:
        handlers.append(logging.FileHandler(path))
    for h in handlers:
        h.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        h.addFilter(_RoleFilter(role, rank))
        root.addHandler(h)


def get_logger(name: str) -> logging.Logger:
    """A logger under the `rlvr` namespace (pass `__name__`)."""
    return logging.getLogger(name if name.startswith("rlvr") else f"rlvr.{name}")
