"""A verifier actor that dies while it holds episode tool jobs (issue 19, item 3), on a local Ray cluster with
real `VerifierActor`s: the episodes' tool runner replaces it as scoring does (`replace_verifiers`), answers its
jobs at once (lost, counted in `env/lost_jobs`) instead of waiting out their deadline, and the verifiers'
metrics skip a dead actor instead of raising. Every row is an episode, so scoring never runs here."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from test_collector_episodes import _ENV, EnvStream, FakeTurnEngine, G, tokenizer  # noqa: F401 (fixture)

from rlvr.config import ExperimentConfig
from rlvr.envs.settings import EnvSettings, observation_tokenizer
from rlvr.orchestration.accounting import PromptLedger
from rlvr.orchestration.collector import VerifierScorer
from rlvr.orchestration.episodes import ActorToolRunner, EpisodeRunner
from rlvr.orchestration.rollouts import RolloutFeeder

SLEEP = '<tool_call>{"name": "python", "arguments": {"code": "import time; time.sleep(30)"}}</tool_call>'


def _wait_dead(actor: Any) -> None:
    import ray

    while True:
        try:
            ray.get(actor.metrics.remote(), timeout=60)
        except ray.exceptions.RayActorError:
            return


def test_a_dead_verifier_actor_is_replaced_and_its_jobs_fail_at_once(tokenizer, ray_cluster) -> None:  # noqa: F811
    import ray

    from rlvr.orchestration.actors import VerifierActor

    cfg = ExperimentConfig()
    cfg.rewards.num_workers = 1

    def make() -> list:
        made.append(1)
        return [VerifierActor.options(num_cpus=0).remote(cfg)]

    made: list[int] = []
    actors = SimpleNamespace(verifiers=make(), factory=SimpleNamespace(verifiers=make))
    first = actors.verifiers[0]
    tools = ActorToolRunner(actors, timeout_s=60.0, per_actor=2 * G)
    settings = EnvSettings.from_config(
        SimpleNamespace(**{**_ENV, "tools": ["python"], "tool_timeout_s": 60.0, "max_tokens_per_turn": 256})
    )
    runner = EpisodeRunner(settings, observation_tokenizer(tokenizer, chat_template=False), tools)
    engine = FakeTurnEngine(tokenizer)
    engine._text = lambda req: (  # a tool call that runs long, then an answer whatever came back
        "\\boxed{0}" if "<tool_response>" in tokenizer.decode(req.prompt_token_ids) else SLEEP
    )
    feeder = RolloutFeeder([engine], EnvStream(tokenizer, 1), PromptLedger(), timeout_s=120.0, episodes=runner)
    try:
        feeder.top_up(1, limit=1)
        assert not feeder.poll()  # first turns back: their tool calls run (30 s) on the first actor
        assert len(runner.jobs) == G and not runner.queued
        ray.kill(first)
        _wait_dead(first)
        assert VerifierScorer(actors, 60.0).metrics() == {}  # the dead actor is skipped, nothing raised
        [group] = feeder.wait_groups(1, deadline=float("inf"))  # far sooner than the jobs' own deadline
        assert len(made) == 2 and actors.verifiers[0] is not first  # replaced once
        assert tools.lost == G and runner.metrics()["env/lost_jobs"] == G and runner.counts["lost_jobs"] == 0
        for s in group.samples:
            assert s.metadata["end_reason"] == "done" and s.metadata["episode_metrics"]["tool_error/crash"] == 1.0
            assert "verifier actor died" in s.metadata["transcript"][1]["text"]
        assert "reward/pool/jobs" in VerifierScorer(actors, 60.0).metrics()  # the replacement answers
    finally:
        for v in actors.verifiers:
            ray.kill(v)
