"""`rlvr train` on a local HF model directory and local Parquet / JSONL datasets (no built-in pieces)."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlvr.config import ModelConfig
from rlvr.data import builtin_corpus, builtin_rows
from rlvr.models.tiny import build_tiny_model_dir


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_local_model_and_datasets(tmp_path, ray_cluster):
    model_dir = build_tiny_model_dir(ModelConfig(tiny_vocab_size=0), builtin_corpus("copy4"), tmp_path / "model", 0)
    train = builtin_rows("copy4", "train", 64, 0)
    pq.write_table(pa.Table.from_pylist(train), tmp_path / "train.parquet")
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in builtin_rows("copy4", "test", 8, 0)))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr.cli",
            "train",
            "--model.path",
            str(model_dir),
            "--data.datasets",
            str(tmp_path / "train.parquet"),
            "--eval.datasets",
            str(tmp_path / "eval.jsonl"),
            "--eval.every-n-steps",
            "2",
            "--num-steps",
            "2",
            "--rollout.prompts-per-step",
            "4",
            "--checkpoint.output-dir",
            str(tmp_path / "runs"),
            "--logging.run-name",
            "local",
            "--logging.console-progress",
            "False",
        ],
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    run = tmp_path / "runs" / "local"
    assert not (run / "builtin_model").exists()
    evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals] == [0, 2] and evals[-1]["eval/num_prompts"] == 8
    ckpt = run / "checkpoints" / "step_2"
    assert (ckpt / "MANIFEST.json").is_file() and (ckpt / "config.json").is_file()
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    AutoModelForCausalLM.from_pretrained(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert GenerationConfig.from_pretrained(ckpt).eos_token_id == tok.eos_token_id
