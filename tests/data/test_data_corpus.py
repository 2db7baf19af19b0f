"""`builtin:tiny` on the user's own data, offline: the tokenizer is trained on local dataset files' text too, so
every prompt, message and ground truth encodes without an unknown token, and `rlvr train` runs on a JSONL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.config import default_config
from rlvr.data.corpus import tiny_corpus
from rlvr.models.tiny import build_tokenizer

ROWS = [
    {"prompt": "Wie viel ist 3 plus 4? Antworte mit der Zahl.", "ground_truth": "7", "verifier": "gsm8k"},
    {"messages": [{"role": "user", "content": "Qu'est-ce que 2×5 ? ½ réponse"}], "ground_truth": "10"},
    {"prompt": "λ-calculus: (λx.x) y", "ground_truth": ["y", "Y"], "verifier": "exact_match"},
]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def test_own_jsonl_text_encodes_without_unknown_tokens(tmp_path: Path) -> None:
    cfg = default_config()
    cfg.data.datasets = [str(_write(tmp_path / "own.jsonl", ROWS))]
    cfg.data.system_prompt = "Sei präzise."
    corpus = tiny_corpus(cfg)
    tok = build_tokenizer(corpus, 0)
    unk = tok.convert_tokens_to_ids("<|unk|>")
    texts = [
        ROWS[0]["prompt"],
        ROWS[1]["messages"][0]["content"],
        ROWS[2]["prompt"],
        "Sei präzise.",
        r"\boxed{7}",
        '["y", "Y"]',
    ]
    for text in texts:
        ids = tok(text)["input_ids"]
        assert unk not in ids and tok.decode(ids) == text, text
    assert tiny_corpus(cfg) == corpus  # deterministic


def test_builtin_tasks_and_hub_names(tmp_path: Path) -> None:
    cfg = default_config()  # builtin:copy4 only: the built-in corpus, nothing else
    from rlvr.data import builtin_corpus

    assert tiny_corpus(cfg) == builtin_corpus("copy4")
    cfg.data.datasets = ["someone/hub-dataset"]  # not read (a download): no corpus, train explains
    assert tiny_corpus(cfg) == []
    cfg.data.datasets = ["builtin:copy4", str(_write(tmp_path / "own.jsonl", ROWS[:1]))]
    corpus = tiny_corpus(cfg)
    assert corpus[: len(builtin_corpus("copy4"))] == builtin_corpus("copy4") and ROWS[0]["prompt"] in corpus


def _train(tmp_path: Path, data: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "rlvr.cli",
        "train",
        "--data.datasets",
        str(data),
        "--eval.datasets",
        str(data),
        "--eval.split",
        "train",
        "--eval.max-prompts",
        "4",
        "--rollout.prompts-per-step",
        "4",
        "--checkpoint.output-dir",
        str(tmp_path / "runs"),
        "--generation.max-new-tokens",
        "6",
        *extra,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=dict(os.environ))


@pytest.mark.slow
def test_train_builtin_tiny_on_own_jsonl(tmp_path: Path, ray_cluster: str) -> None:
    data = _write(tmp_path / "own.jsonl", [dict(ROWS[0], prompt=f"{ROWS[0]['prompt']} ({i})") for i in range(40)])
    out = _train(tmp_path, data, "--num-steps", "2", "--data.max-prompt-tokens", "64", "--logging.run-name", "own")
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "runs" / "own" / "checkpoints" / "step_2" / "model.safetensors").is_file()
    assert "rlvr train: finished at step 2" in out.stdout
    # the demo preset's 32-token prompt limit drops every one of these prompts: said, not a silent "finished"
    out = _train(tmp_path, data, "--num-steps", "1", "--logging.run-name", "dropped")
    assert "training data exhausted at step 0" in out.stderr and "'dropped_too_long': 40" in out.stderr, out.stderr[
        -3000:
    ]
