"""Where a command writes: one set of rules for every output path a user names (`--export`, `--output`, OUT, ...).

Each check runs before the command does any work and raises `OutputPathError` (a ValueError) whose message
names the flag and the path; the commands print it and exit 2. The rules:
- a file output goes into an existing directory, is never a symlink or a non-regular file (it is never written
  through), and replaces an existing file only when that file has one of the suffixes the command itself writes
  (`report.html` for `--export`) and lies outside any run directory or checkpoint (a directory holding `run.json`
  or `MANIFEST.json`, or below one): run records, configs and weights are never replaced;
- a directory output (`rlvr export --merge CKPT OUT`) must not exist yet, or be an empty directory, and is never
  inside its own input;
- a directory the command creates (a cache, a parts directory) must not lie under a file.
Files are written atomically: a temporary file in the same directory, renamed over the target at the end, so a
failure leaves the old file (or nothing) behind, never half a file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

RUN_MARKERS = ("run.json", "MANIFEST.json")
"""Files that make a directory (and everything below it) a run directory or a checkpoint."""


class OutputPathError(ValueError):
    """An output path the command must not write (the message names the flag and the path)."""


def _protected_dir(directory: Path) -> Path | None:
    """The run directory or checkpoint that `directory` is (or lies in), else None."""
    for d in (directory, *directory.parents):
        if any(os.path.lexists(d / marker) for marker in RUN_MARKERS):
            return d
    return None


def _check_existing_ancestor(path: Path, flag: str) -> None:
    """The nearest existing ancestor of `path` must be a directory (nothing is created under a file)."""
    for d in path.parents:
        if os.path.lexists(d):
            if not d.is_dir():
                raise OutputPathError(f"{flag} {path}: {d} is not a directory")
            return


def _writable_parent(out: Path, flag: str, where: str) -> Path:
    """`out`'s parent, which must be an existing, writable directory (no ancestor a file)."""
    parent = out.parent
    if not parent.is_dir():
        _check_existing_ancestor(out, flag)
        raise OutputPathError(f"{where}: the directory {parent} does not exist (create it first)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"{where}: the directory {parent} is not writable")
    return parent


def check_output_file(
    path: str | os.PathLike[str],
    flag: str,
    replace_suffixes: Iterable[str] = (),
    inputs: Iterable[str | os.PathLike[str]] = (),
) -> Path:
    """`path` as a file the command may write (module docstring); raises OutputPathError naming `flag`.

    `replace_suffixes`: the suffixes (".html") of an existing file the command may replace; `inputs`: files the
    command reads, which it must never write."""
    out = Path(path)
    if not str(path) or out.name in ("", ".", ".."):
        raise OutputPathError(f"{flag} {str(path)!r}: not a file name")
    where = f"{flag} {out}"
    parent = _writable_parent(out, flag, where)
    if not os.path.lexists(out):
        return out
    if out.is_symlink():
        raise OutputPathError(f"{where}: is a symlink; refusing to write through it (give another path)")
    if not out.is_file():
        raise OutputPathError(f"{where}: exists and is not a regular file; refusing to replace it")
    for other in inputs:
        with contextlib.suppress(OSError):
            if os.path.samefile(out, other):
                raise OutputPathError(f"{where}: is an input of this command; refusing to overwrite it")
    suffixes = tuple(s.lower() for s in replace_suffixes)
    if out.suffix.lower() not in suffixes:
        allowed = f" (only an existing {'/'.join(suffixes)} file is replaced)" if suffixes else ""
        raise OutputPathError(f"{where}: exists; refusing to overwrite it{allowed}: give a new path")
    run = _protected_dir(parent.resolve())
    if run is not None:
        raise OutputPathError(
            f"{where}: exists inside the run directory or checkpoint {run}; refusing to overwrite it: give a new path"
        )
    return out


def check_new_dir(path: str | os.PathLike[str], flag: str, inputs: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """`path` as a directory the command creates whole: it does not exist or is an empty directory (not a symlink),
    its parent exists, and it is not inside (or equal to) any of `inputs`; raises OutputPathError naming `flag`."""
    out = Path(path)
    if not str(path) or out.name in ("", ".", ".."):
        raise OutputPathError(f"{flag} {str(path)!r}: not a directory name")
    where = f"{flag} {out}"
    if os.path.lexists(out):
        if out.is_symlink():
            raise OutputPathError(f"{where}: is a symlink; refusing to write through it (give a new directory)")
        if not out.is_dir():
            raise OutputPathError(f"{where}: exists and is not a directory; refusing to replace it")
        try:
            empty = not any(os.scandir(out))
        except OSError as e:
            raise OutputPathError(f"{where}: cannot be read ({e.strerror})") from e
        if not empty:
            raise OutputPathError(f"{where}: exists and is not empty; refusing to write into it: give a new directory")
    _writable_parent(out, flag, where)
    resolved = out.resolve()
    for src in inputs:
        src_resolved = Path(src).resolve()
        if resolved == src_resolved or src_resolved in resolved.parents:
            raise OutputPathError(f"{where}: is inside (or is) the input {src}; give a directory outside it")
    return out


def check_dir_creatable(path: str | os.PathLike[str], flag: str) -> Path:
    """`path` as a directory the command may create (with parents) or use: an existing directory, or a path
    whose nearest existing ancestor is a directory; raises OutputPathError naming `flag`."""
    out = Path(path)
    if os.path.lexists(out):
        if not out.is_dir():
            raise OutputPathError(f"{flag} {out}: exists and is not a directory")
        return out
    _check_existing_ancestor(out, flag)
    return out


@contextlib.contextmanager
def atomic_writer(path: Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Write `path` through a temporary file in its directory, renamed over it when the block succeeds (the
    rename replaces a symlink at `path`, never what it points to); on an error the temporary file is removed."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # the mode an ordinary open() would give, not mkstemp's 0600
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """`path`'s new contents, all or nothing (atomic_writer)."""
    with atomic_writer(path) as f:
        f.write(text)
