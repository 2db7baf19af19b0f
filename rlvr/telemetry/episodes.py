"""Per-step metrics of multi-turn episodes (docs/multi-turn.md), from the `episode_to_sample` records of a step.

Keys (only when the step has episodes), all under `env/`:
- `episodes`: how many;
- `<metric>_mean` per episode of every `Episode.metrics()` counter: `turns`, `tool_calls`, `tool_errors`,
  `tool_latency_s`, `observation_tokens`, `generated_tokens`, `observation_token_share`, `answered`, ... and one
  `tool_error/<reason>_mean` per failure reason seen (a counter absent from an episode counts 0 there);
- `tool_latency_s_per_call`: total tool latency / total tool calls;
- `end_reason/<reason>`: how many episodes ended for that reason ("done", "max_turns", "turn_length",
  "prompt_too_long", "env_error", ...).

`EpisodeRunner.metrics` adds `env/restarts` and `env/lost_jobs` (since the start of the run; the collector logs
them with each step once episodes have run).

`episode_record` adds an episode's turns to its samples.jsonl row.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def episode_metrics(groups: list[Any]) -> dict[str, float]:
    """The step's `env/` metrics (module docstring); {} when no sample is an episode."""
    records = [s.metadata for g in groups for s in g.samples if "episode_metrics" in s.metadata]
    if not records:
        return {}
    n = len(records)
    totals: Counter[str] = Counter()
    for meta in records:
        for key, value in meta["episode_metrics"].items():
            totals[key] += float(value)
    out = {"env/episodes": float(n)}
    out.update({f"env/{key}_mean": value / n for key, value in sorted(totals.items())})
    if totals.get("tool_calls"):
        out["env/tool_latency_s_per_call"] = totals["tool_latency_s"] / totals["tool_calls"]
    for reason, count in sorted(Counter(str(meta.get("end_reason", "")) for meta in records).items()):
        out[f"env/end_reason/{reason}"] = float(count)
    return out


def episode_record(metadata: dict[str, Any]) -> dict[str, Any]:
    """The extra fields of an episode's samples.jsonl row: `turns` ([{role: assistant|tool, text}], policy turns
    and the observations after them), `end_reason`, `reward_terms` and `episode_metrics`; {} for other samples."""
    if "transcript" not in metadata:
        return {}
    return {
        "turns": list(metadata["transcript"]),
        "end_reason": metadata.get("end_reason"),
        "reward_terms": metadata.get("reward_terms"),
        "episode_metrics": metadata.get("episode_metrics"),
    }
