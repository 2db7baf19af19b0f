"""The environment protocol (docs/multi-turn.md); its registry is `rlvr.envs.registration` + `rlvr.envs.registry`.

An environment drives one episode: `reset(row)` gives the first observation (normally the prompt messages),
then each policy turn goes to `step(turn_text, turn_token_ids)`, which answers with the next observation, the
reward terms earned by that step, whether the episode is over and why. Environments are stateful and made per
episode (`make_env`); they never see or produce token ids of their own beyond the turn they are given: the
token-exact transcript belongs to the episode loop (`rlvr.envs.episode`).

The registry lives beside it, laid out like the reward registry: `rlvr.envs.registration` (the table and
`@register_env`, a leaf the environment modules import) and `rlvr.envs.registry` (`get_env`, `make_env`,
`known_envs`; it imports `rlvr.envs.builtin`, so the built-ins are registered before any lookup).
"""

from __future__ import annotations

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
