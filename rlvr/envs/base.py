"""The environment protocol and its registry (docs/multi-turn.md).

An environment drives one episode: `reset(row)` gives the first observation (normally the prompt messages),
then each policy turn goes to `step(turn_text, turn_token_ids)`, which answers with the next observation, the
reward terms earned by that step, whether the episode is over and why. Environments are stateful and made per
episode (`make_env`); they never see or produce token ids of their own beyond the turn they are given: the
token-exact transcript belongs to the episode loop (`rlvr.envs.episode`).

Registry: like the reward registry (`rlvr.rewards.registration`). Built-in environments register with
`@register_env("name")` when `rlvr.envs.builtin` is imported; a user environment is either registered by its
module or named by its import path "pkg.module:Class" (a class or any factory taking keyword params).

Invariants: names are unique (re-registering a name with another factory raises); `get_env` returns a
registered factory or raises ValueError listing the known names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class Observation:
    """What the policy sees next, in one of three shapes (the episode loop tokenizes it exactly once).

    - `messages`: chat messages rendered with the tokenizer's chat template and a generation prompt (the
      first observation of an episode: system + user prompt);
    - `text`: the content of a later turn (a tool response), wrapped into a chat turn by the episode's
      `TurnTemplate` (built for one role; `role` here is informational, recorded for the integration);
    - `token_ids`: exact ids appended as they are (wins over the other two).
    """

    text: str = ""
    role: str = "tool"
    messages: list[dict[str, Any]] | None = None
    token_ids: list[int] | None = None


@dataclass
class StepResult:
    """The environment's answer to one policy turn.

    `reward_terms` are summed over the episode's steps; `metrics` (tool calls, errors, latency ...) likewise.
    `observation` is None when `done`. `reason` says why a finished episode ended ("done", "tool_error", ...).
    """

    observation: Observation | None
    reward_terms: dict[str, float] = field(default_factory=dict)
    done: bool = False
    reason: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Environment(Protocol):
    """One episode's environment (module docstring)."""

    def reset(self, row: dict[str, Any]) -> Observation:
        """Start an episode on a dataset row; return the first observation."""
        ...

    def step(self, turn_text: str, turn_token_ids: list[int]) -> StepResult:
        """React to one policy turn (its decoded text and the exact ids the engine produced)."""
        ...


EnvFactory = Callable[..., Environment]

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


def known_envs() -> list[str]:
    """Sorted names of every registered environment (built-ins included)."""
    _load_builtins()
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


def get_env(name: str) -> EnvFactory:
    """The factory registered under `name`; an import path "pkg.module:Class" is imported (and registered).

    Raises ValueError naming the unknown environment and listing the known ones.
    """
    _load_builtins()
    if name not in _REGISTRY and ":" in name:
        register_env(name)(_import_path(name))
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown environment {name!r}; known: {', '.join(sorted(_REGISTRY))} "
                         "(or give an import path 'pkg.module:Class')")
    return factory


def make_env(name: str, **params: Any) -> Environment:
    """A fresh environment for one episode: `get_env(name)(**params)`."""
    return get_env(name)(**params)


def _load_builtins() -> None:
    importlib.import_module("rlvr.envs.builtin")  # registers the built-in environments (idempotent)
