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
import math
import os
import shutil
from pathlib import Path
from typing import Any, Callable

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
        manifest = _parse_json(m)
        _check_manifest(manifest)
    except (OSError, ValueError) as e:
        return f"MANIFEST.json unreadable: {e}"
    root = ckpt.resolve()
    for rel, info in manifest["files"].items():
        p = ckpt / rel
        try:
            if root not in p.resolve().parents:
                return f"MANIFEST.json names a file outside the checkpoint: {rel!r}"
            if not p.is_file():
                return f"missing file {rel}"
            if p.stat().st_size != info["size"]:
                return f"size mismatch for {rel}"
            if checksums and _sha256(p) != info["sha256"]:
                return f"checksum mismatch for {rel}"
        except (OSError, ValueError) as e:  # a name no file system holds (NUL byte, too long, a loop)
            return f"MANIFEST.json names an unusable path {rel!r}: {e}"
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
        read_checkpoint_configs(ckpt)
    except CheckpointError as e:
        return str(e).split(": ", 1)[-1]
    return None


def write_driver_state(state_dir: Path, state: dict[str, Any]) -> None:
    write_json(state_dir / DRIVER_STATE, state)


def read_driver_state(ckpt: Path) -> dict[str, Any]:
    """`trainer_state/driver.json`, checked against `check_driver_state` before any field is used;
    `CheckpointError` naming the file and the field otherwise."""
    return _read_checked(ckpt, f"trainer_state/{DRIVER_STATE}", check_driver_state, "an rlvr driver state")


def _read_checked(ckpt: Path, rel: str, check: Callable[[Any], None], what: str) -> Any:
    """The JSON document `ckpt/rel`, parsed and passed through `check` (which raises SchemaError);
    `CheckpointError` naming the file, and the field, otherwise."""
    try:
        doc = _parse_json(ckpt / rel)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint {ckpt}: {rel} unreadable: {e}") from None
    try:
        check(doc)
    except SchemaError as e:
        raise CheckpointError(f"checkpoint {ckpt}: {rel} is not {what}: {e}") from None
    return doc


def read_checkpoint_configs(ckpt: Path) -> None:
    """The checkpoint's other JSON documents, checked before anything reads them: the model's `config.json`
    (a JSON object; its shape fields integers) and, for a LoRA checkpoint, `adapter_config.json`
    (`rlvr.rollout.lora.check_adapter_config`). `CheckpointError` naming the file and field."""
    from rlvr.rollout import lora

    if (ckpt / "config.json").is_file():
        _read_checked(ckpt, "config.json", _check_model_config, "a model config")
    if (ckpt / lora.CONFIG_FILE).exists():
        try:
            lora.read_adapter_config(ckpt)
        except ValueError as e:
            raise CheckpointError(f"checkpoint {ckpt}: {e}") from None


# ------------------------------------------------------------------------------ schemas of checkpoint JSON
class SchemaError(ValueError):
    """A JSON document does not have its expected shape; the message names the field (`ledger.state['x']`)."""


def _parse_json(path: Path) -> Any:
    """A JSON document from disk; ValueError (never another type) for text that is not one. Python's parser also
    takes NaN and Infinity: the schemas refuse them where a number must be finite."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(str(e)) from None
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _what(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (bool, int, float, str, type(None))) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return type(value) is int  # bool is a subclass of int: `true` is not a step


def expect_int(value: Any, where: str, minimum: int | None = None) -> int:
    if not _is_int(value):
        raise SchemaError(f"{where} must be an integer, got {_what(value)}")
    if minimum is not None and value < minimum:
        raise SchemaError(f"{where} must be >= {minimum}, got {value}")
    return value


def expect_number(value: Any, where: str, minimum: float | None = None, positive: bool = False) -> float:
    if not (_is_int(value) or type(value) is float) or not math.isfinite(value):
        raise SchemaError(f"{where} must be a finite number, got {_what(value)}")
    if positive and value <= 0:
        raise SchemaError(f"{where} must be > 0, got {value}")
    if minimum is not None and value < minimum:
        raise SchemaError(f"{where} must be >= {minimum}, got {value}")
    return value


def expect_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise SchemaError(f"{where} must be a string, got {_what(value)}")
    return value


def expect_list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise SchemaError(f"{where} must be a list, got {_what(value)}")
    return value


def expect_object(value: Any, where: str, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()) -> dict:
    """A JSON object with every `required` key and no key beyond `required` + `optional` (when either is given)."""
    if not isinstance(value, dict):
        raise SchemaError(f"{where} must be a JSON object, got {_what(value)}")
    missing = [k for k in required if k not in value]
    if missing:
        raise SchemaError(f"{where} has no {missing[0]!r}")
    if required or optional:
        extra = sorted(set(value) - set(required) - set(optional))
        if extra:
            raise SchemaError(f"{where} has an unexpected field {extra[0]!r}")
    return value


def _check_manifest(m: Any) -> None:
    expect_object(m, "MANIFEST.json", ("step", "files"))
    expect_int(m["step"], "step", 0)
    for rel, info in expect_object(m["files"], "files").items():
        expect_object(info, f"files[{rel!r}]", ("size", "sha256"))
        expect_int(info["size"], f"files[{rel!r}].size", 0)
        expect_str(info["sha256"], f"files[{rel!r}].sha256")


_SHAPE_KEYS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
)
"""Architecture fields of a model's config.json that decide whether a checkpoint fits a config (run_dirs)."""


def _check_model_config(doc: Any) -> None:
    expect_object(doc, "config.json")
    for k in _SHAPE_KEYS:
        if k in doc and doc[k] is not None:
            expect_str(doc[k], k) if k == "model_type" else expect_int(doc[k], k, 0)


_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "max_new_tokens", "stop_strings", "stop_token_ids", "seed")
_REQUEST_FIELDS = ("sampling", "metadata", "is_eval", "prompt_text")


def _check_request(r: Any, where: str) -> None:
    """A `PromptRequest` as `request_to_json` writes it (metadata: any JSON object, it is dataset data)."""
    expect_object(r, where, ("prompt_id", "prompt_token_ids", "num_samples"), _REQUEST_FIELDS)
    expect_str(r["prompt_id"], f"{where}.prompt_id")
    for i, t in enumerate(expect_list(r["prompt_token_ids"], f"{where}.prompt_token_ids")):
        expect_int(t, f"{where}.prompt_token_ids[{i}]", 0)
    expect_int(r["num_samples"], f"{where}.num_samples", 1)
    if "sampling" in r:
        s = expect_object(r["sampling"], f"{where}.sampling", optional=_SAMPLING_FIELDS)
        w = f"{where}.sampling"
        if "temperature" in s:
            expect_number(s["temperature"], f"{w}.temperature", 0)
        if "top_p" in s:
            expect_number(s["top_p"], f"{w}.top_p", 0)
        if "top_k" in s:
            expect_int(s["top_k"], f"{w}.top_k", -1)
        if "max_new_tokens" in s:
            expect_int(s["max_new_tokens"], f"{w}.max_new_tokens", 0)
        for i, x in enumerate(expect_list(s.get("stop_strings", []), f"{w}.stop_strings")):
            expect_str(x, f"{w}.stop_strings[{i}]")
        for i, x in enumerate(expect_list(s.get("stop_token_ids", []), f"{w}.stop_token_ids")):
            expect_int(x, f"{w}.stop_token_ids[{i}]", 0)
        if s.get("seed") is not None:
            expect_int(s["seed"], f"{w}.seed")
    if "metadata" in r:
        expect_object(r["metadata"], f"{where}.metadata")
    if "is_eval" in r and not isinstance(r["is_eval"], bool):
        raise SchemaError(f"{where}.is_eval must be true or false, got {_what(r['is_eval'])}")
    if "prompt_text" in r:
        expect_str(r["prompt_text"], f"{where}.prompt_text")


def _check_ledger(d: Any) -> None:
    """`PromptLedger.state_dict()` (failure_reasons optional: older checkpoints lack it)."""
    from rlvr.orchestration.accounting import TERMINAL

    expect_object(d, "ledger", ("state", "in_flight", "extra_pulled"), ("failure_reasons",))
    for pid, st in expect_object(d["state"], "ledger.state").items():
        if st not in TERMINAL:
            raise SchemaError(f"ledger.state[{pid!r}] must be one of {', '.join(TERMINAL)}, got {_what(st)}")
    for i, pid in enumerate(expect_list(d["in_flight"], "ledger.in_flight")):
        expect_str(pid, f"ledger.in_flight[{i}]")
    for k, v in expect_object(d["extra_pulled"], "ledger.extra_pulled").items():
        if k not in TERMINAL:
            raise SchemaError(f"ledger.extra_pulled has an unexpected field {k!r}")
        expect_int(v, f"ledger.extra_pulled[{k!r}]", 0)
    for pid, reason in expect_object(d.get("failure_reasons", {}), "ledger.failure_reasons").items():
        expect_str(reason, f"ledger.failure_reasons[{pid!r}]")


def _check_stream(d: Any) -> None:
    """`PromptStream.state_dict()` (its `load_state_dict` checks the version and the datasets against the config)."""
    w = "feeder.stream"
    expect_object(d, w, ("version", "num_pulled", "cursors", "counters", "datasets", "shuffle_seed"))
    expect_int(d["version"], f"{w}.version")
    expect_int(d["num_pulled"], f"{w}.num_pulled", 0)
    for i, c in enumerate(expect_list(d["cursors"], f"{w}.cursors")):
        if not isinstance(c, list) or len(c) != 2:
            raise SchemaError(f"{w}.cursors[{i}] must be [epoch, position], got {_what(c)}")
        expect_int(c[0], f"{w}.cursors[{i}][0]", 0)
        expect_int(c[1], f"{w}.cursors[{i}][1]", 0)
    for k, v in expect_object(d["counters"], f"{w}.counters").items():
        expect_int(v, f"{w}.counters[{k!r}]", 0)
    for i, ds in enumerate(expect_list(d["datasets"], f"{w}.datasets")):
        if not isinstance(ds, list) or len(ds) != 2:
            raise SchemaError(f"{w}.datasets[{i}] must be [name, rows], got {_what(ds)}")
        expect_str(ds[0], f"{w}.datasets[{i}][0]")
        expect_int(ds[1], f"{w}.datasets[{i}][1]", 0)
    expect_int(d["shuffle_seed"], f"{w}.shuffle_seed")


def check_driver_state(state: Any) -> None:
    """The schema of driver.json (what `Trainer.save_checkpoint` writes): SchemaError naming the first bad field.

    {"step": int >= 0, "ledger": PromptLedger.state_dict(), "feeder": {"requeue": [PromptRequest as JSON],
    "stream": PromptStream.state_dict()}}; integers are never booleans, numbers are finite, no unknown fields."""
    expect_object(state, "driver state", ("step", "ledger", "feeder"))
    expect_int(state["step"], "step", 0)
    _check_ledger(state["ledger"])
    feeder = expect_object(state["feeder"], "feeder", ("requeue", "stream"))
    for i, r in enumerate(expect_list(feeder["requeue"], "feeder.requeue")):
        _check_request(r, f"feeder.requeue[{i}]")
    _check_stream(feeder["stream"])


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
