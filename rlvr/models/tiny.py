"""The `builtin:tiny` model: a BPE tokenizer trained on a task's text and a random-init Qwen2, built in code.

`build_tiny_model_dir` writes an ordinary HF directory (config, safetensors weights, tokenizer files with a
chat template, generation_config) that `AutoModelForCausalLM` / `AutoTokenizer` / vLLM load like any other.

Invariants:
- Deterministic: the same (model config tiny_* fields, corpus, seed) gives identical vocab and weights.
- Every character of the corpus (plus "\\n" and the space marker) is a single token, so any task text
  encodes without unknown tokens; `<|endoftext|>` is both EOS and PAD, and generation_config agrees.
- Atomic and idempotent: the directory is built in a temporary sibling and renamed into place; a complete
  directory (its `TINY_MODEL.json` marker matches the inputs) is returned as is. Concurrent builders of the
  same directory are safe: the loser of the rename uses the winner's directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rlvr.config.sections import ModelConfig

logger = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = [EOS_TOKEN, "<|unk|>", "<|system|>", "<|user|>", "<|assistant|>"]
MARKER_FILE = "TINY_MODEL.json"
SPACE_MARKER = "\u2581"  # Metaspace replacement for " ", so decode restores spaces exactly
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + '\\n' + message['content'] + '<|endoftext|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' + '\\n' }}{% endif %}"
)
"""Role markers are special tokens; each turn ends with EOS, so generation stops at the end of a turn."""


def tiny_model_fingerprint(model_cfg: ModelConfig, corpus: list[str], seed: int) -> str:
    """sha256 of everything that determines the built directory (use it to key a cache directory)."""
    payload = {
        "version": 1,
        "hidden": model_cfg.tiny_hidden_size,
        "layers": model_cfg.tiny_num_layers,
        "heads": model_cfg.tiny_num_heads,
        "vocab": model_cfg.tiny_vocab_size,
        "seed": seed,
        "corpus": hashlib.sha256("\n".join(corpus).encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _is_complete(path: Path, fingerprint: str) -> bool:
    marker = path / MARKER_FILE
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("fingerprint") == fingerprint
    except (OSError, json.JSONDecodeError):
        return False


def build_tokenizer(corpus: list[str], vocab_size: int) -> Any:
    """A `PreTrainedTokenizerFast` with a BPE model trained on `corpus` (see module invariants)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if not corpus:
        raise ValueError("the tiny tokenizer needs a non-empty corpus")
    alphabet = sorted({ch for line in corpus for ch in line.replace(" ", SPACE_MARKER)} | {"\n", SPACE_MARKER})
    tok = Tokenizer(models.BPE(unk_token="<|unk|>"))
    # Metaspace keeps spaces recoverable on decode; punctuation and digits stand alone so "=" and numbers
    # never merge with their neighbours (answers then start on a token boundary).
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement=SPACE_MARKER, prepend_scheme="never", split=True),
            pre_tokenizers.Split(Regex(r"[^\w\u2581]|\d"), behavior="isolated"),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement=SPACE_MARKER, prepend_scheme="never", split=True)
    trainer = trainers.BpeTrainer(
        vocab_size=max(vocab_size, len(alphabet) + len(SPECIAL_TOKENS)),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        min_frequency=2,
        show_progress=False,
    )
    # Sorted input: the trainer's result must not depend on the corpus order of equal lines.
    tok.train_from_iterator(sorted(corpus), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        unk_token="<|unk|>",
        additional_special_tokens=SPECIAL_TOKENS[2:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def build_tiny_model_dir(model_cfg: ModelConfig, corpus: list[str], out_dir: str | Path, seed: int) -> Path:
    """Build (or reuse) the tiny model + tokenizer directory at `out_dir` and return its path."""
    out = Path(out_dir)
    fingerprint = tiny_model_fingerprint(model_cfg, corpus, seed)
    if _is_complete(out, fingerprint):
        return out
    if out.exists():
        logger.warning("%s exists but was built from other inputs or is incomplete; rebuilding it", out)

    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer(corpus, model_cfg.tiny_vocab_size)
    hidden = model_cfg.tiny_hidden_size
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=model_cfg.tiny_num_layers,
        num_attention_heads=model_cfg.tiny_num_heads,
        num_key_value_heads=model_cfg.tiny_num_heads,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MARKER_FILE).write_text(json.dumps({"fingerprint": fingerprint, "seed": seed}, indent=1))
        if out.exists():
            stale = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            out.rename(stale / out.name)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            tmp.rename(out)
        except OSError:
            # Another process renamed its build into place first: use it if it is ours too.
            if _is_complete(out, fingerprint):
                return out
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("built tiny model (vocab %d, hidden %d) at %s", len(tokenizer), hidden, out)
    return out
