"""Loaders: every file format, normalisation, and validation that lists every bad row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlvr.config import ExperimentConfig
from rlvr.data import DataError, load_dataset_rows, load_rows

ROWS: list[dict[str, Any]] = [
    {"prompt": "1+1=", "ground_truth": "2", "verifier": "math", "level": 1},
    {"prompt": "2+2=", "ground_truth": "4", "verifier": "math", "level": 2},
    {"prompt": "3+3=", "ground_truth": "6", "verifier": "math", "level": 3},
]


def _cfg(**data: Any) -> ExperimentConfig:
    cfg = ExperimentConfig()
    for k, v in data.items():
        setattr(cfg.data, k, v)
    return cfg


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa

    table = pa.Table.from_pylist(rows)
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    elif path.suffix == ".arrow":
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    elif path.suffix == ".feather":
        import pyarrow.feather as feather

        feather.write_feather(table, path)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".arrow", ".feather"])
def test_file_formats(tmp_path: Path, suffix: str) -> None:
    rows = load_rows(str(_write(tmp_path / f"toy{suffix}", ROWS)), _cfg(), "train")
    assert [r["row"] for r in rows] == [0, 1, 2]
    assert rows[1] == {
        "dataset": "toy",
        "row": 1,
        "prompt": "2+2=",
        "ground_truth": "4",
        "verifier": "math",
        "extra": {"level": 2},
    }


def test_arrow_stream_and_save_to_disk(tmp_path: Path) -> None:
    import datasets
    import pyarrow as pa

    table = pa.Table.from_pylist(ROWS)
    with pa.OSFile(str(tmp_path / "s.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    assert len(load_rows(str(tmp_path / "s.arrow"), _cfg(), "train")) == 3
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "plain"))
    assert [r["ground_truth"] for r in load_rows(str(tmp_path / "plain"), _cfg(), "train")] == ["2", "4", "6"]
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:1])})
    dd.save_to_disk(str(tmp_path / "dd"))
    assert len(load_rows(str(tmp_path / "dd"), _cfg(), "test")) == 1
    with pytest.raises(DataError, match="no split 'validation'"):
        load_rows(str(tmp_path / "dd"), _cfg(), "validation")


def test_messages_and_column_mapping(tmp_path: Path) -> None:
    rows = [{"q": "hi", "a": "x", "judge": ["math", "f1"]}, {"chat": [{"role": "user", "content": "hello"}], "a": "y"}]
    cfg = _cfg(prompt_column="q", ground_truth_column="a", messages_column="chat")
    cfg.rewards.verifier_column = "judge"
    out = load_rows(str(_write(tmp_path / "m.jsonl", rows)), cfg, "train", known_verifiers={"math", "f1"})
    assert out[0]["prompt"] == "hi" and out[0]["verifier"] == ["math", "f1"] and out[0]["extra"] == {}
    assert out[1]["messages"] == [{"role": "user", "content": "hello"}] and out[1]["verifier"] is None


def test_builtin_sizes() -> None:
    cfg = _cfg(num_builtin_rows=37)
    assert len(load_rows("builtin:copy", cfg, "train")) == 37
    assert len(load_rows("builtin:copy", cfg, "test")) == 200


def test_fixture_math_file(fixtures_dir: Path) -> None:
    rows = load_rows(str(fixtures_dir / "math_small.jsonl"), _cfg(), "train", known_verifiers={"math"})
    assert len(rows) == 5 and all(r["verifier"] == "math" for r in rows)


def test_every_bad_row_is_listed(fixtures_dir: Path) -> None:
    path = str(fixtures_dir / "bad_rows.jsonl")
    with pytest.raises(DataError) as info:
        load_rows(path, _cfg(), "train", known_verifiers={"math", "copy"})
    msg = str(info.value)
    expected = {  # row -> (field, words in the reason)
        1: ("prompt", "missing column"),
        2: ("prompt", "wrong type"),
        3: ("<line>", "malformed JSON"),
        4: ("prompt", "empty prompt"),
        5: ("ground_truth", "missing column"),
        6: ("verifier", "unknown verifier 'no_such_verifier'; known: copy, math"),
    }
    assert {b.row for b in info.value.bad_rows} == set(expected)
    for row, (field, reason) in expected.items():
        assert f"{path}:{row + 1} (row {row}): field {field!r}: {reason}" in msg
    assert "6 bad row(s)" in msg
    # Without known verifiers the unknown name is not a problem.
    with pytest.raises(DataError) as info:
        load_rows(path, _cfg(), "train")
    assert {b.row for b in info.value.bad_rows} == {1, 2, 3, 4, 5}


def test_skip_mode(fixtures_dir: Path) -> None:
    loaded = load_dataset_rows(str(fixtures_dir / "bad_rows.jsonl"), _cfg(on_bad_row="skip"), "train", {"math"})
    assert [r["row"] for r in loaded.rows] == [0, 7]
    assert [b.row for b in loaded.bad_rows] == [1, 2, 3, 4, 5, 6]
    assert loaded.num_rows == 8


def test_empty_and_missing(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match=r"empty\.jsonl.*is empty"):
        load_rows(str(tmp_path / "empty.jsonl"), _cfg(), "train")
    with pytest.raises(DataError, match="not found"):
        load_rows(str(tmp_path / "nope.jsonl"), _cfg(), "train")
    (tmp_path / "allbad.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(DataError, match="no usable rows"):
        load_rows(str(tmp_path / "allbad.jsonl"), _cfg(on_bad_row="skip"), "train")


def test_wrong_types(tmp_path: Path) -> None:
    rows = [
        {"messages": "not a list", "ground_truth": "1"},
        {"messages": [{"role": "user"}], "ground_truth": "1"},
        {"prompt": "ok", "ground_truth": "1", "verifier": 5},
    ]
    path = tmp_path / "types.json"
    path.write_text(json.dumps(rows + [7]))
    with pytest.raises(DataError) as info:
        load_rows(str(path), _cfg(), "train")
    assert [(b.row, b.field) for b in info.value.bad_rows] == [
        (0, "messages"),
        (1, "messages"),
        (2, "verifier"),
        (3, "<row>"),
    ]
    assert all("wrong type" in b.reason for b in info.value.bad_rows)


def test_hub_offline_names_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    def offline(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DataError, match="'someorg/some-dataset'.*hub"):
        load_rows("someorg/some-dataset", _cfg(), "train")
