"""Small pieces of the vLLM engine that need no engine state: importing vllm with the install hint, the per-version
prefix-cache salt, a stat logger that keeps vLLM's latest scheduler stats, and the default `max_model_len`.
vllm itself is imported only inside `import_vllm`.
"""

from __future__ import annotations

from typing import Any

from rlvr.config import ExperimentConfig
from rlvr.config.validation import EPISODE_TASKS, runs_episodes  # noqa: F401  (the config layer owns them)


def import_vllm() -> Any:
    """Import vllm or fail with the install hint (vllm is the optional `gpu` extra)."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError("the vLLM engine (rollout.backend=vllm) needs vllm==0.26.0: pip install 'rlvr[gpu]'") from exc
    return vllm


def cache_salt(version: int) -> str:
    """The prefix-cache salt of requests admitted under policy `version`."""
    return f"rlvr-v{version}"


class SchedulerStatsTap:
    """A vLLM stat logger that only keeps the latest SchedulerStats (running, waiting, KV usage)."""

    def __init__(self, sink: dict[str, float]) -> None:
        self.sink = sink

    def record(
        self, scheduler_stats: Any, iteration_stats: Any = None, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        if scheduler_stats is not None:
            self.sink["vllm_running"] = float(scheduler_stats.num_running_reqs)
            self.sink["vllm_waiting"] = float(scheduler_stats.num_waiting_reqs)
            self.sink["kv_usage"] = float(scheduler_stats.kv_cache_usage)

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass


def default_max_model_len(model_path: str, cfg: ExperimentConfig) -> int | None:
    """`rollout.vllm_max_model_len`, else max prompt + max new tokens (smaller KV reservations per sequence), or
    `env.max_total_tokens` where episodes run (a whole transcript is one turn's prompt); capped by the model's
    positions."""
    if cfg.rollout.vllm_max_model_len > 0:
        return cfg.rollout.vllm_max_model_len
    wanted = cfg.data.max_prompt_tokens + cfg.generation.max_new_tokens
    if runs_episodes(cfg):
        wanted = max(wanted, cfg.env.max_total_tokens)
    try:
        from transformers import AutoConfig

        limit = getattr(
            AutoConfig.from_pretrained(model_path, trust_remote_code=cfg.model.trust_remote_code),
            "max_position_embeddings",
            None,
        )
    except (OSError, ValueError):
        return None
    return min(wanted, limit) if limit else wanted
