"""Loading training/eval rows from files, saved datasets, the hub and built-in tasks, with validation.

Specs: `builtin:<task>`; a local `.jsonl` / `.json` / `.parquet` / `.arrow` / `.feather` file; a directory
written by `datasets.save_to_disk`; otherwise a hub name for `datasets.load_dataset` (needs a network).

Every row is normalised to
    {"dataset": name, "row": index, "messages": [...] or "prompt": str, "ground_truth": ...,
     "verifier": str | list[str] | None, "extra": {other columns}}

Invariants:
- `row` is the row's position in its source (JSONL: among non-blank lines), so it is stable whether or not
  bad rows are skipped; prompt ids built from it survive restarts.
- Validation never stops at the first problem: `DataError.bad_rows` holds every bad row (file, line/row,
  field, reason) and the message lists them. An empty dataset is a `DataError` naming the file.
- With `on_bad_row == "skip"` bad rows are returned separately (`LoadedDataset.bad_rows`) so callers count
  them; `load_rows` then returns only the good rows.
- Reserved column names (`RESERVED_COLUMNS`, and any name starting with `RESERVED_PREFIX`) are bad rows: the
  request metadata carries every extra column, and these names are the keys of an episode's record (its reward
  terms, end reason, per-token loss mask) and the trainer's private keys, so a column must not impersonate them
  (e.g. a run's samples.jsonl reused as data).
- An `env` column names a registered environment or the config's `env.name`, never an import path of its own
  (`rlvr.envs.settings.check_env_column`): a row cannot choose a callable for the trainer to import and call.
- A JSONL line longer than `MAX_ROW_BYTES` is a bad row (file:line, its size) and is never held in memory
  whole: it is read and dropped in bounded chunks, so one giant row cannot exhaust the trainer's memory.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.config.sections import ExperimentConfig
from rlvr.data.tasks import builtin_rows

logger = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin:"
BUILTIN_TEST_ROWS = 200
"""Rows of a built-in task's test split (fixed, so eval is comparable across runs)."""
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".arrow", ".feather")
_MAX_LISTED = 200
RESERVED_COLUMNS = frozenset(
    {"completion_loss_mask", "end_reason", "error", "reward_terms", "episode_metrics", "turns", "transcript", "attempt"}
)
"""Metadata keys of an episode's record (`rlvr.envs.engine_turns.episode_to_sample`, `EpisodeRunner`): never a
data column (module docstring)."""
RESERVED_PREFIX = "_rlvr"
"""Prefix of the trainer's private metadata keys (the episode marker, the row's raw prompt): never a data column."""
MAX_ROW_BYTES = 8 << 20
"""Largest JSONL line read as a row (8 MiB: far above any prompt a model can take, far below a memory risk)."""


@dataclass
class BadRow:
    """One row that failed validation."""

    source: str
    row: int
    field: str
    reason: str
    line: int | None = None  # 1-based line number for JSONL files

    def __str__(self) -> str:
        if self.line is not None:
            where = f"{self.source}:{self.line} (row {self.row})"
        else:
            where = f"{self.source} row {self.row}"
        return f"{where}: field {self.field!r}: {self.reason}"


class DataError(ValueError):
    """A dataset cannot be used as is; `bad_rows` lists every bad row found (possibly empty)."""

    def __init__(self, message: str, bad_rows: list[BadRow] | None = None) -> None:
        super().__init__(message)
        self.bad_rows = list(bad_rows or [])


@dataclass
class LoadedDataset:
    """A validated dataset: good rows (normalised) and the bad ones (skip mode only)."""

    name: str
    source: str
    rows: list[dict[str, Any]]
    bad_rows: list[BadRow] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        """Rows in the source, good and bad."""
        return len(self.rows) + len(self.bad_rows)


def dataset_name(spec: str) -> str:
    """Short stable name of a dataset spec: `builtin:copy` as is, a file's stem, a hub name as is."""
    if spec.startswith(BUILTIN_PREFIX):
        return spec
    path = Path(spec)
    if path.suffix in FILE_SUFFIXES or path.is_dir():
        return path.stem if path.suffix in FILE_SUFFIXES else path.name
    return spec


def _read_jsonl(path: Path) -> tuple[list[tuple[int, int, Any]], list[BadRow]]:
    """(row index, line number, parsed value) for each non-blank line, plus malformed and oversized lines as bad
    rows. Lines are read at most `MAX_ROW_BYTES` at a time."""
    entries: list[tuple[int, int, Any]] = []
    bad: list[BadRow] = []
    row = 0
    with path.open("rb") as f:
        line_no = 0
        while raw := f.readline(MAX_ROW_BYTES + 2):
            line_no += 1
            if len(raw.rstrip(b"\r\n")) > MAX_ROW_BYTES:
                size = len(raw)
                while not raw.endswith(b"\n") and (raw := f.readline(1 << 20)):  # skip the rest, never held whole
                    size += len(raw)
                bad.append(
                    BadRow(
                        str(path),
                        row,
                        "<line>",
                        f"line of {size / 2**20:.1f} MiB is over the "
                        f"{MAX_ROW_BYTES >> 20} MiB limit of one row (no prompt that long can be trained on)",
                        line_no,
                    )
                )
                row += 1
                continue
            if not raw.strip():
                continue
            try:
                entries.append((row, line_no, json.loads(raw.decode("utf-8"))))
            except UnicodeDecodeError as e:
                bad.append(BadRow(str(path), row, "<line>", f"not UTF-8 text: {e.reason} at byte {e.start}", line_no))
            except json.JSONDecodeError as e:
                reason = f"malformed JSON line: {e.msg} at column {e.colno}"
                bad.append(BadRow(str(path), row, "<line>", reason, line_no))
            except RecursionError:
                bad.append(BadRow(str(path), row, "<line>", "JSON nested too deeply to be a dataset row", line_no))
            row += 1
    return entries, bad


def _read_json(path: Path) -> tuple[list[tuple[int, int | None, Any]], list[BadRow]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, RecursionError):
        return _read_jsonl(path)  # JSON Lines saved as .json (as `datasets` accepts); its lines name the problem
    except UnicodeDecodeError:
        return _read_jsonl(path)  # the line that is not UTF-8 is named there
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(data) == 1 and len(lists) == 1:
            data = lists[0]  # {"data": [...]}
        elif lists and len(lists) == len(data) and len({len(v) for v in lists}) == 1:
            keys = list(data)
            data = [dict(zip(keys, values)) for values in zip(*lists)]  # columnar {"col": [...], ...}
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of row objects (or JSON Lines), got {type(data).__name__}")
    return [(i, None, value) for i, value in enumerate(data)], []


def _read_arrow(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.feather as feather

    if path.suffix == ".feather":
        return feather.read_table(path).to_pylist()
    with pa.memory_map(str(path)) as source:
        try:
            return pa.ipc.open_file(source).read_all().to_pylist()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_stream(source).read_all().to_pylist()  # `datasets` cache files are streams


def _read_saved_dataset(path: Path, split: str) -> list[dict[str, Any]]:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(f"{path}: no split {split!r}; available: {', '.join(loaded)}")
        loaded = loaded[split]
    return loaded.to_list()


def _read_hub(spec: str, split: str) -> list[dict[str, Any]]:
    import datasets

    try:
        return datasets.load_dataset(spec, split=split).to_list()
    except Exception as e:  # trust boundary: the network and the hub; re-raised with the spec named
        raise DataError(
            f"could not load dataset {spec!r} (split {split!r}) from the Hugging Face hub: {type(e).__name__}: {e}. "
            "Local datasets must be an existing .jsonl/.json/.parquet/.arrow file or a save_to_disk directory; "
            "hub names need a network connection."
        ) from e


RawRows = list[tuple[int, "int | None", Any]]


def read_raw_rows(spec: str, cfg: ExperimentConfig, split: str) -> tuple[RawRows, list[BadRow]]:
    """Raw rows of a spec as (row index, line number or None, value), plus unreadable rows."""
    if spec.startswith(BUILTIN_PREFIX):
        task = spec[len(BUILTIN_PREFIX) :]
        num_rows = cfg.data.num_builtin_rows if split == "train" else BUILTIN_TEST_ROWS
        rows = builtin_rows(task, "train" if split == "train" else "test", num_rows, cfg.seed)
        return [(i, None, r) for i, r in enumerate(rows)], []
    path = Path(spec)
    if path.is_dir():
        return [(i, None, r) for i, r in enumerate(_read_saved_dataset(path, split))], []
    if path.suffix in FILE_SUFFIXES or spec.startswith((".", "/", "~")):
        if not path.is_file():
            raise DataError(f"dataset file not found: {spec}")
        if path.suffix == ".jsonl":
            return _read_jsonl(path)
        if path.suffix == ".json":
            return _read_json(path)
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return [(i, None, r) for i, r in enumerate(pq.read_table(path).to_pylist())], []
        if path.suffix in (".arrow", ".feather"):
            return [(i, None, r) for i, r in enumerate(_read_arrow(path))], []
        raise DataError(f"{spec}: unsupported file type {path.suffix!r}; use one of {', '.join(FILE_SUFFIXES)}")
    return [(i, None, r) for i, r in enumerate(_read_hub(spec, split))], []


def _check_messages(value: Any) -> str | None:
    if not isinstance(value, list):
        return f"wrong type: expected a list of {{role, content}} messages, got {type(value).__name__}"
    if not value:
        return "empty prompt: the message list is empty"
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return f"wrong type: message {i} must be an object with string 'role' and 'content'"
    if not any(m["content"].strip() for m in value):
        return "empty prompt: every message content is blank"
    return None


def normalise_row(
    value: Any,
    name: str,
    source: str,
    row: int,
    line: int | None,
    cfg: ExperimentConfig,
    known_verifiers: set[str] | None,
) -> tuple[dict[str, Any] | None, list[BadRow]]:
    """Validate one raw row and normalise it; returns (row or None, its problems: all of them)."""
    data = cfg.data
    problems: list[BadRow] = []

    def bad(col: str, reason: str) -> None:
        problems.append(BadRow(source, row, col, reason, line))

    if not isinstance(value, dict):
        bad("<row>", f"wrong type: expected a JSON object, got {type(value).__name__}")
        return None, problems
    out: dict[str, Any] = {"dataset": name, "row": row}
    used = {data.messages_column, data.prompt_column, data.ground_truth_column, cfg.rewards.verifier_column}
    if value.get(data.messages_column) is not None:
        reason = _check_messages(value[data.messages_column])
        if reason:
            bad(data.messages_column, reason)
        out["messages"] = value[data.messages_column]
    elif data.prompt_column in value and value[data.prompt_column] is not None:
        prompt = value[data.prompt_column]
        if not isinstance(prompt, str):
            bad(data.prompt_column, f"wrong type: expected a string, got {type(prompt).__name__}")
        elif not prompt.strip():
            bad(data.prompt_column, "empty prompt")
        out["prompt"] = prompt
    else:
        bad(data.prompt_column, f"missing column (need {data.prompt_column!r} or {data.messages_column!r})")
    if value.get(data.ground_truth_column) is None:
        bad(data.ground_truth_column, "missing column")
    out["ground_truth"] = value.get(data.ground_truth_column)
    verifier = value.get(cfg.rewards.verifier_column)
    if verifier is not None:
        names = [verifier] if isinstance(verifier, str) else verifier
        if not isinstance(names, list) or not names or not all(isinstance(v, str) and v for v in names):
            bad(
                cfg.rewards.verifier_column,
                f"wrong type: expected a verifier name or a list of names, got {verifier!r}",
            )
        elif known_verifiers is not None:
            for v in names:
                if v not in known_verifiers:
                    known = ", ".join(sorted(known_verifiers))
                    bad(cfg.rewards.verifier_column, f"unknown verifier {v!r}; known: {known}")
    out["verifier"] = verifier
    extra = {k: v for k, v in value.items() if k not in used}
    for col in sorted(k for k in extra if k in RESERVED_COLUMNS or str(k).startswith(RESERVED_PREFIX)):
        bad(
            col,
            f"reserved column name {col!r}: the trainer keeps its own episode records under this key "
            f"(reserved: {', '.join(sorted(RESERVED_COLUMNS))} and names starting with {RESERVED_PREFIX!r}); "
            "rename or drop the column (a run's samples.jsonl is not training data)",
        )
    if "env" in extra:  # rlvr.envs.settings.ENV_COLUMN (imported lazily: the data layer stays light)
        from rlvr.envs.settings import check_env_column

        reason = check_env_column(extra["env"], cfg.env.name)
        if reason:
            bad("env", reason)
    out["extra"] = extra
    return (None if problems else out), problems


def format_bad_rows(source: str, bad_rows: list[BadRow]) -> str:
    """A message listing the bad rows (every one, up to a large cap; all are in `DataError.bad_rows`)."""
    num_rows = len({b.row for b in bad_rows})
    lines = [f"{source}: {num_rows} bad row(s) ({len(bad_rows)} problem(s)); fix them or set data.on_bad_row=skip:"]
    lines += [f"  {b}" for b in bad_rows[:_MAX_LISTED]]
    if len(bad_rows) > _MAX_LISTED:
        lines.append(f"  ... and {len(bad_rows) - _MAX_LISTED} more (see DataError.bad_rows)")
    return "\n".join(lines)


def load_dataset_rows(
    spec: str, cfg: ExperimentConfig, split: str, known_verifiers: set[str] | None = None
) -> LoadedDataset:
    """Read, validate and normalise a dataset. Raises `DataError` on an empty dataset and, unless
    `cfg.data.on_bad_row == "skip"`, on any bad row (listing all of them)."""
    name = dataset_name(spec)
    raw, bad_rows = read_raw_rows(spec, cfg, split)
    if not raw and not bad_rows:
        raise DataError(f"dataset {spec!r} (split {split!r}) is empty: no rows")
    rows: list[dict[str, Any]] = []
    for row, line, value in raw:
        normalised, problems = normalise_row(value, name, spec, row, line, cfg, known_verifiers)
        bad_rows.extend(problems)
        if normalised is not None:
            rows.append(normalised)
    bad_rows.sort(key=lambda b: b.row)
    if bad_rows and cfg.data.on_bad_row != "skip":
        raise DataError(format_bad_rows(spec, bad_rows), bad_rows)
    if not rows:
        message = f"dataset {spec!r} (split {split!r}) has no usable rows:\n" + format_bad_rows(spec, bad_rows)
        raise DataError(message, bad_rows)
    if bad_rows:
        logger.warning("%s: skipping %d bad row(s) (data.on_bad_row=skip)", spec, len({b.row for b in bad_rows}))
    unique_bad: dict[int, BadRow] = {}
    for b in bad_rows:
        unique_bad.setdefault(b.row, b)
    return LoadedDataset(name=name, source=spec, rows=rows, bad_rows=list(unique_bad.values()))


def load_rows(
    spec: str, cfg: ExperimentConfig, split: str, known_verifiers: set[str] | None = None
) -> list[dict[str, Any]]:
    """The good, normalised rows of a dataset spec (see `load_dataset_rows` for errors and skip mode)."""
    return load_dataset_rows(spec, cfg, split, known_verifiers).rows
