"""Imports every module of built-in reward functions so that their `@register_reward`s run.

Invariant: importing this module registers all built-in names and imports no heavy dependency
(math-verify and sympy are imported on the first math call). The verifier modules import only
`rlvr.rewards.registration` from the registry, never `registry` itself (which imports this module).
"""

from rlvr.rewards import code_verifiers, ifeval, math_verifiers, shaping, tasks, text_match

BUILTIN_MODULES = (code_verifiers, ifeval, math_verifiers, shaping, tasks, text_match)
"""The modules whose import registers the built-in reward functions."""
