"""The reward registry: reward functions selected by name (docs/design.md, "Reward functions").

A reward function has the signature

    fn(completion_text: str, metadata: dict, **params) -> float | None

- `metadata` is the row's metadata (ground truth in `metadata["ground_truth"]`, the routed verifier names in
  the routing column, ...). The scorer passes a shallow copy that also carries
  `metadata["completion_token_ids"]` (list[int] | None): length-based rewards read the token count there and
  fall back to the number of whitespace-separated words when it is None (e.g. `rlvr reward` on raw text).
  The trainer and `rlvr eval` also put the engine's `metadata["finish_reason"]` there ("stop": EOS or a stop
  string; "length": cut at max_new_tokens; "abort"); it is absent for raw text.
- `params` come from config (`RewardFunctionConfig.params`): scalars only (float, int, str, bool).
- Return None when the function cannot score this row (missing ground truth, ...); None scores are left out
  of the total. Raising is allowed (the scorer turns it into status "error"), but never needed for bad model
  output: bad output scores 0.

Built-in functions register themselves with `@register_reward` (from `rlvr.rewards.registration`, the leaf the
verifier modules import) when `rlvr.rewards.builtin` imports them; this module imports `builtin`, so every
lookup here sees them. User functions register either with `@register_reward("name")` in a module listed in
`rewards.custom`, or by giving an import path "pkg.module:fn" as the function name directly.

Layers (no import cycle): registration <- verifier modules <- builtin <- registry <- scorer, catalog, cli.

Invariants: names are unique (re-registering a name with a different function raises); `get_reward` either
returns a registered function or raises ValueError listing the known names.
"""

from __future__ import annotations

from rlvr.rewards.builtin import BUILTIN_MODULES
from rlvr.rewards.registration import RewardFn, RewardSpec, import_custom, lookup, register_reward, registered_names

__all__ = [
    "BUILTIN_MODULES",
    "RewardFn",
    "RewardSpec",
    "get_reward",
    "import_custom",
    "known_rewards",
    "register_reward",
]


def known_rewards() -> list[str]:
    """Sorted names of every registered reward function (built-ins included)."""
    return registered_names()


def get_reward(name: str) -> RewardSpec:
    """The spec registered under `name`; an import path "pkg.module:fn" is imported on first use.

    Raises ValueError naming the unknown function and listing the known ones.
    """
    return lookup(name)
