"""The `env` config section made usable: which rows run episodes, their environments, limits and tokenization.

- Routing: a row (its request metadata) with an `env` column runs that environment; a row without one runs
  `env.name` when set, else stays single-turn (`EnvSettings.route` returns None). The column may only name a
  registered environment (or the config's `env.name`): import paths come from the config alone, never from data
  (`get_env(..., allow_import=False)`; rows are checked at load, `rlvr.data.sources`).
- Environments are made per episode with `env.params`, plus `tools`, `tool_format`, `end_on_tool_error` and the
  tool timeout when the section sets them (for `ToolEnv`-style factories; a user environment takes what its
  factory accepts).
- `check_env` is the start-up check (run before any actor starts; a ValueError naming the field): every
  environment named by the section or by the data is known, and `max_total_tokens` fits the model's context,
  the pack length and a set `rollout.vllm_max_model_len`. An environment with the `python` tool (the code sandbox)
  is refused where the sandbox does not isolate (`isolation_level()` "rlimits": no network or filesystem
  isolation) unless `env.allow_unisolated_python` opts in: model-written code is untrusted, and the `code`
  verifiers' rule is the same (README: "do not train on untrusted code that way").
- `observation_tokenizer`: the tokenizer's chat template when it has one (and the data applies it); otherwise plain text (messages joined
  by newlines; an observation turn is its content on its own line), as the tiny CPU model's prompts are.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from rlvr.config.sections import EnvConfig
from rlvr.envs.base import Environment
from rlvr.envs.episode import EpisodeLimits
from rlvr.envs.registry import get_env
from rlvr.envs.turns import ObservationTokenizer, TurnTemplate

ENV_COLUMN = "env"


@dataclass
class EnvSettings:
    """What the collector needs from `cfg.env` (module docstring)."""

    name: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    limits: EpisodeLimits = field(default_factory=EpisodeLimits)
    explicit: set[str] = field(default_factory=set)
    """Keys of `env.params` (given by the user: passed to every factory)."""

    @classmethod
    def from_config(cls, env: EnvConfig) -> EnvSettings:
        params: dict[str, Any] = dict(env.params)
        explicit = set(params)
        if env.tools:
            params.setdefault("tools", list(env.tools))
        if env.tool_format:
            params.setdefault("tool_format", env.tool_format)
        if env.end_on_tool_error:
            params.setdefault("end_on_tool_error", True)
        params.setdefault("timeout_s", env.tool_timeout_s)
        limits = EpisodeLimits(env.max_turns, env.max_tokens_per_turn, env.max_total_tokens)
        return cls(env.name, params, limits, explicit)

    def route(self, metadata: dict[str, Any]) -> str | None:
        """The environment a row runs, or None (single-turn)."""
        name = metadata.get(ENV_COLUMN)
        if isinstance(name, str) and name:
            return name
        return self.name or None

    def make(self, name: str) -> Environment:
        """A fresh environment for one episode. The section's tool settings go only to a factory that takes
        them (a keyword of that name, or **kwargs); `env.params` always go as given."""
        factory = get_env(name, allow_import=name == self.name)  # a data-routed name never imports
        return factory(**{k: v for k, v in self.params.items() if k in self.explicit or _takes(factory, k)})


def _takes(factory: Any, key: str) -> bool:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return True
    return key in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def observation_tokenizer(tokenizer: Any, chat_template: bool = True, system_prompt: str = "") -> ObservationTokenizer:
    """Observation tokenization for `tokenizer` (module docstring); `chat_template` False (the data's
    `apply_chat_template` off) renders plain text even when the tokenizer has a template. `system_prompt`
    (`data.system_prompt`) goes into every episode's first observation, once."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        return ObservationTokenizer(tokenizer, TurnTemplate.from_chat_template(tokenizer, role="user"), system_prompt)
    return PlainObservationTokenizer(tokenizer, TurnTemplate(tokenizer.eos_token or "", "\n", "", "\n"), system_prompt)


class PlainObservationTokenizer(ObservationTokenizer):
    """No chat template: the first observation's messages are joined by newlines (module docstring)."""

    def first(self, observation: Any) -> list[int]:
        if observation.token_ids is None and observation.messages is not None:
            messages = self.with_system_prompt(observation.messages)
            text = "\n".join(str(m.get("content", "")) for m in messages if m.get("content"))
            return self.encode(text + "\n")
        return super().first(observation)


def check_env(cfg: Any, model_context: int | None, data_envs: set[str] | None = None) -> None:
    """Start-up checks of the `env` section (module docstring); raises ValueError naming the field."""
    env = cfg.env
    names = ([env.name] if env.name else []) + sorted(data_envs or ())
    for name in names:
        from_config = name == env.name
        field_name = "--env.name" if from_config else f"the data's `{ENV_COLUMN}` column"
        try:
            get_env(name, allow_import=from_config)
        except ValueError as e:
            raise ValueError(f"{field_name}: {e}") from e
    if names and model_context is not None and env.max_total_tokens > model_context:
        raise ValueError(
            f"--env.max-total-tokens ({env.max_total_tokens}) exceeds the model's context "
            f"({model_context} positions, max_position_embeddings): lower it to at most {model_context}"
        )
    _check_python_isolation(cfg, names)
    max_len = cfg.rollout.vllm_max_model_len
    if names and cfg.rollout.backend == "vllm" and 0 < max_len < env.max_total_tokens:
        raise ValueError(
            f"--rollout.vllm-max-model-len ({max_len}) is shorter than an episode may grow "
            f"(--env.max-total-tokens {env.max_total_tokens}): raise it to at least {env.max_total_tokens} "
            "or lower --env.max-total-tokens"
        )
    cap = min(env.max_turns * env.max_tokens_per_turn, env.max_total_tokens)  # shaping.episode_length_cap
    if names and 0 < cfg.algorithm.overlong_buffer and cap <= cfg.algorithm.overlong_buffer:
        raise ValueError(
            f"--algorithm.overlong-buffer ({cfg.algorithm.overlong_buffer}) must be smaller than an episode's Lmax "
            f"({cap} = min(--env.max-turns x --env.max-tokens-per-turn, --env.max-total-tokens))"
        )
    if names and cfg.learner.pack_length < env.max_total_tokens:
        raise ValueError(
            f"--learner.pack-length ({cfg.learner.pack_length}) is shorter than an episode may grow "
            f"(--env.max-total-tokens {env.max_total_tokens}): raise the pack length or lower the limit"
        )


ISOLATING_LEVELS = ("namespaces", "userns")
"""Code sandbox levels (`rlvr.rewards.sandbox.isolation_level`) with network and filesystem isolation."""


def uses_python_tool(settings: EnvSettings, name: str) -> bool:
    """Whether environment `name` (made as an episode would make it) has the `python` tool."""
    return "python" in (getattr(settings.make(name), "tool_names", None) or ())


def _check_python_isolation(cfg: Any, names: list[str]) -> None:
    if cfg.env.allow_unisolated_python:
        return
    settings = EnvSettings.from_config(cfg.env)
    with_python = [n for n in names if uses_python_tool(settings, n)]
    if not with_python:
        return
    from rlvr.rewards import sandbox

    level = sandbox.isolation_level()
    if level not in ISOLATING_LEVELS:
        raise ValueError(
            f"environment(s) {', '.join(with_python)} run the `python` tool, but the code sandbox here has only "
            f"isolation level {level!r} (no network or filesystem isolation: the model's code could read your files "
            "and reach the network); run where `unshare` works (namespaces/userns), drop the python tool "
            "(--env.tools), or accept the risk with --env.allow-unisolated-python"
        )


def check_env_column(value: Any, config_name: str) -> str | None:
    """Why a row's `env` column value cannot route (None when it can): it must be a registered environment's name
    or the config's `env.name`; never an import path of the data's own (module docstring)."""
    from rlvr.envs.registry import known_envs

    if value is None or value == "":
        return None
    if not isinstance(value, str):
        return f"wrong type: expected an environment name, got {type(value).__name__}"
    if value == config_name or value in known_envs():
        return None
    if ":" in value:
        return (
            f"import path {value!r}: the data may only name a registered environment "
            f"({', '.join(known_envs())}) or the config's --env.name; give import paths as --env.name"
        )
    return f"unknown environment {value!r}; known: {', '.join(known_envs())} (or the config's --env.name)"


def model_context(model_dir: str) -> int | None:
    """The model's context length (`max_position_embeddings` of its config.json), None when unknown."""
    import json
    from pathlib import Path

    try:
        value = json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None
    return int(value) if isinstance(value, int) else None
