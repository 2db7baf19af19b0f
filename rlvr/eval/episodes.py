"""`rlvr eval` on rows routed to an environment: their k samples are episodes (docs/multi-turn.md), run with the
collector's `EpisodeRunner` over the engine's own non-blocking `submit`/`poll` and tool jobs in a local
`VerifierPool`; rows without an environment are generated as before. Episode samples are scored by their
environment's reward terms (`sample_episode_reward`), the others by the scorer.

Invariant: one sample per (request, sample index), in request order, as `Generator.generate` returns them.
"""

from __future__ import annotations

import time
from typing import Any

from rlvr.types import PromptRequest, Sample


class EpisodeGenerator:
    """`generate(requests)` where env rows run episodes (module docstring); `close` stops the tool pool."""

    def __init__(self, engine: Any, cfg: Any, tokenizer: Any) -> None:
        from rlvr.envs.settings import EnvSettings, observation_tokenizer
        from rlvr.orchestration.episodes import EpisodeRunner

        self.engine, self.cfg = engine, cfg
        self.pool: Any = None  # started on the first env row
        self.tools = _LazyPoolTools(self)
        tokens = observation_tokenizer(tokenizer, cfg.data.apply_chat_template, cfg.data.system_prompt)
        self.runner = EpisodeRunner(EnvSettings.from_config(cfg.env), tokens, self.tools)

    def generate(self, requests: list[PromptRequest], timeout_s: float = 600) -> list[Sample]:
        plain = [r for r in requests if self.runner.route(r) is None]
        episodes = [r for r in requests if self.runner.route(r) is not None]
        samples = list(self.engine.generate(plain, timeout_s=timeout_s)) if plain else []
        turns: list[PromptRequest] = []
        for r in episodes:
            turns += self.runner.start(r, str(self.runner.route(r)), 0)
        expected = {r.prompt_id for r in episodes}
        done: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while True:
            if turns:
                self.engine.submit(turns)
            turns = [t for s in self.engine.poll() if self.runner.owns(s.prompt_id) for t in self.runner.on_sample(s)]
            turns += self.runner.poll_jobs()
            for g in self.runner.take_finished():
                samples += g.samples
                done.add(g.prompt_id)
            if done >= expected:
                return samples
            if time.monotonic() > deadline:
                raise TimeoutError(f"episodes of {len(expected - done)} eval prompts unfinished after {timeout_s}s")
            if not turns:
                time.sleep(0.005)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


class _LazyPoolTools:
    """The tool runner of an `EpisodeGenerator`: its verifier pool starts with the first job."""

    def __init__(self, owner: EpisodeGenerator) -> None:
        self.owner = owner

    def submit(self, job_id: str, job: Any) -> None:
        from rlvr.orchestration.episodes import PoolToolRunner
        from rlvr.rewards.pool import VerifierPool

        if self.owner.pool is None:
            self.owner.pool = VerifierPool(self.owner.cfg.rewards)
        PoolToolRunner(self.owner.pool).submit(job_id, job)

    def poll(self) -> list[tuple[str, Any]]:
        from rlvr.orchestration.episodes import PoolToolRunner

        return PoolToolRunner(self.owner.pool).poll() if self.owner.pool is not None else []
