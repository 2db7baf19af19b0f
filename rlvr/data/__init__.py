"""Datasets, chat rendering, tokenisation, prompt sampling and built-in offline tasks.

Imports only the standard library, transformers/tokenizers/datasets/pyarrow (lazily where heavy) and
`rlvr.config` / `rlvr.types`; never ray, vllm, deepspeed or wandb.
"""

from rlvr.data.prompts import PromptStream, apply_chat_template_override, eval_requests, prompt_seed, render_prompt
from rlvr.data.sources import BadRow, DataError, LoadedDataset, dataset_name, load_dataset_rows, load_rows
from rlvr.data.tasks import BUILTIN_TASKS, COPY_VERIFIER, builtin_corpus, builtin_rows, copy_reward
from rlvr.data.tiny_model import EOS_TOKEN, build_tiny_model_dir, build_tokenizer, tiny_model_fingerprint

__all__ = [
    "BUILTIN_TASKS", "COPY_VERIFIER", "EOS_TOKEN", "BadRow", "DataError", "LoadedDataset", "PromptStream",
    "apply_chat_template_override", "build_tiny_model_dir", "build_tokenizer", "builtin_corpus", "builtin_rows",
    "copy_reward", "dataset_name", "eval_requests", "load_dataset_rows", "load_rows", "prompt_seed",
    "render_prompt", "tiny_model_fingerprint",
]
