"""Evaluation: pass@k / maj@k estimators (`metrics`), the shared eval runner (`runner`), and `rlvr eval` (`cli`).

Importing this package is cheap: no torch, transformers or vllm until an engine is built.
"""

from rlvr.eval.metrics import maj_at_k, pass_at_k
from rlvr.eval.runner import evaluate, summarize

__all__ = ["evaluate", "maj_at_k", "pass_at_k", "summarize"]
