"""Per-step rollout and reward metrics, and samples.jsonl rows (plain dicts of floats, key namespaces of
docs/design.md, Metrics). Eval metrics are `rlvr.eval.runner`'s (see `rlvr.orchestration.evaluation.eval_metrics`)."""

from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Any

from rlvr.telemetry.episodes import episode_record
from rlvr.types import Group


def _reward_metrics(groups: list[Group], prefix: str) -> dict[str, float]:
    m: dict[str, float] = {}
    per_fn: dict[str, list[float]] = defaultdict(list)
    totals, correct, statuses = [], [], defaultdict(int)
    for g in groups:
        for r in g.rewards:
            statuses[r.status] += 1
            if r.total is not None:
                totals.append(r.total)
            if r.correct is not None:
                correct.append(1.0 if r.correct else 0.0)
            for k, v in r.scores.items():
                if v is not None:
                    per_fn[k].append(v)
    m[f"{prefix}/total_mean"] = mean(totals) if totals else 0.0
    m[f"{prefix}/correct_rate"] = mean(correct) if correct else 0.0
    for k, vals in per_fn.items():
        m[f"{prefix}/{k}_mean"] = mean(vals)
    n = max(sum(statuses.values()), 1)
    m[f"{prefix}/timeout_rate"] = statuses.get("timeout", 0) / n
    m[f"{prefix}/error_rate"] = statuses.get("error", 0) / n
    return m


def rollout_metrics(groups: list[Group], learner_version: int) -> dict[str, float]:
    """`reward/`, `rollout/` metrics of the groups resolved this step (before filtering)."""
    if not groups:
        return {}
    samples = [s for g in groups for s in g.samples]
    lengths = [len(s.completion_token_ids) for s in samples]
    staleness = [learner_version - s.version_start for s in samples]
    m = _reward_metrics(groups, "reward")
    m.update(
        {
            "rollout/completion_len_mean": mean(lengths),
            "rollout/completion_len_max": float(max(lengths)),
            "rollout/completion_len_min": float(min(lengths)),
            "rollout/prompt_len_mean": mean(len(s.prompt_token_ids) for s in samples),
            "rollout/stop_rate": mean(1.0 if s.finish_reason == "stop" else 0.0 for s in samples),
            "rollout/truncated_rate": mean(1.0 if s.finish_reason == "length" else 0.0 for s in samples),
            "rollout/staleness_mean": mean(staleness),
            "rollout/staleness_max": float(max(staleness)),
            "rollout/inflight_updated_frac": mean(1.0 if s.version_end != s.version_start else 0.0 for s in samples),
            "rollout/num_groups": float(len(groups)),
            "rollout/num_samples": float(len(samples)),
        }
    )
    return m


def sample_records(groups: list[Group], step: int, limit: int) -> list[dict[str, Any]]:
    """Rows of samples.jsonl (docs/design.md, Run directory) for the first `limit` samples."""
    out = []
    for g in groups:
        for s, r, adv in zip(g.samples, g.rewards, g.advantages or [0.0] * g.num_samples):
            if len(out) >= limit:
                return out
            out.append(
                {
                    "step": step,
                    "prompt_id": s.prompt_id,
                    "prompt": s.prompt_text,
                    "completion": s.completion_text,
                    "completion_len": len(s.completion_token_ids),
                    "scores": r.scores,
                    "total": r.total,
                    "correct": r.correct,
                    "advantage": adv,
                    "finish_reason": s.finish_reason,
                    "version_start": s.version_start,
                    "version_end": s.version_end,
                    **episode_record(s.metadata),  # multi-turn: the turns, tool calls and observations apart
                }
            )
    return out
