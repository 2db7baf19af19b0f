"""Sampled evaluation: generate k completions per prompt, score them, and summarise (pass@k, maj@k, breakdowns).

The one code path of both `rlvr eval` and the trainer's in-training eval, so that a checkpoint evaluated
offline gives the numbers the run logged at that step (same requests and seeds -> same samples -> same
scores). `evaluate` is `generate` + `summarize`; a driver that must not block on generation can instead
`submit`/`poll` the engine itself and pass the samples to `summarize`.

Summary keys carry no prefix (the trainer logs them under `eval/`):
`num_prompts`, `num_samples`, `pass@k`, `maj@k`, `correct_rate`, `reward/total_mean`, `reward/<fn>_mean`,
`completion_len_{mean,min,p50,p90,max}`, `stop_rate`, `truncated_rate`, `abort_rate`, `reward_error_rate`, and
per dataset `dataset/<name>/{pass@k,maj@k,correct_rate,reward/total_mean,reward/<fn>_mean}`.

Invariants: rows come in request order, then `sample_index` order; an unscored completion (`correct` None)
counts as incorrect in pass@k and correct_rate; a k larger than the samples per prompt is left out.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from rlvr.eval.metrics import (
    AnswerExtractor,
    default_answer_extractor,
    finish_rates,
    group_metrics,
    length_stats,
    mean_scores,
)
from rlvr.types import Group, PromptRequest, RewardResult, Sample

ScoreItem = tuple[str, dict, "list[int] | None"]
"""(completion_text, metadata, completion_token_ids): one row for a scorer (as `VerifierPool.score_many`)."""


class Generator(Protocol):
    """The part of the engine protocol (rlvr.rollout.base.GenerationEngine) that eval needs."""

    def generate(self, requests: list[PromptRequest], timeout_s: float = 600) -> list[Sample]:
        """Submit and wait for exactly these prompts; samples in request order."""
        ...


ScorerLike = Any
"""A `VerifierPool` (`score_many(items)`), a `RewardScorer` (`score(text, metadata, token_ids)`), or a callable
`items -> list[RewardResult]` (e.g. a function calling the trainer's verifier actor)."""


def score_samples(scorer: ScorerLike, samples: Sequence[Sample]) -> list[RewardResult]:
    """One `RewardResult` per sample, in order, from any of the accepted scorer kinds."""
    items: list[ScoreItem] = [
        (s.completion_text, {**s.metadata, "finish_reason": s.finish_reason}, list(s.completion_token_ids))
        for s in samples
    ]
    if hasattr(scorer, "score_many"):
        results = list(scorer.score_many(items))
    elif hasattr(scorer, "score"):
        results = [scorer.score(text, md, ids) for text, md, ids in items]
    elif callable(scorer):
        results = list(scorer(items))
    else:
        raise TypeError(f"scorer must have score_many/score or be callable, got {type(scorer).__name__}")
    if len(results) != len(samples):
        raise RuntimeError(f"scorer returned {len(results)} results for {len(samples)} samples")
    return results


def dataset_of(sample: Sample) -> str:
    """The dataset name of a sample: `metadata["dataset"]`, else the prompt id's "<dataset>:<row>:<epoch>" head."""
    name = sample.metadata.get("dataset")
    if not name:
        parts = sample.prompt_id.rsplit(":", 2)
        name = parts[0] if len(parts) == 3 else "default"
    return str(name).replace("/", "_")


def build_rows(
    samples: Sequence[Sample], results: Sequence[RewardResult], extract_answer: AnswerExtractor | None
) -> list[dict[str, Any]]:
    """The scored-completion records (one per sample) written to completions JSONL / eval samples."""
    rows = []
    for sample, result in zip(samples, results, strict=True):
        answer = extract_answer(sample.completion_text) if extract_answer is not None else None
        rows.append(
            {
                "prompt_id": sample.prompt_id,
                "sample_index": sample.sample_index,
                "dataset": dataset_of(sample),
                "prompt": sample.prompt_text,
                "completion": sample.completion_text,
                "answer": answer if answer is None or isinstance(answer, (str, int, float)) else str(answer),
                "ground_truth": sample.metadata.get("ground_truth"),
                "scores": dict(result.scores),
                "total": result.total,
                "correct": result.correct,
                "status": result.status,
                "error": result.error,
                "finish_reason": sample.finish_reason,
                "completion_len": len(sample.completion_token_ids),
                "version": sample.version_start,
            }
        )
    return rows


def _summarize_rows(rows: Sequence[Mapping[str, Any]], ks: Sequence[int], majority: bool) -> dict[str, float]:
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row["prompt_id"]].append(row)
    out: dict[str, float] = group_metrics(groups, ks, majority=majority)
    out["correct_rate"] = statistics.fmean(bool(r["correct"]) for r in rows)
    totals = [r["total"] for r in rows if r["total"] is not None]
    if totals:
        out["reward/total_mean"] = statistics.fmean(totals)
    for name, value in mean_scores(r["scores"] for r in rows).items():
        out[f"reward/{name}_mean"] = value
    return out


def summarize(
    samples: Sequence[Sample],
    results: Sequence[RewardResult],
    ks: Sequence[int] = (1,),
    extract_answer: AnswerExtractor | None = default_answer_extractor,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Summary metrics and scored rows of already generated and scored samples (module docstring keys)."""
    rows = build_rows(samples, results, extract_answer)
    if not rows:
        return {"num_prompts": 0.0, "num_samples": 0.0}, rows
    majority = extract_answer is not None
    summary: dict[str, float] = {
        "num_prompts": float(len({r["prompt_id"] for r in rows})),
        "num_samples": float(len(rows)),
    }
    summary.update(_summarize_rows(rows, ks, majority))
    for name, value in length_stats([r["completion_len"] for r in rows]).items():
        summary[f"completion_len_{name}"] = value
    summary.update(finish_rates(r["finish_reason"] for r in rows))
    summary["reward_error_rate"] = statistics.fmean(r["status"] != "ok" for r in rows)
    by_dataset: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_dataset[row["dataset"]].append(row)
    for name in sorted(by_dataset):
        for key, value in _summarize_rows(by_dataset[name], ks, majority).items():
            summary[f"dataset/{name}/{key}"] = value
    return summary, rows


def summarize_groups(
    groups: Sequence[Group],
    ks: Sequence[int] = (1,),
    prefix: str = "eval/",
    extract_answer: AnswerExtractor | None = default_answer_extractor,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """`summarize` for scored groups (the trainer's in-training eval), keys prefixed with `prefix`."""
    samples = [s for g in groups for s in g.samples]
    results = [r for g in groups for r in g.rewards]
    if len(samples) != len(results):
        raise ValueError(f"groups hold {len(samples)} samples but {len(results)} rewards: score them first")
    summary, rows = summarize(samples, results, ks, extract_answer)
    return {prefix + k: v for k, v in summary.items()}, rows


def evaluate(
    engine: Generator,
    requests: Sequence[PromptRequest],
    scorer: ScorerLike,
    ks: Sequence[int] = (1,),
    extract_answer: AnswerExtractor | None = default_answer_extractor,
    timeout_s: float = 600.0,
    on_samples: Callable[[list[Sample]], None] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Generate `num_samples` completions per request with `engine`, score them, and summarise.

    Returns (summary, rows): see the module docstring for the summary keys; rows are JSON-ready dicts, one per
    completion. `extract_answer=None` turns maj@k off. `on_samples` sees the raw samples (e.g. to log them).
    """
    requests = list(requests)
    if not requests:
        return {"num_prompts": 0.0, "num_samples": 0.0}, []
    samples = engine.generate(requests, timeout_s=timeout_s)
    order = {r.prompt_id: i for i, r in enumerate(requests)}
    samples = sorted(samples, key=lambda s: (order.get(s.prompt_id, len(order)), s.sample_index))
    for sample in samples:  # engines copy request fields over; be robust to ones that do not
        if not sample.prompt_text:
            sample.prompt_text = requests[order[sample.prompt_id]].prompt_text if sample.prompt_id in order else ""
        if not sample.metadata and sample.prompt_id in order:
            sample.metadata = dict(requests[order[sample.prompt_id]].metadata)
    if on_samples is not None:
        on_samples(samples)
    results = score_with_episodes(scorer, samples)
    return summarize(samples, results, ks, extract_answer)


def score_with_episodes(scorer: ScorerLike, samples: Sequence[Sample]) -> list[RewardResult]:
    """`score_samples`, except that an episode's record (multi-turn) is scored by its environment's reward terms."""
    from rlvr.orchestration.episodes import is_episode, sample_episode_reward

    plain = [s for s in samples if not is_episode(s)]
    scored = dict(zip(map(id, plain), score_samples(scorer, plain) if plain else []))
    return [scored[id(s)] if id(s) in scored else sample_episode_reward(s) for s in samples]
