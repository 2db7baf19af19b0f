"""The environment table and `@register_env` (a leaf: environment modules import it to register themselves).

Invariant: names are unique; re-registering a name with another factory raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlvr.envs.base import EnvFactory

_REGISTRY: dict[str, EnvFactory] = {}


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def register_env(name: str) -> Callable[[EnvFactory], EnvFactory]:
    """Decorator registering an environment class (or factory) under `name`."""

    def decorator(factory: EnvFactory) -> EnvFactory:
        existing = _REGISTRY.get(name)
        if existing is not None and existing is not factory and _qualname(existing) != _qualname(factory):
            raise ValueError(f"environment {name!r} is already registered by {_qualname(existing)}")
        _REGISTRY[name] = factory
        return factory

    return decorator
