"""Records that cross process boundaries (docs/design.md, "Records").

Plain, picklable dataclasses with no torch/ray imports at module level, so that every process (driver,
engines, verifier workers, learners) can exchange them cheaply. Tensors appear only in `PackedBatch`,
which is built by `rlvr.algorithms.packing` on the learner side.

Invariants:
- `prompt_id` is stable across restarts: "<dataset>:<row>:<epoch>".
- `Sample.logprobs` has one entry per completion token (engine log-probs after temperature).
- Staleness of a sample = learner step at training time - `version_start`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from rlvr.config.sections import GenerationConfig

FinishReason = Literal["stop", "length", "abort"]
RewardStatus = Literal["ok", "timeout", "error"]


def make_prompt_id(dataset: str, row: int, epoch: int) -> str:
    """The stable id of one pull of a dataset row: dataset name + row index + epoch."""
    return f"{dataset}:{row}:{epoch}"


_GENERATION = GenerationConfig()  # the defaults below are the config section's: one source, no copies


@dataclass
class SamplingParams:
    """Sampling settings carried with each request: the sampling fields of `GenerationConfig` (same names,
    defaults read from it) plus a per-request seed."""

    temperature: float = _GENERATION.temperature
    top_p: float = _GENERATION.top_p
    top_k: int = _GENERATION.top_k
    max_new_tokens: int = _GENERATION.max_new_tokens
    stop_strings: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None

    @classmethod
    def from_config(cls, generation: GenerationConfig, seed: int | None = None, **overrides: Any) -> SamplingParams:
        """The sampling settings of `cfg.generation` (lists copied), with `overrides` applied."""
        values: dict[str, Any] = {f.name: getattr(generation, f.name) for f in fields(cls) if f.name != "seed"}
        values.update(stop_strings=list(generation.stop_strings), stop_token_ids=list(generation.stop_token_ids))
        return cls(**{**values, **overrides}, seed=seed)


@dataclass
class PromptRequest:
    """One prompt sent to a generation engine, to be sampled `num_samples` times."""

    prompt_id: str
    prompt_token_ids: list[int]
    num_samples: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    metadata: dict[str, Any] = field(default_factory=dict)
    is_eval: bool = False
    prompt_text: str = ""


@dataclass
class Sample:
    """One completion of one prompt, as returned by an engine."""

    prompt_id: str
    sample_index: int
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    completion_text: str
    logprobs: list[float]
    finish_reason: FinishReason
    version_start: int
    version_end: int
    engine_id: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    is_eval: bool = False
    prompt_text: str = ""

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.completion_token_ids)


@dataclass
class RewardResult:
    """The score of one completion (docs/design.md, Records).

    `total` is the weighted sum over non-None scores, None when every score is None; `correct` says whether
    the primary verifier reached its maximum (1.0 for built-in verifiers), None when it could not score.
    """

    scores: dict[str, float | None]
    total: float | None
    correct: bool | None = None
    status: RewardStatus = "ok"
    error: str | None = None
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "scores": dict(self.scores),
            "total": self.total,
            "correct": self.correct,
            "status": self.status,
            "error": self.error,
            "elapsed_s": self.elapsed_s,
        }


@dataclass
class Group:
    """The G samples of one prompt, their rewards and (once computed) advantages."""

    prompt_id: str
    samples: list[Sample]
    rewards: list[RewardResult] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    loss_masks: list[bool] = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        return len(self.samples)


@dataclass
class MicroBatch:
    """Packed rows for one forward/backward pass. Tensors are [num_rows, T], T <= pack_length (the longest row of
    the micro-batch, rounded up to the packer's pad multiple), unless noted.

    input_ids, position_ids (restart at 0 per sample), advantages (per token, 0 off-loss), old_logprobs
    (engine log-probs, aligned so that position t holds log p(token t | tokens < t)), loss_mask (1 on
    completion tokens that count), sample_ids (-1 on padding), cu_seqlens (list per row of boundaries).
    """

    input_ids: Any
    position_ids: Any
    advantages: Any
    engine_logprobs: Any
    loss_mask: Any
    sample_ids: Any
    cu_seqlens: list[list[int]]
    num_samples: int = 0
    num_tokens: int = 0


@dataclass
class PackedBatch:
    """Per learner rank: its micro-batches plus the global normalisers of the optimizer step."""

    micro_batches: list[MicroBatch]
    global_num_loss_tokens: int
    global_num_samples: int
    pack_length: int
    metrics: dict[str, float] = field(default_factory=dict)
