"""Looking environments up: built-in names, or an import path "pkg.module:Class" (a class or any factory taking
keyword params), which is imported and registered on first use.

Invariants: `get_env` returns a registered factory or raises ValueError listing the known names. Only the config
imports: `get_env(name, allow_import=False)` (a name from the data's `env` column) never imports a module, so a
row cannot make the trainer import and call an arbitrary callable (`os:abort`); an import path the config names
(`env.name`) is registered when the config's name is first looked up.
"""

from __future__ import annotations

import importlib
from typing import Any

import rlvr.envs.builtin  # noqa: F401  (registers the built-in environments)
from rlvr.envs.base import EnvFactory, Environment
from rlvr.envs.registration import _REGISTRY, register_env


def known_envs() -> list[str]:
    """Sorted names of every registered environment (built-ins included)."""
    return sorted(_REGISTRY)


def _import_path(path: str) -> EnvFactory:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import environment module {module_name!r} (from {path!r}): {e}") from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"environment {path!r}: {module_name} has no callable {attr!r}")
    return factory


def get_env(name: str, allow_import: bool = True) -> EnvFactory:
    """The factory registered under `name`; an import path "pkg.module:Class" is imported (and registered) only
    with `allow_import` (names from the config, never from the data).

    Raises ValueError naming the unknown environment and listing the known ones.
    """
    if name not in _REGISTRY and ":" in name:
        if not allow_import:
            raise ValueError(
                f"environment {name!r} is an import path, which only the config may give (--env.name); "
                f"the data may name a registered environment: {', '.join(sorted(_REGISTRY))}"
            )
        register_env(name)(_import_path(name))
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(
            f"unknown environment {name!r}; known: {', '.join(sorted(_REGISTRY))} "
            "(or give an import path 'pkg.module:Class' as --env.name)"
        )
    return factory


def make_env(name: str, **params: Any) -> Environment:
    """A fresh environment for one episode: `get_env(name)(**params)`."""
    return get_env(name)(**params)
