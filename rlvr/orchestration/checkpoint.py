"""Run directory and checkpoint mechanics (INTERFACES.md §6).

Atomicity: a checkpoint is written into `checkpoints/.tmp_step_<n>/`, gets its MANIFEST.json (files, sizes,
sha256) last, is renamed to `step_<n>/`, and only then is `checkpoints/latest` rewritten (via a temp file +
os.replace). A crash at any point leaves either the previous complete checkpoint as `latest` or a `.tmp_`
directory that is ignored and cleaned up. `find_resume` verifies the manifest and falls back to older
complete checkpoints with a warning.
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


def verify_manifest(ckpt: Path) -> str | None:
    """None when complete and intact, else the reason it is not."""
    m = ckpt / MANIFEST
    if not m.is_file():
        return "no MANIFEST.json (incomplete write)"
    try:
        manifest = json.loads(m.read_text())
    except json.JSONDecodeError as e:
        return f"MANIFEST.json unreadable: {e}"
    for rel, info in manifest["files"].items():
        p = ckpt / rel
        if not p.is_file():
            return f"missing file {rel}"
        if p.stat().st_size != info["size"]:
            return f"size mismatch for {rel}"
        if _sha256(p) != info["sha256"]:
            return f"checksum mismatch for {rel}"
    return None


class RunDir:
    """`<output_dir>/<run_name>/` with its files and checkpoints."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.ckpts = self.root / "checkpoints"
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
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        latest_tmp = self.ckpts / "latest.tmp"
        latest_tmp.write_text(final.name + "\n")
        os.replace(latest_tmp, self.ckpts / "latest")
        self._prune(keep_last)
        return final

    def complete_checkpoints(self) -> list[Path]:
        steps = []
        for p in self.ckpts.glob("step_*"):
            try:
                steps.append((int(p.name.split("_", 1)[1]), p))
            except ValueError:
                continue
        return [p for _, p in sorted(steps)]

    def _prune(self, keep_last: int) -> None:
        for p in self.ckpts.glob(".tmp_step_*"):
            shutil.rmtree(p, ignore_errors=True)
        ckpts = self.complete_checkpoints()
        for p in ckpts[:-keep_last]:
            shutil.rmtree(p, ignore_errors=True)

    def find_resume(self, resume: str) -> Path | None:
        """The checkpoint to resume from: `never` -> None; a path -> it (verified); `auto` -> newest intact."""
        if resume == "never":
            return None
        if resume != "auto":
            p = Path(resume)
            reason = verify_manifest(p)
            if reason:
                raise ValueError(f"--checkpoint.resume {resume}: checkpoint is not usable: {reason}")
            return p
        for p in reversed(self.complete_checkpoints()):
            reason = verify_manifest(p)
            if reason is None:
                return p
            logger.warning("skipping checkpoint %s: %s; trying the previous one", p, reason)
        return None


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)
