"""Random-weight models with the exact shapes of real ones (`builtin:qwen2.5-0.5b`, `-1.5b`, `-7b`).

For GPU tests and benchmarks without a model hub: the config is Qwen2.5's (hidden size, layers, heads, KV heads,
intermediate size, 151,936-token vocabulary, tied embeddings for 0.5B), the weights are random (seeded), and
the tokenizer is a word-level one whose first tokens are the task's characters and the rest fillers up to the
model's vocabulary, so that any sampled id decodes. Random weights rarely emit EOS: completions run to the
length limit, which makes a fixed, comparable workload.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        tie_word_embeddings=True,
    ),
    # untied head like the real 7B (whose vocabulary is 152,064; this one keeps the shared 151,936): 7.6B parameters,
    # too many for full fine-tuning on one 80 GB GPU, the LoRA bench's single-GPU shape (configs/gpu-lora-7b.yaml)
    "qwen2.5-7b": dict(
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        tie_word_embeddings=False,
    ),
}
VOCAB_SIZE = 151936
EOS = "<|endoftext|>"


def build_tokenizer(corpus: list[str], vocab_size: int = VOCAB_SIZE) -> Any:
    """Character tokens of the corpus first, then `<tN>` fillers up to `vocab_size` (every id decodes)."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted({ch for line in corpus for ch in line})
    vocab = {EOS: 0, "<|unk|>": 1}
    for ch in chars:
        vocab.setdefault(ch, len(vocab))
    for i in range(len(vocab), vocab_size):
        vocab[f"<t{i}>"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS, unk_token="<|unk|>")


def build_shaped_model_dir(shape: str, corpus: list[str], out_dir: str | Path, seed: int = 0) -> Path:
    """Write (once) a random-weight model of `shape` with its tokenizer to `out_dir`."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"unknown built-in model shape {shape!r}; choose one of {sorted(SHAPES)}")
    out = Path(out_dir)
    marker = out / "SHAPED_MODEL.json"
    if marker.is_file() and json.loads(marker.read_text()).get("shape") == shape:
        return out
    tok = build_tokenizer(corpus)
    cfg = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        **SHAPES[shape],
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(out)
    marker.write_text(json.dumps({"shape": shape, "seed": seed}))
    return out
