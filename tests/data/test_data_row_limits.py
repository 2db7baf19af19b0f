"""A giant row cannot exhaust memory: a JSONL line over `MAX_ROW_BYTES` is a bad row named by file:line and is
never held whole; a prompt too long to ever fit `max_prompt_tokens` is dropped by its length, untokenized."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from rlvr.config import ExperimentConfig
from rlvr.data import DataError, PromptStream, load_dataset_rows
from rlvr.data.sources import MAX_ROW_BYTES


def _cfg(**data: Any) -> ExperimentConfig:
    cfg = ExperimentConfig()
    for k, v in data.items():
        setattr(cfg.data, k, v)
    return cfg


def _write_with_giant_row(path: Path, giant_mb: int, at: int = 2) -> None:
    with open(path, "w") as f:
        for i in range(5):
            prompt = "ab" * (giant_mb << 19) if i == at else f"ab{i}="
            f.write(json.dumps({"prompt": prompt, "ground_truth": "ab", "verifier": "copy"}) + "\n")


def test_giant_jsonl_line_is_a_bad_row_named_by_line_with_bounded_memory(tmp_path):
    path = tmp_path / "giant.jsonl"
    _write_with_giant_row(path, giant_mb=40)  # 40 MiB on line 3
    tracemalloc.start()
    try:
        with pytest.raises(DataError) as err:
            load_dataset_rows(str(path), _cfg(), "train")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    msg = str(err.value)
    assert f"{path}:3 (row 2)" in msg and "40.0 MiB" in msg and f"{MAX_ROW_BYTES >> 20} MiB limit" in msg
    assert [b.line for b in err.value.bad_rows] == [3]
    assert peak < 3 * MAX_ROW_BYTES  # the 40 MiB line was never held whole (nor parsed, nor tokenized)


def test_giant_line_with_skip_is_counted_and_the_rest_loads(tmp_path):
    path = tmp_path / "giant.jsonl"
    _write_with_giant_row(path, giant_mb=12, at=4)
    loaded = load_dataset_rows(str(path), _cfg(on_bad_row="skip"), "train")
    assert [r["row"] for r in loaded.rows] == [0, 1, 2, 3]
    assert [(b.row, b.line) for b in loaded.bad_rows] == [(4, 5)]


def test_line_just_under_the_limit_is_read(tmp_path):
    path = tmp_path / "big.jsonl"
    row = {"prompt": "", "ground_truth": "ab"}
    row["prompt"] = "a" * (MAX_ROW_BYTES - len(json.dumps(row)))
    path.write_text(json.dumps(row) + "\n")
    assert len(load_dataset_rows(str(path), _cfg(), "train").rows) == 1


class _CountingTokenizer:
    """Wraps a tokenizer and fails if it is ever handed a text longer than `limit` characters."""

    def __init__(self, inner: Any, limit: int) -> None:
        self.inner, self.limit = inner, limit
        self.chat_template = None

    def __call__(self, text: str, **kw: Any) -> Any:
        assert len(text) <= self.limit, f"tokenized a {len(text)}-character prompt"
        return self.inner(text, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_prompt_too_long_by_characters_is_dropped_without_tokenizing(tmp_path, tiny_tokenizer, caplog):
    path = tmp_path / "rows.jsonl"
    rows = [
        {"prompt": "ab=", "ground_truth": "ab", "verifier": "copy"},
        {"prompt": "ab" * 300_000, "ground_truth": "ab", "verifier": "copy"},
    ]  # 600k chars, under the line cap
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _cfg(datasets=[str(path)], max_prompt_tokens=64, apply_chat_template=False, num_epochs=1)
    stream = PromptStream(cfg, _CountingTokenizer(tiny_tokenizer, 10_000))
    with caplog.at_level("WARNING"):
        got = [r.prompt_id for r in iter(stream.next_request, None)]
    assert got == ["rows:0:0"]
    assert stream.counters["dropped_too_long"] == 1
    assert "row 1" in caplog.text and "600000 characters" in caplog.text and "not tokenized" in caplog.text


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_deeply_nested_row_is_a_bad_row_named_by_line(tmp_path, suffix):
    """A line nested 100,000 deep overflows json's recursion: a bad row named by its line, not a RecursionError."""
    path = tmp_path / f"deep{suffix}"
    ok = json.dumps({"prompt": "ab1=", "ground_truth": "ab", "verifier": "copy"})
    path.write_text(ok + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(DataError) as err:
        load_dataset_rows(str(path), _cfg(), "train")
    assert f"{path}:2 (row 1)" in str(err.value) and "nested too deeply" in str(err.value)


def test_json_file_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "u.json"
    path.write_bytes(b'[{"prompt": "\xff", "ground_truth": "2"}]\n')
    with pytest.raises(DataError) as err:
        load_dataset_rows(str(path), _cfg(), "train")
    assert f"{path}:1 (row 0)" in str(err.value) and "not UTF-8" in str(err.value)
