"""The token-exact episode loop: one environment, one turn generator, one flat transcript of token ids.

    ids = tokenize(env.reset(row))                          # the prompt, mask 0
    repeat: turn = generate_turn(ids, budget)               # the engine's exact ids and log-probs, mask 1
            result = env.step(decode(turn), turn.token_ids)
            ids += tokenize(result.observation)             # tokenized once, mask 0, log-prob 0

The learner trains on exactly these ids: earlier turns are never decoded and re-rendered through the chat
template (a template that drops `<think>` from earlier turns, or a BPE merge across a turn boundary, would
change them). The generator is anything with `generate_turn` (`TurnGenerator`), so the loop does not depend on
the engine; `rlvr.envs.engine_turns` adapts a `GenerationEngine`.

Limits and end reasons (`Episode.end_reason`): the environment's own ("done", or e.g. "tool_error");
"max_turns" (the last allowed turn did not finish the episode); "turn_length" (a turn hit the per-turn token
limit: it is kept, but not stepped); "max_total_tokens" (the transcript cannot hold another turn or the next
observation; such an observation is not appended); "abort" (the engine aborted the turn); "env_error" (`env.step` raised: the
message is in `Episode.error`; the exception does not propagate).

Invariants: len(token_ids) == len(loss_mask) == len(logprobs) == len(policy_versions) <= max_total_tokens
(the prompt alone may exceed it: then no turn runs); loss_mask is 1 exactly on generated tokens, whose
log-probs are the engine's; every other position has log-prob 0 and policy version -1.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from rlvr.envs.base import Environment, Observation, StepResult
from rlvr.envs.turns import ObservationTokenizer


class GeneratedTurn(NamedTuple):
    """One policy turn: the engine's new ids and their log-probs, its finish reason and weights version."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int


class TurnGenerator(Protocol):
    """Generates one policy turn continuing `token_ids` (at most `max_new_tokens` new ids)."""

    def generate_turn(self, token_ids: list[int], max_new_tokens: int) -> GeneratedTurn: ...


@dataclass(frozen=True)
class EpisodeLimits:
    """Per-episode limits (module docstring)."""

    max_turns: int = 4
    max_tokens_per_turn: int = 256
    max_total_tokens: int = 2048


@dataclass
class TurnRecord:
    """One policy turn: its span [start, end) in the transcript, the observation span that followed, its
    version, finish reason, decoded text and the step's metrics."""

    start: int
    end: int
    policy_version: int
    finish_reason: str
    text: str
    observation_start: int = -1
    observation_end: int = -1
    observation_text: str = ""
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Episode:
    """The transcript and its per-token streams (module docstring), plus rewards, turns and the end reason."""

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    policy_versions: list[int]
    prompt_length: int
    turns: list[TurnRecord] = field(default_factory=list)
    reward_terms: dict[str, float] = field(default_factory=dict)
    end_reason: str = ""
    env_metrics: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    error: str | None = None

    def append(self, ids: list[int], generated: bool, logprobs: list[float] | None = None, version: int = -1) -> None:
        """Add a span: generated ids carry their log-probs and version, observation ids 0 and -1."""
        self.token_ids.extend(ids)
        self.loss_mask.extend([int(generated)] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        self.policy_versions.extend([version if generated else -1] * len(ids))

    def metrics(self) -> dict[str, float]:
        """Per-episode metrics: turns, tokens, observation-token share, the environment's counters."""
        completion = len(self.token_ids) - self.prompt_length
        generated = sum(self.loss_mask)
        return {
            "turns": float(len(self.turns)),
            "total_tokens": float(len(self.token_ids)),
            "generated_tokens": float(generated),
            "observation_tokens": float(completion - generated),
            "observation_token_share": (completion - generated) / completion if completion else 0.0,
            **{k: float(v) for k, v in self.env_metrics.items()},
        }


def start_episode(env: Environment, row: dict[str, Any], tokens: ObservationTokenizer) -> Episode:
    """A new episode: `env.reset(row)` tokenized as its prompt."""
    prompt = tokens.first(env.reset(row))
    ep = Episode([], [], [], [], prompt_length=len(prompt))
    ep.append(prompt, generated=False)
    return ep


def run_episode(
    env: Environment,
    row: dict[str, Any],
    generator: TurnGenerator,
    tokens: ObservationTokenizer,
    limits: EpisodeLimits = EpisodeLimits(),
) -> Episode:
    """Play one episode of `env` on `row` (module docstring)."""
    start = time.monotonic()
    ep = start_episode(env, row, tokens)
    ep.end_reason = _play(ep, env, generator, tokens, limits)
    ep.wall_s = time.monotonic() - start
    return ep


def _play(
    ep: Episode, env: Environment, generator: TurnGenerator, tokens: ObservationTokenizer, limits: EpisodeLimits
) -> str:
    """The turn loop; returns the end reason. A staged environment (rlvr/envs/jobs.py) is stepped through `step`,
    which runs its jobs in process; the collector drives the same helpers with the jobs in the verifier pool."""
    for turn_index in range(limits.max_turns):
        budget = turn_budget(ep, limits)
        if budget <= 0:
            return "max_total_tokens"
        turn = generator.generate_turn(list(ep.token_ids), budget)
        ended = add_turn(ep, turn, tokens, budget, limits)
        if ended:
            return ended
        try:
            result = env.step(ep.turns[-1].text, list(turn.token_ids))
        except Exception as e:  # trust boundary: a user environment's bug ends this episode, not the run
            ep.error = f"{type(e).__name__}: {e}"[:500]
            return "env_error"
        ended = add_step(ep, result, turn_index, tokens, limits)
        if ended:
            return ended
    return "max_turns"


def turn_budget(ep: Episode, limits: EpisodeLimits) -> int:
    """New tokens the next turn may have: min(max_tokens_per_turn, room left); <= 0 means no room."""
    return min(limits.max_tokens_per_turn, limits.max_total_tokens - len(ep.token_ids))


def add_turn(ep: Episode, turn: GeneratedTurn, tokens: ObservationTokenizer, budget: int, limits: EpisodeLimits) -> str:
    """Append a generated turn (its exact ids, log-probs and version); the end reason when it ends the episode
    (abort, or a turn cut at its budget), else ""."""
    _check_turn(turn, budget)
    record = TurnRecord(
        len(ep.token_ids),
        len(ep.token_ids) + len(turn.token_ids),
        turn.policy_version,
        turn.finish_reason,
        tokens.decode(turn.token_ids),
    )
    ep.append(list(turn.token_ids), generated=True, logprobs=list(turn.logprobs), version=turn.policy_version)
    ep.turns.append(record)
    if turn.finish_reason == "abort":
        return "abort"
    if turn.finish_reason == "length":
        return "turn_length" if budget == limits.max_tokens_per_turn else "max_total_tokens"
    return ""


def add_step(
    ep: Episode, result: StepResult, turn_index: int, tokens: ObservationTokenizer, limits: EpisodeLimits
) -> str:
    """Apply the environment's answer to the last turn: rewards and metrics, then the observation (tokenized
    once) unless the episode ends; returns the end reason, or "" to go on."""
    record = ep.turns[-1]
    turn_ids = ep.token_ids[record.start : record.end]
    record.metrics = dict(result.metrics)
    _add(ep.reward_terms, result.reward_terms)
    _add(ep.env_metrics, result.metrics)
    if result.done:
        return result.reason or "done"
    if turn_index >= limits.max_turns - 1:
        return "max_turns"
    observation = result.observation if result.observation is not None else Observation(text="")
    obs_ids = tokens.next(observation, turn_ids)
    if len(ep.token_ids) + len(obs_ids) >= limits.max_total_tokens:
        return "max_total_tokens"  # no room for the observation and at least one generated token
    record.observation_start, record.observation_end = len(ep.token_ids), len(ep.token_ids) + len(obs_ids)
    record.observation_text = observation.text
    ep.append(obs_ids, generated=False)
    return ""


def _check_turn(turn: GeneratedTurn, budget: int) -> None:
    if len(turn.logprobs) != len(turn.token_ids):
        raise ValueError(f"turn generator returned {len(turn.logprobs)} log-probs for {len(turn.token_ids)} tokens")
    if len(turn.token_ids) > budget:
        raise ValueError(f"turn generator returned {len(turn.token_ids)} tokens, more than the {budget} asked for")


def _add(total: dict[str, float], terms: dict[str, float]) -> None:
    for key, value in terms.items():
        total[key] = total.get(key, 0.0) + float(value)
