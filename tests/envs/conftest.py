"""A Qwen-style chat tokenizer built in code (no hub) and a scripted turn generator for the episode tests.

The chat template, like Qwen3's, drops the `<think>...</think>` block of every assistant message but the last:
re-rendering a multi-turn conversation therefore gives other ids than the ones the model generated.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlvr.envs.episode import GeneratedTurn
from rlvr.envs.turns import ObservationTokenizer, TurnTemplate
from rlvr.models.tiny import build_tokenizer

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' and not loop.last -%}"
    "{%- set content = m['content'].split('</think>')[-1].lstrip('\\n') -%}"
    "{%- else -%}{%- set content = m['content'] -%}{%- endif -%}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
CORPUS = [
    string.printable,
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    '{"name": "lookup", "arguments": {"key": "item K3"}}',
    "the secret code of item",
    "What is the sum of the secret codes of items",
    "Put the final answer in \\boxed{}.",
    "calculator",
    "python",
    "print",
    "expression",
    "Let me look it up.",
    "The answer is",
]


@pytest.fixture(scope="session")
def chat_tokenizer() -> Any:
    """A BPE tokenizer with Qwen's chat markers as special tokens and EOS `<|im_end|>`."""
    tok = build_tokenizer(CORPUS * 2, 300)
    tok.add_tokens([IM_START, IM_END], special_tokens=True)
    tok.eos_token = IM_END
    tok.chat_template = CHAT_TEMPLATE
    return tok


@pytest.fixture
def obs_tokens(chat_tokenizer: Any) -> ObservationTokenizer:
    """Observation tokenization with the turn pieces read off the chat template."""
    return ObservationTokenizer(chat_tokenizer, TurnTemplate.from_chat_template(chat_tokenizer))


class ScriptedGenerator:
    """A `TurnGenerator` that answers scripted texts (tokenized + EOS) with made-up, recorded log-probs."""

    def __init__(
        self, tokenizer: Any, texts: list[str], version: int = 3, close: bool = True, finish_reason: str = "stop"
    ) -> None:
        self.tokenizer = tokenizer
        self.texts = list(texts)
        self.version = version
        self.close = close
        self.finish_reason = finish_reason
        self.seen: list[list[int]] = []  # the transcript given at each call
        self.produced: list[GeneratedTurn] = []

    def generate_turn(self, token_ids: list[int], max_new_tokens: int) -> GeneratedTurn:
        self.seen.append(list(token_ids))
        ids = self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False)
        ids += [self.tokenizer.eos_token_id] if self.close else []
        finish = self.finish_reason
        if len(ids) > max_new_tokens:
            ids, finish = ids[:max_new_tokens], "length"
        turn = GeneratedTurn(
            ids,
            [-0.01 * (i + 1) - len(self.produced) for i in range(len(ids))],
            finish,
            self.version + len(self.produced),
        )
        self.produced.append(turn)
        return turn


@pytest.fixture
def scripted(chat_tokenizer: Any) -> Callable[..., ScriptedGenerator]:
    """Factory: `scripted(texts, **options)`."""
    return lambda texts, **kw: ScriptedGenerator(chat_tokenizer, texts, **kw)


@pytest.fixture(scope="module")
def engine(chat_tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The real transformers engine on a tiny random Qwen2 with the chat tokenizer (one per test module: tests may
    update its weights)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlvr.rollout.hf_engine import TransformersEngine

    path: Path = tmp_path_factory.mktemp("tiny_chat_qwen2")
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(chat_tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=64,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=chat_tokenizer.eos_token_id,
        pad_token_id=chat_tokenizer.eos_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    chat_tokenizer.save_pretrained(path)
    eng = TransformersEngine(str(path), num_threads=1)
    yield eng
    eng.shutdown()
