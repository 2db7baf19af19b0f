"""The text the `builtin:tiny` tokenizer is trained on: built-in tasks' text and the user's own local data.

So that a user without a hub model can try `builtin:tiny` on their own prompts offline: besides every built-in
task among the train and eval datasets, the rows of local dataset files (JSONL, JSON, Parquet, Arrow, a saved
dataset directory) contribute their prompt (or every message's content), their ground truth and the system
prompt. Every character seen is also added alone, so any text of these datasets encodes without an unknown
token (the tiny model's invariant). Hub datasets are left out: they need a download.

Invariants: deterministic (rows in file order, at most `MAX_ROWS_PER_DATASET` of each, characters sorted);
unreadable rows are skipped here (the data checks report them with their line numbers before training).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlvr.config import ExperimentConfig

MAX_ROWS_PER_DATASET = 20000
ANSWER_FORMAT = r"\boxed{}"
"""Characters a verifier may ask the answer to be written in (math's boxed answer)."""


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def row_texts(row: Any, cfg: ExperimentConfig) -> list[str]:
    """The text of one raw row that the model reads or is asked to write."""
    if not isinstance(row, dict):
        return []
    d = cfg.data
    out: list[str] = []
    messages = row.get(d.messages_column)
    if isinstance(messages, list):
        out += [m["content"] for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str)]
    elif isinstance(row.get(d.prompt_column), str):
        out.append(row[d.prompt_column])
    if row.get(d.ground_truth_column) is not None:
        out.append(_text(row[d.ground_truth_column]))
    return out


def _is_local(spec: str) -> bool:
    return not spec.startswith("builtin:") and Path(spec).exists()


def tiny_corpus(cfg: ExperimentConfig) -> list[str]:
    """Lines to train the `builtin:tiny` tokenizer on (module docstring); empty when no dataset is usable."""
    from rlvr.data import builtin_corpus
    from rlvr.data.sources import DataError, read_raw_rows

    specs = list(dict.fromkeys(cfg.data.datasets + cfg.eval.datasets))
    tasks = [s.split(":", 1)[1] for s in specs if s.startswith("builtin:")]
    lines = [line for t in tasks for line in builtin_corpus(t)]
    own: list[str] = []
    for spec in (s for s in specs if _is_local(s)):
        splits = [cfg.data.split] if Path(spec).is_file() else list(dict.fromkeys([cfg.data.split, cfg.eval.split]))
        for split in splits:
            try:
                raw, _bad = read_raw_rows(spec, cfg, split)
            except (DataError, OSError, ValueError):
                continue  # reported by the data checks, with the file and line
            for _row, _line, value in raw[:MAX_ROWS_PER_DATASET]:
                own += row_texts(value, cfg)
    if not own:
        return lines
    own += [cfg.data.system_prompt or "", ANSWER_FORMAT]
    return lines + sorted({ch for text in own for ch in text}) + [t for t in own if t]
