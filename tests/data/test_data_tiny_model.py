"""The built-in tiny model: deterministic, atomic/idempotent directory, loadable by transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.config import ModelConfig
from rlvr.data import builtin_corpus
from rlvr.models.tiny import EOS_TOKEN, build_tiny_model_dir, build_tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

CFG = ModelConfig(tiny_hidden_size=32, tiny_num_layers=1, tiny_num_heads=2, tiny_vocab_size=64)
CORPUS = builtin_corpus("copy")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model_dir(CFG, CORPUS, tmp_path_factory.mktemp("tiny") / "model", seed=0)


def test_every_corpus_character_is_one_token() -> None:
    tok = build_tokenizer(CORPUS, 64)
    vocab = tok.get_vocab()
    for ch in set("".join(CORPUS)) | {"\n"}:
        assert ch in vocab, ch
    assert tok.eos_token == tok.pad_token == EOS_TOKEN
    text = "bdac=bdac\nab cd"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_deterministic(model_dir: Path, tmp_path: Path) -> None:
    other = build_tiny_model_dir(CFG, list(CORPUS), tmp_path / "again", seed=0)
    assert (
        json.loads((other / "tokenizer.json").read_text())["model"]["vocab"]
        == json.loads((model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    )
    a = safetensors_torch.load_file(model_dir / "model.safetensors")
    b = safetensors_torch.load_file(other / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = safetensors_torch.load_file(build_tiny_model_dir(CFG, CORPUS, tmp_path / "seed1", seed=1) / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_idempotent_and_atomic(model_dir: Path) -> None:
    mtime = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model_dir(CFG, CORPUS, model_dir, seed=0) == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert not [p for p in model_dir.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_hf_round_trip(model_dir: Path) -> None:
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    gen = transformers.GenerationConfig.from_pretrained(model_dir)
    assert gen.eos_token_id == tok.eos_token_id == model.config.eos_token_id
    assert gen.pad_token_id == tok.pad_token_id
    assert model.config.vocab_size == len(tok)
    assert model.config.hidden_size == 32 and model.config.tie_word_embeddings
    text = tok.apply_chat_template([{"role": "user", "content": "bdac="}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|assistant|>\n") and "bdac=" in text
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] <= ids.shape[1] + 4
