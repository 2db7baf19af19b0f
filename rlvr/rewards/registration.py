"""The registration mechanism of the reward registry: the table, `@register_reward` and look-ups.

A leaf module (standard library only): the verifier modules import it to register themselves, and
`rlvr.rewards.registry` (which imports the built-in verifier modules first) is the public face. The contract
of a reward function is described in registry.py.
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


def registered_names() -> list[str]:
    """Sorted names of every function registered so far."""
    return sorted(_REGISTRY)


def lookup(name: str) -> RewardSpec:
    """The spec registered under `name`; an import path "pkg.module:fn" is imported on first use.

    Raises ValueError naming the unknown function and listing the registered ones.
    """
    if name not in _REGISTRY and ":" in name:
        import_custom(name)
    spec = _REGISTRY.get(name)
    if spec is None:
        raise ValueError(
            f"unknown reward function {name!r}; known: {', '.join(registered_names())} "
            "(or give an import path 'pkg.module:fn')"
        )
    return spec
