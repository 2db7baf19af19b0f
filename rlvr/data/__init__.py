"""Datasets, chat rendering, tokenisation, prompt sampling and built-in offline tasks.

Imports only the standard library, transformers/tokenizers/datasets/pyarrow (lazily where heavy) and
`rlvr.config` / `rlvr.types`; never ray, vllm, deepspeed or wandb.
"""

from rlvr.data.prompts import PromptStream, apply_chat_template_override, eval_requests, prompt_seed, render_prompt
from rlvr.data.sources import BadRow, DataError, LoadedDataset, dataset_name, load_dataset_rows, load_rows
from rlvr.data.tasks import BUILTIN_TASKS, COPY_VERIFIER, builtin_corpus, builtin_rows, copy_reward

__all__ = [
    "BUILTIN_TASKS",
    "COPY_VERIFIER",
    "BadRow",
    "DataError",
    "LoadedDataset",
    "PromptStream",
    "apply_chat_template_override",
    "builtin_corpus",
    "builtin_rows",
    "copy_reward",
    "dataset_name",
    "eval_requests",
    "load_dataset_rows",
    "load_rows",
    "prompt_seed",
    "render_prompt",
]
