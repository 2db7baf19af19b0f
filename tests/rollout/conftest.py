"""A tiny Qwen2 model and char-level BPE tokenizer saved to disk, built in code (no hub)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from rlvr.rollout.hf_engine import TransformersEngine

EOS = "<|endoftext|>"
_LINES = ["1+2=3", "4+5=9", "the cat sat on a mat", "a b c d e", "7*8=56", "hello world", "0 1 2 3 4 5 6 7 8 9"]


def _tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(vocab_size=40, special_tokens=[EOS], show_progress=False)
    tok.train_from_iterator(_LINES, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny_qwen2")
    tokenizer = _tokenizer()
    assert len(tokenizer) <= 40
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=64, max_position_embeddings=256, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def make_engine(tiny_model_dir: Path) -> Iterator[Callable[..., TransformersEngine]]:
    """Build engines on the tiny model (1 torch thread); every engine is shut down after the test."""
    engines: list[TransformersEngine] = []

    def make(**kwargs: Any) -> TransformersEngine:
        kwargs.setdefault("num_threads", 1)
        engine = TransformersEngine(str(tiny_model_dir), **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.shutdown()
