"""The reward registry: reward functions selected by name (INTERFACES.md §5).

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

Built-in functions register themselves when `rlvr.rewards.builtin` is imported; user functions register
either with `@register_reward("name")` in a module listed in `rewards.custom`, or by giving an import path
"pkg.module:fn" as the function name directly.

Invariants: names are unique (re-registering a name with a different function raises); `get_reward` either
returns a registered function or raises ValueError listing the known names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RewardFn = Callable[..., "float | None"]


@dataclass(frozen=True)
class RewardSpec:
    """A registered reward function and what the scorer needs to know about it."""

    name: str
    fn: RewardFn
    max_score: float = 1.0  # `correct` = (score >= max_score) when this function is the primary one


_REGISTRY: dict[str, RewardSpec] = {}
_BUILTINS_LOADED = False


def register_reward(name: str, *, max_score: float = 1.0) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering `fn` under `name`; `max_score` is the score that counts as correct."""

    def decorator(fn: RewardFn) -> RewardFn:
        existing = _REGISTRY.get(name)
        if existing is not None and existing.fn is not fn and _qualname(existing.fn) != _qualname(fn):
            raise ValueError(f"reward {name!r} is already registered by {_qualname(existing.fn)}")
        _REGISTRY[name] = RewardSpec(name=name, fn=fn, max_score=max_score)
        return fn

    return decorator


def _qualname(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _load_builtins() -> None:
    global _BUILTINS_LOADED
    if not _BUILTINS_LOADED:
        importlib.import_module("rlvr.rewards.builtin")
        _BUILTINS_LOADED = True


def import_custom(path: str) -> None:
    """Import a user module ("pkg.module" or "pkg.module:fn") so that its `@register_reward`s run.

    With ":fn", the function is also registered under the full path if it did not register itself.
    """
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import custom reward module {module_name!r} (from {path!r}): {e}") from e
    if attr:
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise ValueError(f"custom reward {path!r}: {module_name} has no callable {attr!r}")
        if path not in _REGISTRY:
            register_reward(path)(fn)


def known_rewards() -> list[str]:
    """Sorted names of every registered reward function (built-ins included)."""
    _load_builtins()
    return sorted(_REGISTRY)


def get_reward(name: str) -> RewardSpec:
    """The spec registered under `name`; an import path "pkg.module:fn" is imported on first use.

    Raises ValueError naming the unknown function and listing the known ones.
    """
    _load_builtins()
    if name not in _REGISTRY and ":" in name:
        import_custom(name)
    spec = _REGISTRY.get(name)
    if spec is None:
        raise ValueError(f"unknown reward function {name!r}; known: {', '.join(known_rewards())} "
                         "(or give an import path 'pkg.module:fn')")
    return spec
