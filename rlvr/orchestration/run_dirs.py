"""Which run directory a `rlvr train` command uses, and the checks made before anything in it is touched.

- A run directory is one with rlvr's config.yaml; an existing directory without it is refused, never reused.
- run.json holds the run's config fingerprint (the config minus `logging` and `checkpoint.resume`) and status
  (running, preempted, finished). Without `--logging.run-name`, `--checkpoint.resume auto` continues the newest
  unfinished run with the same fingerprint, so the same command resumes after a preemption; a finished run is
  never continued.
- A driver holds an exclusive flock on `<run dir>/.lock` while it uses the directory; a locked run is never
  chosen or entered by another driver.
- A checkpoint of a model with another architecture is refused before anything is written.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

from rlvr.config import ExperimentConfig
from rlvr.models import is_pretrained, model_dir
from rlvr.orchestration.checkpoint import _SHAPE_KEYS, FRESH_START_HINT, CheckpointError, RunDir, write_json
from rlvr.telemetry.logs import get_logger

logger = get_logger(__name__)

RUN_STATE = "run.json"
"""Per run directory: {"config": fingerprint, "status": running | preempted | finished, "step", "started"}."""


def config_fingerprint(cfg: ExperimentConfig) -> str:
    """What makes two commands the same run: the whole config but `logging` and `checkpoint.resume`."""
    d = dataclasses.asdict(cfg)
    d.pop("logging", None)
    d.get("checkpoint", {}).pop("resume", None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


class RunLock:
    """An exclusive flock on `<run dir>/.lock`, held while a driver uses the run directory."""

    def __init__(self, root: Path) -> None:
        self.path, self.fd = root / ".lock", -1

    def acquire(self) -> bool:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _in_use(root: Path) -> bool:
    if not (root / ".lock").exists():
        return False
    lock = RunLock(root)
    if lock.acquire():
        lock.release()
        return False
    return True


def read_run_state(root: Path) -> dict[str, Any]:
    try:
        state = json.loads((root / RUN_STATE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return state if isinstance(state, dict) else {}


def check_no_symlinks(run_dir: RunDir) -> None:
    """rlvr makes no symbolic links in a run directory, and writes its files (config.yaml, metrics.jsonl,
    events.log, samples, checkpoints) by name: a link planted there would send those writes to a file outside
    the run. Such a run directory is refused before anything is written (its entries and those of
    `checkpoints/`; the run directory itself and its parents may be links, e.g. to a larger disk)."""
    root = run_dir.root
    if not root.is_dir():
        return
    entries = list(root.iterdir())
    ckpts = root / "checkpoints"
    if ckpts.is_dir() and not ckpts.is_symlink():
        entries += list(ckpts.iterdir())
    links = sorted(str(p.relative_to(root)) for p in entries if p.is_symlink())
    if links:
        raise ValueError(
            f"run directory {root} holds symbolic links ({', '.join(links[:5])}{', ...' if len(links) > 5 else ''}): "
            "rlvr writes its files there by name and will not write through a link; remove them or use a new "
            "--logging.run-name"
        )


def write_run_state(run_dir: RunDir, cfg: ExperimentConfig, status: str, step: int | None = None) -> None:
    old = read_run_state(run_dir.root)
    write_json(
        run_dir.path(RUN_STATE),
        {
            "config": config_fingerprint(cfg),
            "status": status,
            "step": step if step is not None else old.get("step", 0),
            "started": old.get("started", time.time()),
            "updated": time.time(),
        },
    )


def _check_output_parent(cfg: ExperimentConfig) -> None:
    """The output directory is a directory we can write into, or can be created (checked without creating)."""
    out = Path(cfg.checkpoint.output_dir)
    flag = f"--checkpoint.output-dir {cfg.checkpoint.output_dir}"
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{flag}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{flag}: {existing} is not writable")


def _check_run_root(root: Path) -> None:
    flag = f"--logging.run-name {root.name}"
    if not root.exists():
        return
    if not root.is_dir():
        raise ValueError(f"{flag}: {root} is a file, not a run directory")
    if any(root.iterdir()) and not (root / "config.yaml").is_file():
        raise ValueError(
            f"{flag}: {root} exists and is not an rlvr run directory (it has no config.yaml); nothing "
            "was written: choose another --logging.run-name or --checkpoint.output-dir"
        )
    if _in_use(root):
        raise ValueError(f"{flag}: {root} is in use by another rlvr process")


def _unfinished_run(out: Path, fingerprint: str) -> Path | None:
    """The newest run directory under `out` with this config fingerprint that did not finish and is not in use."""
    if not out.is_dir():
        return None
    found = []
    for d in out.iterdir():
        try:
            if not (d / "config.yaml").is_file():
                continue
            state = read_run_state(d)
            if state.get("config") == fingerprint and state.get("status") != "finished" and not _in_use(d):
                found.append((float(state.get("started", 0.0)), d.name, d))
        except (OSError, ValueError, TypeError) as e:  # another user's run, a hand-edited run.json: not ours
            logger.warning("not considering %s for --checkpoint.resume auto: %s", d, e)
    return max(found)[2] if found else None


def select_run_dir(cfg: ExperimentConfig) -> RunDir:
    """The run directory this command uses (nothing is created here)."""
    _check_output_parent(cfg)
    out = Path(cfg.checkpoint.output_dir)
    if cfg.logging.run_name:
        root = out / cfg.logging.run_name
        _check_run_root(root)
        return RunDir(root)
    if cfg.checkpoint.resume == "auto":
        found = _unfinished_run(out, config_fingerprint(cfg))
        if found is not None:
            logger.warning(
                "continuing run %s: it has the same config and did not finish (give --logging.run-name "
                "to choose a run, or --checkpoint.resume never to start a new one)",
                found,
            )
            return RunDir(found)
    name = time.strftime("rlvr-%Y%m%d-%H%M%S")
    root, n = out / name, 1
    while root.exists():
        n += 1
        root = out / f"{name}-{n}"
    return RunDir(root)


def tiny_model_corpus(cfg: ExperimentConfig) -> list[str]:
    """The text the `builtin:tiny` tokenizer is trained on: the built-in tasks and local dataset files among the
    train and eval datasets (`rlvr.data.corpus`; empty when there is none)."""
    from rlvr.data.corpus import tiny_corpus

    return tiny_corpus(cfg)


def _expected_shape(cfg: ExperimentConfig) -> dict[str, Any]:
    """Architecture fields the configured model will have, as far as known without building or downloading it."""
    m = cfg.model
    if m.path == "builtin:tiny":
        shape = {
            "model_type": "qwen2",
            "hidden_size": m.tiny_hidden_size,
            "num_hidden_layers": m.tiny_num_layers,
            "num_attention_heads": m.tiny_num_heads,
            "num_key_value_heads": m.tiny_num_heads,
            "intermediate_size": 4 * m.tiny_hidden_size,
        }
        corpus = tiny_model_corpus(cfg)
        if corpus:  # the vocabulary is what the tokenizer learns from the corpus (about a second to train)
            from rlvr.models.tiny import build_tokenizer

            shape["vocab_size"] = len(build_tokenizer(corpus, m.tiny_vocab_size))
        return shape
    if is_pretrained(m.path):
        path = model_dir(m.path.split(":", 1)[1])
    elif m.path.startswith("builtin:"):
        from rlvr.models.shaped import SHAPES

        return dict(SHAPES.get(m.path.split(":", 1)[1], {}))
    else:
        path = Path(m.path)
    config_json = path / "config.json"
    try:
        return json.loads(config_json.read_text()) if config_json.is_file() else {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--model.path {m.path}: config.json unreadable: {e}") from e


def check_compatible(cfg: ExperimentConfig, ckpt: Path) -> None:
    """Refuse (before anything is written) to resume a checkpoint of a model with another architecture."""
    try:
        saved = json.loads((ckpt / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {ckpt}: config.json unreadable: {e}") from e
    want = _expected_shape(cfg)
    diffs = [
        f"{k} {saved[k]} in the checkpoint, {want[k]} in the config"
        for k in _SHAPE_KEYS
        if k in saved and k in want and saved[k] != want[k]
    ]
    if diffs:
        raise CheckpointError(
            f"cannot resume from {ckpt}: its model differs from the configured one ({'; '.join(diffs)})."
            f" Nothing was changed. Resume with the model settings it was trained with, or "
            f"{FRESH_START_HINT}."
        )


_GENERATED_NAME = re.compile(r"^(rlvr-\d{8}-\d{6})(?:-(\d+))?$")


def _next_name(root: Path) -> Path:
    """`rlvr-<time>` -> `rlvr-<time>-2` -> `rlvr-<time>-3` ...; any other name gets `-2` appended first."""
    m = _GENERATED_NAME.match(root.name)
    base, n = (m.group(1), int(m.group(2) or 1)) if m else (root.name, 1)
    return root.parent / f"{base}-{n + 1}"


def create_run_dir(run_dir: RunDir, new_name: bool) -> tuple[RunDir, bool, list[Path]]:
    """Create the run directory and its missing parents. Returns (the run directory, whether this call created
    it, the parent directories this call created, deepest first): a failed start removes only those.

    With `new_name` (a name generated for a new run) the directory must be new: when another process made it
    first (two commands started in the same second), the next free `-<n>` suffix is taken, so each gets its own
    run. Otherwise an existing directory is used as it is and its lock decides who may use it."""
    parents: list[Path] = []
    missing, p = [], run_dir.root.parent
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    root, created = run_dir.root, False
    try:
        for p in reversed(missing):
            try:
                p.mkdir()
            except FileExistsError:  # made by another process meanwhile: not ours to remove
                continue
            parents.insert(0, p)
        for _ in range(1000):
            try:
                root.mkdir()
                created = True
                break
            except FileExistsError:
                if not new_name:
                    break
                root = _next_name(root)
        else:
            raise FileExistsError(errno.EEXIST, "no free run name after 1000 tries", str(root))
        run = RunDir(root)
        run.create()
    except OSError:
        remove_created(root if created else None, parents)
        raise
    return run, created, parents


def remove_created(root: Path | None, parents: list[Path]) -> None:
    """Undo `create_run_dir` after a failed start: the run directory this process created (and still owns) with
    its contents, then each parent it created only if empty (another run may have been created in it since)."""
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
    for p in parents:
        try:
            p.rmdir()
        except OSError:  # not empty (another process's run is in it) or already gone: left alone
            break
