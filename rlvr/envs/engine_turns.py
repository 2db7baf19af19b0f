"""Adapters between the episode loop and the rest of the trainer: a `GenerationEngine` as a `TurnGenerator`,
and an `Episode` as a `Sample` record.

`EngineTurnGenerator` only uses the engine protocol (`generate` with `prompt_token_ids`), so it works with the
transformers engine and, unchanged, with vLLM. The collector will later drive many episodes concurrently through
`submit`/`poll` instead of one blocking `generate` per turn.

`episode_to_sample`: the prompt is the first observation; the completion is everything after it (policy turns and
observations), `logprobs` covers every completion token (0 on observation tokens), and
`metadata["completion_loss_mask"]` says which completion tokens are the policy's; `completion_text` is the
policy turns' texts joined (as decoded for the environment, special tokens kept), observations left out. Packing must honour that mask
before multi-turn samples are trained on (docs/multi-turn.md, "What remains").
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rlvr.algorithms.policy_tokens import EPISODE_MARKER
from rlvr.envs.episode import Episode, GeneratedTurn
from rlvr.rollout.base import GenerationEngine
from rlvr.types import FinishReason, PromptRequest, Sample, SamplingParams


class EngineTurnGenerator:
    """`generate_turn` through `engine.generate` with one sample (module docstring)."""

    def __init__(
        self, engine: GenerationEngine, sampling: SamplingParams, prompt_id: str = "episode", timeout_s: float = 600.0
    ) -> None:
        self.engine = engine
        self.sampling = sampling
        self.prompt_id = prompt_id
        self.timeout_s = timeout_s
        self._turns = 0

    def generate_turn(self, token_ids: list[int], max_new_tokens: int) -> GeneratedTurn:
        sampling = replace(
            self.sampling,
            max_new_tokens=max_new_tokens,
            seed=None if self.sampling.seed is None else self.sampling.seed + 1000 * self._turns,
        )
        request = PromptRequest(f"{self.prompt_id}:turn{self._turns}", list(token_ids), 1, sampling)
        self._turns += 1
        [sample] = self.engine.generate([request], timeout_s=self.timeout_s)
        return GeneratedTurn(
            list(sample.completion_token_ids), list(sample.logprobs), sample.finish_reason, sample.version_start
        )


_FINISH: dict[str, FinishReason] = {
    "turn_length": "length",
    "max_total_tokens": "length",
    "prompt_too_long": "length",
    "abort": "abort",
}


def transcript(ep: Episode) -> list[dict[str, str]]:
    """The episode's turns for people (samples.jsonl): {"role": "assistant", "text"} per policy turn, and
    {"role": "tool", "text"} per observation that followed one (the observation's content)."""
    out: list[dict[str, str]] = []
    for t in ep.turns:
        out.append({"role": "assistant", "text": t.text})
        if t.observation_start >= 0:
            out.append({"role": "tool", "text": t.observation_text})
    return out


def episode_to_sample(
    ep: Episode,
    prompt_id: str,
    sample_index: int = 0,
    engine_id: int = 0,
    metadata: dict[str, Any] | None = None,
    admitted: int = -1,
) -> Sample:
    """The episode as a `Sample` (module docstring); turn records and metrics go to metadata. Its versions are
    its turns' oldest and newest; an episode without a turn (its prompt left no room, or its environment failed
    to start) has the policy version it was `admitted` under, so it is not stale by construction."""
    versions = [t.policy_version for t in ep.turns] or [admitted]
    cut = ep.prompt_length
    meta = {
        **(metadata or {}),
        EPISODE_MARKER: True,  # what makes this an episode's record (no data column can set it)
        "completion_loss_mask": ep.loss_mask[cut:],
        "end_reason": ep.end_reason,
        "error": ep.error,
        "reward_terms": dict(ep.reward_terms),
        "episode_metrics": ep.metrics(),
        "turns": [(t.start - cut, t.end - cut, t.policy_version, t.finish_reason) for t in ep.turns],
        "transcript": transcript(ep),
    }
    return Sample(
        prompt_id=prompt_id,
        sample_index=sample_index,
        prompt_token_ids=ep.token_ids[:cut],
        completion_token_ids=ep.token_ids[cut:],
        completion_text="".join(t.text for t in ep.turns),
        logprobs=ep.logprobs[cut:],
        finish_reason=_FINISH.get(ep.end_reason, "stop"),
        version_start=min(versions),
        version_end=max(versions),
        engine_id=engine_id,
        metadata=meta,
    )
