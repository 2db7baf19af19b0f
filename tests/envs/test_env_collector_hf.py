"""Episodes through the collector's feeder on the real transformers engine (tiny random Qwen2 on CPU) with tool
jobs in a real verifier pool: every turn is a non-blocking submit/poll of the transcript so far, a weight update
between turns stamps the later turns with the new version, and the learner-side record holds exactly the
engine's ids and log-probs plus the observation ids."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import Qwen2ForCausalLM

from rlvr.envs.base import Observation, StepResult
from rlvr.envs.episode import EpisodeLimits
from rlvr.envs.jobs import Job, PendingStep, execute_tool
from rlvr.envs.settings import EnvSettings
from rlvr.envs.tool_calls import ToolCall, ToolResult
from rlvr.envs.turns import ObservationTokenizer
from rlvr.orchestration.accounting import PromptLedger
from rlvr.orchestration.episodes import EpisodeRunner, PoolToolRunner
from rlvr.orchestration.rollouts import RolloutFeeder
from rlvr.rewards.pool import VerifierPool
from rlvr.rewards.scorer import RewardsSettings
from rlvr.rollout.hf_engine import TransformersEngine
from rlvr.types import PromptRequest, SamplingParams

G = 2


class CalculatorEnv:
    """Staged: the first turn gets the calculator's answer to 6*7 (a job in the pool), the second ends it."""

    def __init__(self, **_: Any) -> None:
        self.steps = 0

    def reset(self, row: dict[str, Any]) -> Observation:
        return Observation(messages=[{"role": "user", "content": str(row["prompt"])}])

    def begin_step(self, turn_text: str, turn_token_ids: list[int]) -> StepResult | PendingStep:
        self.steps += 1
        if self.steps == 2:
            return StepResult(None, {"calc": 1.0}, done=True, reason="done")
        call = ToolCall("calculator", {"expression": "6*7"})
        return PendingStep([Job(execute_tool, (("calculator",), 200, 2.0, call, {}), 2.0)])

    def end_step(self, pending: PendingStep, outputs: list[Any]) -> StepResult:
        [result] = outputs
        assert isinstance(result, ToolResult) and result.ok
        return StepResult(Observation(text=f"<tool_response>\n{result.content}\n</tool_response>"), {"tool": 0.5})

    def step(self, turn_text: str, turn_token_ids: list[int]) -> StepResult:
        raise AssertionError("the collector runs the staged steps")


class _Call:
    def __init__(self, fn: Any) -> None:
        self.remote = fn


class LocalEngine:
    """The engine's submit/poll/stats as the feeder calls them (`handle.x.remote(...)`), in process."""

    def __init__(self, engine: TransformersEngine) -> None:
        self.engine = engine
        self.submit, self.poll, self.stats = _Call(engine.submit), _Call(engine.poll), _Call(engine.stats)


class GatedTools:
    """Holds the job answers back until `open` (so the test knows which turns came before the update)."""

    def __init__(self, inner: PoolToolRunner) -> None:
        self.inner, self.open = inner, False

    def submit(self, job_id: str, job: Job) -> None:
        self.inner.submit(job_id, job)

    def poll(self) -> list:
        return self.inner.poll() if self.open else []


class OneRowStream:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.done, self.counters = tokenizer, False, {}

    def next_request(self) -> PromptRequest | None:
        if self.done:
            return None
        self.done = True
        stops = [i for i in range(len(self.tokenizer)) if i % 4]  # a random model seldom emits EOS
        sampling = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, seed=5, stop_token_ids=stops)
        row = {"prompt": "What is 6*7?", "env": f"{__name__}:CalculatorEnv", "verifier": "calc"}
        return PromptRequest("calc:0:0", [1], G, sampling, metadata=row)


def test_episodes_on_the_transformers_engine_through_the_feeder(
    engine: TransformersEngine, chat_tokenizer: Any, obs_tokens: ObservationTokenizer
) -> None:
    weights = {
        k: v.clone() for k, v in Qwen2ForCausalLM.from_pretrained(engine.tokenizer.name_or_path).state_dict().items()
    }
    settings = EnvSettings(  # the row names the config's import path (the data alone may not import one)
        f"{__name__}:CalculatorEnv", limits=EpisodeLimits(max_turns=3, max_tokens_per_turn=24, max_total_tokens=512)
    )
    with VerifierPool(RewardsSettings(num_workers=1, timeout_s=5.0)) as pool:
        tools = GatedTools(PoolToolRunner(pool))
        runner = EpisodeRunner(settings, obs_tokens, tools)
        ledger = PromptLedger()
        feeder = RolloutFeeder([LocalEngine(engine)], OneRowStream(chat_tokenizer), ledger, 120.0, episodes=runner)
        version = engine.policy_version
        assert feeder.top_up(1, limit=1) == 1
        while len(runner.jobs) < G:  # every first turn back, its tool call waiting in the pool
            assert not feeder.poll()
        engine.load_weights(weights.items(), version + 1)  # a weight update between the turns
        tools.open = True
        groups = feeder.wait_groups(1, deadline=float("inf"))
    [group] = groups
    assert [r.total for r in group.rewards] == [1.5, 1.5] and [r.correct for r in group.rewards] == [True, True]
    for s in group.samples:
        (s1, e1, v1, _), (s2, e2, v2, _) = s.metadata["turns"]
        assert (v1, v2) == (version, version + 1) and (s.version_start, s.version_end) == (version, version + 1)
        full = s.prompt_token_ids + s.completion_token_ids
        cut = len(s.prompt_token_ids)
        observation = obs_tokens.next(
            Observation(text="<tool_response>\n42\n</tool_response>"), full[cut + s1 : cut + e1]
        )
        assert s.completion_token_ids[e1:s2] == observation  # tokenized once, appended after the exact turn ids
        mask = s.metadata["completion_loss_mask"]
        assert mask == [1] * (e1 - s1) + [0] * (s2 - e1) + [1] * (e2 - s2)
        for start, end in ((s1, e1), (s2, e2)):  # the engine's log-probs for exactly this context
            scored = engine.score(full[: cut + start], full[cut + start : cut + end], temperature=1.0)
            assert s.logprobs[start:end] == pytest.approx(scored, abs=1e-4)
