"""Run directory and checkpoint mechanics (docs/design.md, Run directory).

Atomicity: a checkpoint is written into `checkpoints/.tmp_step_<n>/`, gets its MANIFEST.json (files, sizes,
sha256) last, is renamed to `step_<n>/`, and only then is `checkpoints/latest` rewritten (via a temp file +
os.replace). A crash at any point leaves either the previous complete checkpoint as `latest` or a `.tmp_`
directory that is ignored and cleaned up.

A checkpoint is data, never code: the driver's state is JSON, weights are safetensors, optimizer and RNG state
are torch files loaded with `weights_only=True`. A manifest proves a checkpoint is complete, not that it is
safe (anyone who can write a file can regenerate it), so `find_resume` also scans every torch file's pickle
for the globals it would import (without running it) and refuses files of pickle formats outright, before any
actor starts. The only classes beyond torch's own weights-only set are `SAFE_TORCH_GLOBALS` (DeepSpeed's
optimizer-state records), which the learners allow when they load.

Resume: `auto` takes the newest checkpoint whose manifest verifies and falls back to older ones with a warning;
when checkpoints exist but none verifies it stops with an error naming them (never a silent fresh start that
would overwrite the run). Pruning keeps the newest `keep_last` good checkpoints: one that failed verification is
never counted as kept, one this process never checked counts when its manifest's files exist with their sizes
(not re-hashed: see `_prune`), and the newest checkpoint this process wrote or verified is never deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from rlvr.telemetry.logs import get_logger

logger = get_logger(__name__)
MANIFEST = "MANIFEST.json"
DRIVER_STATE = "driver.json"
"""The driver's state (step, prompt ledger, stream position, prompts in flight), under `trainer_state/`."""
PICKLE_SUFFIXES = (".pkl", ".pickle", ".bin", ".pth")
"""Files of these kinds are never loaded from a checkpoint: unpickling them runs arbitrary code."""
FRESH_START_HINT = (
    "start a new run beside it with another --logging.run-name, or start this run over from step "
    "0 with --checkpoint.resume never (its metrics and checkpoints are then replaced)"
)


class CheckpointError(ValueError):
    """A checkpoint cannot be used; the message names it, the reason and the flags that get past it."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(ckpt: Path, step: int) -> None:
    files = {}
    for p in sorted(ckpt.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            files[str(p.relative_to(ckpt))] = {"size": p.stat().st_size, "sha256": _sha256(p)}
    tmp = ckpt / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"step": step, "files": files}, indent=1))
    os.replace(tmp, ckpt / MANIFEST)


def verify_manifest(ckpt: Path, checksums: bool = True) -> str | None:
    """None when complete and intact, else the reason it is not. `checksums=False` checks only that the manifest
    parses and every file it lists exists with its listed size (no file is read: cheap on multi-GB checkpoints)."""
    m = ckpt / MANIFEST
    if not m.is_file():
        return "no MANIFEST.json (incomplete write)"
    try:
        manifest = json.loads(m.read_text())
        files = manifest["files"]
        assert isinstance(files, dict)
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AssertionError) as e:
        return f"MANIFEST.json unreadable: {e}"
    root = ckpt.resolve()
    for rel, info in files.items():
        p = ckpt / rel
        if root not in p.resolve().parents:
            return f"MANIFEST.json names a file outside the checkpoint: {rel}"
        if not p.is_file():
            return f"missing file {rel}"
        if not isinstance(info, dict) or p.stat().st_size != info.get("size"):
            return f"size mismatch for {rel}"
        if checksums and _sha256(p) != info.get("sha256"):
            return f"checksum mismatch for {rel}"
    return None


def unsafe_content(ckpt: Path) -> str | None:
    """None when every file of the checkpoint is plain data, else the reason it is refused.

    Torch files are scanned, not loaded: `get_unsafe_globals_in_checkpoint` reads the pickle's opcodes and lists
    the globals it would import."""
    import torch

    from rlvr.learner.backends import SAFE_TORCH_GLOBALS

    for p in sorted(ckpt.rglob("*")):
        if not p.is_file():
            continue
        rel = p.relative_to(ckpt)
        if p.suffix in PICKLE_SUFFIXES:
            return f"{rel} is a pickle file, and loading one runs whatever code it names"
        if p.suffix == ".pt":
            try:
                found = torch.serialization.get_unsafe_globals_in_checkpoint(p)
            except Exception as e:  # trust boundary: bytes from disk; any failure to parse refuses the file
                return f"{rel} is not a torch checkpoint archive ({type(e).__name__}: {e})"
            bad = sorted(set(found) - set(SAFE_TORCH_GLOBALS))
            if bad:
                return f"{rel} would import {', '.join(bad[:5])} when loaded (not tensors or plain data)"
    state = ckpt / "trainer_state" / DRIVER_STATE
    if not state.is_file():
        return f"trainer_state/{DRIVER_STATE} is missing (a checkpoint of an older rlvr, or not rlvr's)"
    try:
        read_driver_state(ckpt)
    except CheckpointError as e:
        return str(e).split(": ", 1)[-1]
    return None


def write_driver_state(state_dir: Path, state: dict[str, Any]) -> None:
    write_json(state_dir / DRIVER_STATE, state)


def read_driver_state(ckpt: Path) -> dict[str, Any]:
    path = ckpt / "trainer_state" / DRIVER_STATE
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {ckpt}: {path.name} unreadable: {e}") from e
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        raise CheckpointError(f"checkpoint {ckpt}: {path.name} is not an rlvr driver state (no integer 'step')")
    return state


class RunDir:
    """`<output_dir>/<run_name>/` with its files and checkpoints. Creating the object touches nothing on disk;
    `create()` makes the directories."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.ckpts = self.root / "checkpoints"
        # checkpoint name -> its manifest verified with checksums (True: written by this process or verified,
        # False: failed verification), each checked at most once per process
        self._verified: dict[str, bool] = {}

    def create(self) -> None:
        self.ckpts.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.root / name

    def tmp_checkpoint(self, step: int) -> Path:
        tmp = self.ckpts / f".tmp_step_{step}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit_checkpoint(self, tmp: Path, step: int, keep_last: int) -> Path:
        write_manifest(tmp, step)
        final = self.ckpts / f"step_{step}"
        old = self.ckpts / f".old_step_{step}"
        if final.exists():  # moved aside, not deleted, until the new one is in place
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        self._verified[final.name] = True  # its manifest was just computed from the files written
        latest_tmp = self.ckpts / "latest.tmp"
        latest_tmp.write_text(final.name + "\n")
        os.replace(latest_tmp, self.ckpts / "latest")
        self._prune(keep_last)
        return final

    def complete_checkpoints(self) -> list[Path]:
        """`step_<n>` directories, oldest first (complete or not: see `verified`)."""
        steps = []
        for p in self.ckpts.glob("step_*"):
            try:
                steps.append((int(p.name.split("_", 1)[1]), p))
            except ValueError:
                continue
        return [p for _, p in sorted(steps)]

    def verified(self, ckpt: Path) -> str | None:
        """None when the checkpoint's manifest verifies, else the reason (checked once per process)."""
        if self._verified.get(ckpt.name):
            return None
        reason = verify_manifest(ckpt)
        self._verified[ckpt.name] = reason is None
        return reason

    def _prune(self, keep_last: int) -> None:
        """Keep the newest `keep_last` good checkpoints and any others newer than the oldest of them; delete
        everything older. With fewer good checkpoints than that, delete nothing.

        Good: written or verified (checksums) by this process, or, for one this process never checked (older
        ones after a resume), a manifest whose files all exist with their listed sizes: hashing every kept
        multi-GB checkpoint would stall the driver for minutes. One that failed verification never counts. The
        newest checkpoint this process wrote or verified is never deleted, so the last one known to verify
        survives whatever the cheap check missed."""
        for p in [*self.ckpts.glob(".tmp_step_*"), *self.ckpts.glob(".old_step_*")]:
            shutil.rmtree(p, ignore_errors=True)
        ckpts = self.complete_checkpoints()
        trusted = [i for i, p in enumerate(ckpts) if self._verified.get(p.name)]
        keep_from = trusted[-1] if trusted else len(ckpts)  # the newest known-good one and all newer stay
        kept = 0
        for i in range(len(ckpts) - 1, -1, -1):
            known = self._verified.get(ckpts[i].name)
            if known or (known is None and verify_manifest(ckpts[i], checksums=False) is None):
                kept += 1
                if kept == max(1, keep_last):
                    for p in ckpts[: min(i, keep_from)]:
                        shutil.rmtree(p, ignore_errors=True)
                        self._verified.pop(p.name, None)
                    return

    def find_resume(self, resume: str) -> Path | None:
        """The checkpoint to resume from: `never` -> None; a path -> it (verified); `auto` -> the newest that
        verifies, None when there is none. Raises `CheckpointError` for a checkpoint that is not plain data, and
        when checkpoints exist but none verifies (a silent fresh start would overwrite the run)."""
        if resume == "never":
            return None
        if resume != "auto":
            p = Path(resume)
            reason = verify_manifest(p)
            if reason:
                raise CheckpointError(f"--checkpoint.resume {resume}: checkpoint is not usable: {reason}")
            _refuse_unsafe(p)
            if p.parent.resolve() == self.ckpts.resolve():
                self._verified[p.name] = True  # pruning trusts it without hashing it again
            return p
        skipped = []
        for p in reversed(self.complete_checkpoints()):
            reason = self.verified(p)
            if reason is None:
                _refuse_unsafe(p)
                return p
            skipped.append(f"  {p}: {reason}")
            logger.warning("skipping checkpoint %s: %s; trying the previous one", p, reason)
        if skipped:
            raise CheckpointError(
                f"run {self.root} has checkpoints but none is usable:\n"
                + "\n".join(skipped)
                + f"\nNothing was changed. Restore one of them, or {FRESH_START_HINT}."
            )
        return None


def _refuse_unsafe(ckpt: Path) -> None:
    reason = unsafe_content(ckpt)
    if reason:
        raise CheckpointError(
            f"checkpoint {ckpt} refused: {reason}. rlvr writes checkpoints as JSON, safetensors "
            f"and weights-only torch files; this one was not written by this rlvr or was altered. "
            f"Nothing was loaded. Remove it, or {FRESH_START_HINT}."
        )


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def load_learners(learners: list, ckpt: Path, timeout_s: float) -> None:
    """Every learner loads `ckpt`'s weights and weights-only optimizer/RNG state; a learner's refusal of the contents
    (or torch's size mismatch: another model shape) becomes a `CheckpointError` naming the checkpoint."""
    import ray

    try:
        ray.get([lrn.load.remote(str(ckpt / "trainer_state"), str(ckpt)) for lrn in learners], timeout=timeout_s)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, ValueError):  # the learner refused the checkpoint's contents
            raise CheckpointError(f"checkpoint {ckpt}: {e.cause}") from None
        if isinstance(e.cause, RuntimeError) and "size mismatch" in str(e.cause):
            # torch's load_state_dict on tensors of other shapes (e.g. another vocabulary): check_compatible
            # refuses the known cases before start-up; this catches the rest without a traceback
            raise CheckpointError(
                f"checkpoint {ckpt}: its weights do not fit the configured model "
                f"({str(e.cause).strip()[:2000]}). Resume with the model settings it was "
                f"trained with, or {FRESH_START_HINT}."
            ) from None
        raise
