"""Multi-turn episodes in the collector (rlvr/orchestration/episodes.py), in-process: a FakeTurnEngine answers
turn requests through the feeder's non-blocking submit/poll with scripted policy turns; tool calls and answer
checks run in a real `VerifierPool` (worker processes). Covered: the token-exact transcript, per-turn versions,
rewards from the environment's terms, exact prompt accounting with async_steps 1, routing (rows without `env`
stay single-turn), hung tools, aborts and engine failures restarting episodes from scratch, lost jobs."""

from __future__ import annotations

import re
import string
import time
from types import SimpleNamespace
from typing import Any

import pytest
from hung_tools import wait_for

from rlvr.algorithms.advantages import assign_group_advantages
from rlvr.algorithms.shaping import ShapingConfig
from rlvr.envs.episode import EpisodeLimits
from rlvr.envs.jobs import Job
from rlvr.envs.settings import EnvSettings, observation_tokenizer
from rlvr.envs.tasks import lookup_rows
from rlvr.models.tiny import build_tokenizer
from rlvr.orchestration.accounting import PromptLedger
from rlvr.orchestration.collector import RolloutCollector
from rlvr.orchestration.episodes import EpisodeRunner, PoolToolRunner, is_episode, sample_episode_reward
from rlvr.orchestration.health import EngineFailure
from rlvr.orchestration.rollouts import RolloutFeeder
from rlvr.rewards.pool import VerifierPool
from rlvr.rewards.scorer import RewardsSettings
from rlvr.types import Group, PromptRequest, RewardResult, Sample, SamplingParams

G = 3
CALL = '<tool_call>{{"name": "lookup", "arguments": {{"key": "{key}"}}}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer([string.printable] * 2 + ["<tool_call>", "</tool_call>", "lookup", "item", "boxed"], 300)


@pytest.fixture(scope="module")
def pool() -> Any:
    with VerifierPool(RewardsSettings(num_workers=2, timeout_s=5.0), hard_grace_s=1.0) as p:
        yield p


class _Call:
    def __init__(self, fn) -> None:
        self.remote = fn


class FakeTurnEngine:
    """Answers each turn request (num_samples must be 1) by the next poll: it looks up the item the prompt asks
    about, then answers with the code it was shown (or `wrong` codes for chosen episodes). Records every request;
    `abort_once` aborts the first turn of those request ids' episodes once; its version moves when told."""

    def __init__(self, tokenizer: Any, wrong: set[int] | None = None) -> None:
        self.tok, self.wrong = tokenizer, wrong or set()
        self.version = 0
        self.queue: list[PromptRequest] = []
        self.requests: list[PromptRequest] = []
        self.produced: dict[str, list[int]] = {}
        self.abort_once: set[str] = set()
        self.stalled: set[str] = set()  # prompts whose requests stay queued, unanswered, while listed here
        self.fail_next_poll = False
        self.bump_after_poll = False
        self.submit, self.poll, self.stats = _Call(self._submit), _Call(self._poll), _Call(lambda: {})

    def _submit(self, requests: list[PromptRequest]) -> None:
        self.queue += requests
        self.requests += requests

    def _text(self, req: PromptRequest) -> str:
        transcript = self.tok.decode(req.prompt_token_ids)
        seen = re.findall(r"<tool_response>\s*(\d+)\s*</tool_response>", transcript)
        if not seen:
            item = re.search(r"item ([A-Z]\d)", transcript)
            return CALL.format(key=f"item {item.group(1) if item else 'A0'}")
        episode = int(re.search(r"~g\d+\.ep(\d+)\.", req.prompt_id).group(1))
        return "\\boxed{%s}" % ("1" if episode in self.wrong else seen[-1])

    def _poll(self) -> list[Sample]:
        if self.fail_next_poll:
            self.fail_next_poll = False
            raise EngineFailure(0, "died: test")
        out, kept = [], []
        for r in self.queue:
            if r.prompt_id.split("~")[0] in self.stalled:
                kept.append(r)
                continue
            if "~g" not in r.prompt_id:  # a single-turn request: G completions at once
                out += [Sample(r.prompt_id, j, r.prompt_token_ids, [5], "x", [-1.0], "stop", 0, 0) for j in range(G)]
                continue
            assert r.num_samples == 1
            if r.prompt_id in self.abort_once:
                self.abort_once.discard(r.prompt_id)
                out.append(Sample(r.prompt_id, 0, r.prompt_token_ids, [], "", [], "abort", self.version, self.version))
                continue
            ids = self.tok.encode(self._text(r), add_special_tokens=False)[: r.sampling.max_new_tokens - 1]
            ids.append(self.tok.eos_token_id)
            self.produced[r.prompt_id] = ids
            lps = [-0.25 - 0.001 * i for i in range(len(ids))]
            out.append(Sample(r.prompt_id, 0, r.prompt_token_ids, ids, "", lps, "stop", self.version, self.version))
        self.queue = kept
        if self.bump_after_poll:
            self.version += 1
        return out


class EnvStream:
    """Lookup rows as requests (metadata = the row, as PromptStream builds it); `plain` rows have no env column."""

    def __init__(self, tokenizer: Any, limit: int, plain: set[int] | None = None) -> None:
        self.rows = lookup_rows("train", limit, seed=1)
        self.tok, self.n, self.plain, self.counters = tokenizer, 0, plain or set(), {}

    def next_request(self) -> PromptRequest | None:
        if self.n >= len(self.rows):
            return None
        row = dict(self.rows[self.n])
        if self.n in self.plain:
            del row["env"]
        self.n += 1
        ids = self.tok.encode(row["prompt"], add_special_tokens=False)
        return PromptRequest(f"p{self.n - 1}", ids, G, SamplingParams(seed=self.n), metadata=row, prompt_text="")

    def state_dict(self) -> dict:
        return {"n": self.n}


def _score(groups: list[Group]) -> float:
    for g in groups:
        if is_episode(g.samples[0]):
            g.rewards = [sample_episode_reward(s) for s in g.samples]
        else:
            g.rewards = [RewardResult({"r": v}, v, v > 0) for v in [1.0] + [0.0] * (g.num_samples - 1)]
    return 0.0


def _setup(tokenizer, pool, limit=12, tools=None, limits=None, runner_tools=None, clock=None, **engine_kw):
    settings = EnvSettings.from_config(SimpleNamespace(**{**_ENV, **({"tools": tools} if tools else {})}))
    if limits is not None:
        settings.limits = limits
    runner = EpisodeRunner(
        settings,
        observation_tokenizer(tokenizer, chat_template=False),  # plain text, as the tiny CPU preset
        runner_tools or PoolToolRunner(pool),
        **({"clock": clock} if clock else {}),
    )
    engine, ledger = FakeTurnEngine(tokenizer, **engine_kw), PromptLedger()
    feeder = RolloutFeeder([engine], EnvStream(tokenizer, limit), ledger, timeout_s=120.0, episodes=runner)
    rollout = SimpleNamespace(
        prompts_per_step=2,
        async_steps=1,
        active_sampling=False,
        filter_zero_variance=False,
        max_pull_factor=4.0,
        timeout_s=120.0,
    )
    c = RolloutCollector(feeder, ledger, rollout, ShapingConfig(64), _score, on_engine_failure=_requeue(feeder))
    return c, engine, ledger, runner


_ENV = {
    "name": "",
    "params": {},
    "tools": [],
    "tool_format": "",
    "end_on_tool_error": False,
    "tool_timeout_s": 2.0,
    "max_turns": 4,
    "max_tokens_per_turn": 64,
    "max_total_tokens": 1024,
}


def _requeue(feeder: RolloutFeeder):
    def on_failure(e: EngineFailure) -> None:
        feeder.requeue_from(e.index)

    return on_failure


def _train(c: RolloutCollector, ledger: PromptLedger, groups: list[Group], engine: FakeTurnEngine) -> None:
    for g in groups:
        c.finish(g.prompt_id, "trained")
    c.advance()
    engine.version += 1
    ledger.check()


def test_episodes_are_token_exact_scored_and_accounted_with_async_steps_1(tokenizer, pool) -> None:
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=8, wrong={2})
    trained: list[str] = []
    for step in range(8):
        collected = c.collect(step)
        if collected is None:
            break
        groups, m = collected
        assert groups and all(g.num_samples == G for g in groups)
        assert m["env/episodes"] == len(groups) * G and m["env/end_reason/done"] == len(groups) * G
        assert m["env/turns_mean"] == 2.0 and m["env/tool_calls_mean"] == 1.0 and m["env/tool_errors_mean"] == 0
        assert 0 < m["env/observation_token_share_mean"] < 1
        for g in groups:
            assert [r.correct for r in g.rewards] == [True, True, False]  # episode 2 answers a wrong code
            assert [r.total for r in g.rewards] == [1.0, 1.0, 0.0]
            for s in g.samples:
                _check_exact(s, engine, tokenizer)
        trained += [g.prompt_id for g in groups]
        _train(c, ledger, groups, engine)
    counts = ledger.counts()
    # every prompt finished exactly once: trained, or dropped as stale (its episodes spanned too many versions)
    assert len(trained) == len(set(trained)) == counts["trained"] and counts["trained"] >= 4
    assert counts["trained"] + counts.get("dropped_stale", 0) == 8 and not ledger.in_flight
    assert not runner.groups and not runner.turns and not runner.jobs
    assert all(r.num_samples == 1 for r in engine.requests)  # one request per turn, never G at once


def _check_exact(s: Sample, engine: FakeTurnEngine, tokenizer: Any) -> None:
    """The completion is the engine's turn ids and the observation ids, in order; the mask marks the engine's."""
    mask = s.metadata["completion_loss_mask"]
    turns = [r for r in engine.requests if re.match(rf"{s.prompt_id}~g\d+\.ep{s.sample_index}\.", r.prompt_id)]
    assert len(turns) == len(s.metadata["turns"]) == 2
    for req, (start, end, version, _finish) in zip(turns, s.metadata["turns"]):
        ids = engine.produced[req.prompt_id]
        assert s.completion_token_ids[start:end] == ids and mask[start:end] == [1] * len(ids)
        assert s.logprobs[start:end] == [-0.25 - 0.001 * i for i in range(len(ids))]
        # the turn was generated from exactly the transcript so far (never re-rendered)
        assert req.prompt_token_ids == (s.prompt_token_ids + s.completion_token_ids)[: len(s.prompt_token_ids) + start]
        assert s.version_start <= version <= s.version_end
    versions = [t[2] for t in s.metadata["turns"]]
    assert (s.version_start, s.version_end) == (min(versions), max(versions))  # the oldest turn's version first
    first_end, second_start = s.metadata["turns"][0][1], s.metadata["turns"][1][0]
    assert second_start > first_end and mask[first_end:second_start] == [0] * (second_start - first_end)
    assert all(lp == 0.0 for lp in s.logprobs[first_end:second_start])
    roles = [t["role"] for t in s.metadata["transcript"]]
    assert roles == ["assistant", "tool", "assistant"] and s.metadata["transcript"][1]["text"].startswith("<tool_")


def test_rows_without_env_stay_single_turn(tokenizer, pool) -> None:
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=4)
    c.feeder.stream.plain = {1, 3}
    groups, _ = c.collect(0)
    _train(c, ledger, groups, engine)
    groups += c.collect(1)[0]
    plain = [r for r in engine.requests if "~g" not in r.prompt_id]
    assert [r.prompt_id for r in plain] == ["p1", "p3"] and all(r.num_samples == G for r in plain)
    by_id = {g.prompt_id: g for g in groups}
    assert sorted(by_id) == ["p0", "p1", "p2", "p3"]
    assert [is_episode(by_id[p].samples[0]) for p in sorted(by_id)] == [True, False, True, False]


def test_each_turn_carries_the_version_it_was_generated_with(tokenizer, pool) -> None:
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=2)
    engine.bump_after_poll = True  # an in-flight weight update between every two turns
    groups, _ = c.collect(0)
    for s in (s for g in groups for s in g.samples):
        first, second = (t[2] for t in s.metadata["turns"])
        assert second > first and (s.version_start, s.version_end) == (first, second)


def test_a_hung_tool_is_an_error_observation_not_a_stalled_step(tokenizer, pool) -> None:
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=2, tools=["hung_tools:spin"])
    engine._text = lambda req: (  # call the spinning tool once, then give up with an answer
        "\\boxed{0}"
        if "<tool_response>" in tokenizer.decode(req.prompt_token_ids)
        else '<tool_call>{"name": "spin", "arguments": {}}</tool_call>'
    )
    groups, m = c.collect(0)
    assert m["env/episodes"] == 2 * G and m["env/tool_error/timeout_mean"] == 1.0
    for s in (s for g in groups for s in g.samples):
        assert s.metadata["end_reason"] == "done" and "timed out" in s.metadata["transcript"][1]["text"]
    assert pool.metrics()["reward/pool/restarts"] >= 1  # the spinning workers were killed and replaced


def test_an_aborted_turn_restarts_its_episode_from_scratch(tokenizer, pool) -> None:
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=2)
    engine.abort_once = {"p0~g0.ep1.0.1"}  # episode 1 of p0 (the runner's first group): its second turn, once
    groups, _ = c.collect(0)
    s = next(g for g in groups if g.prompt_id == "p0").samples[1]
    assert s.metadata["attempt"] == 1 and s.metadata["end_reason"] == "done" and len(s.metadata["turns"]) == 2
    restarted = [r.prompt_id for r in engine.requests if r.prompt_id.startswith("p0~g0.ep1.1.")]
    assert restarted == ["p0~g0.ep1.1.0", "p0~g0.ep1.1.1"]  # the new attempt starts at turn 0
    assert runner.counts["restarts"] == 1 and runner.metrics()["env/restarts"] == 1


def test_an_episode_aborted_past_its_restarts_is_unscored_not_scored_zero(tokenizer, pool) -> None:
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=2)
    engine.abort_once = {f"p0~g0.ep1.{attempt}.0" for attempt in range(3)}  # every attempt of episode 1 of p0
    groups, _ = c.collect(0)
    g = next(g for g in groups if g.prompt_id == "p0")
    assert g.samples[1].metadata["end_reason"] == "abort" and runner.counts["restarts"] == 2
    assert g.rewards[1].total is None and g.rewards[1].status == "error"  # no policy act to reward or punish
    assert sample_episode_reward(g.samples[1]) == g.rewards[1]  # re-scoring the record agrees
    assert all(r.total is not None and r.total > 0 for i, r in enumerate(g.rewards) if i != 1)
    assign_group_advantages([g])
    assert g.advantages[1] == 0.0


def test_an_engine_failure_requeues_and_restarts_the_episodes_exactly_once(tokenizer, pool) -> None:
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=6)
    engine.fail_next_poll = True
    trained = []
    for step in range(3):
        groups, _ = c.collect(step)
        trained += [g.prompt_id for g in groups]
        _train(c, ledger, groups, engine)
    assert sorted(trained) == [f"p{i}" for i in range(6)]
    firsts = [r.prompt_id for r in engine.requests if re.fullmatch(r"p0~g\d+\.ep0\.0\.0", r.prompt_id)]
    # submitted, lost with the engine, submitted again from turn 0 under a new incarnation (fresh ids)
    assert len(firsts) == len(set(firsts)) == 2


class SilentTools:
    """A tool runner whose jobs never answer (a dead verifier actor)."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []

    def submit(self, job_id: str, job: Job) -> None:
        self.jobs.append(job)

    def poll(self) -> list:
        return []


def test_a_job_the_pool_never_answers_times_out_at_the_runner(tokenizer, pool) -> None:
    now = [0.0]
    tools = SilentTools()
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=2, runner_tools=tools, clock=lambda: now[0])
    engine._text = lambda req: (  # look up once, then answer whatever came back
        "\\boxed{0}" if "<tool_response>" in tokenizer.decode(req.prompt_token_ids) else CALL.format(key="item A0")
    )
    c.feeder.top_up(2, limit=2)
    c.feeder.poll()  # first turns answered: lookups sent to the silent runner
    assert len(tools.jobs) == 2 * G and not c.feeder.poll()
    now[0] = 1e6  # far past every job's deadline
    c.feeder.poll()  # lost lookups answered with a timeout error; the second turns go out
    c.feeder.poll()  # the answers' checks go to the silent runner too
    now[0] = 2e6
    groups = c.feeder.poll()
    assert len(groups) == 2 and runner.counts["lost_jobs"] == 4 * G and runner.metrics()["env/lost_jobs"] == 4 * G
    for s in (s for g in groups for s in g.samples):
        assert s.metadata["episode_metrics"]["tool_error/timeout"] == 1.0
        assert s.metadata["episode_metrics"]["verify_error/timeout"] == 1.0
        assert sample_episode_reward(s).total == 0.0  # the answer check was lost: unscored, no reward


def test_limits_end_episodes_with_their_reason(tokenizer, pool) -> None:
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=2, limits=EpisodeLimits(1, 64, 1024))
    groups, m = c.collect(0)
    assert m["env/end_reason/max_turns"] == 2 * G and m["env/turns_mean"] == 1.0
    assert all(not r.correct and r.total == 0.0 for g in groups for r in g.rewards)


def test_groups_waiting_for_tools_are_no_engine_load(tokenizer, pool) -> None:
    """The health check declares an engine stuck when it has load and generates nothing: episodes whose turns are
    all back and whose tool calls are in the pool must not count as its load."""
    tools = SilentTools()
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=2, runner_tools=tools)
    c.feeder.top_up(2, limit=2)
    assert c.feeder.outstanding_per_engine() == [2]  # first turns on the engine
    c.feeder.poll()
    assert len(tools.jobs) == 2 * G and c.feeder.outstanding_per_engine() == [0]


class HeldTools:
    """The real pool's answers, held back until `open` (each answer is collected as it comes); the optional
    protocol methods are not offered, so nothing is cancelled and every job goes out at once."""

    def __init__(self, inner: PoolToolRunner) -> None:
        self.inner, self.open, self.held, self.sent = inner, False, [], []

    def submit(self, job_id: str, job: Job) -> None:
        self.sent.append(job_id)
        self.inner.submit(job_id, job)

    def poll(self) -> list:
        self.held += self.inner.poll()
        if not self.open:
            return []
        out, self.held = self.held, []
        return out


def test_a_restarted_group_never_takes_the_old_groups_late_answers(tokenizer, pool) -> None:
    """Issue 19 (1): p0 looks up the wrong item (T4) and its engine fails while the lookups are in the pool; the
    prompt starts over and looks up the right one (Z3). The old lookups' answers, arriving late, must not be
    taken by the new episodes (same prompt, same episode, attempt and turn)."""
    tools = HeldTools(PoolToolRunner(pool))
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=1, runner_tools=tools)
    assert "item Z3" in c.feeder.stream.rows[0]["prompt"] and "item T4" in c.feeder.stream.rows[0]["table"]
    right = engine._text
    engine._text = lambda req: CALL.format(key="item T4")  # the first incarnation asks about another item
    c.feeder.top_up(1, limit=1)
    c.feeder.poll()  # first turns back: the T4 lookups go to the pool
    assert len(tools.sent) == G and len(runner.jobs) == G
    engine.fail_next_poll = True
    with pytest.raises(EngineFailure):
        c.feeder.poll()
    c.feeder.requeue_from(0)  # as the driver does: p0 is dropped and re-queued
    assert not runner.jobs and not runner.groups  # the dropped group's jobs are forgotten with it
    engine._text = right
    engine.queue = []  # the replacement engine starts empty
    c.feeder.top_up(1, limit=1)
    c.feeder.poll()  # the new first turns: Z3 lookups
    assert len(tools.sent) == 2 * G and len(set(tools.sent)) == 2 * G  # fresh ids for the new incarnation
    while len(tools.held) < 2 * G:  # every lookup answered, the old ones first
        tools.poll()
    tools.open = True
    [group] = c.feeder.wait_groups(1, deadline=float("inf"))
    code = c.feeder.stream.rows[0]["table"]["item Z3"]
    for s in group.samples:
        assert code in s.metadata["transcript"][1]["text"]  # the Z3 lookup's answer, not the old T4 one
    assert [r.correct for r in group.rewards] == [True] * G and not runner.jobs


def test_tool_jobs_wait_in_the_runner_and_are_timed_from_their_dispatch(tokenizer, tmp_path) -> None:
    """Issue 19 (2): at most `max_outstanding` jobs go to the pool, the rest wait in the runner (first in, first
    out); a job that waits (in the runner, or queued in a pool whose worker is busy) is not declared lost,
    however long it waits: its deadline starts when a worker takes it."""
    gate = tmp_path / "release"
    now = [0.0]
    with VerifierPool(RewardsSettings(num_workers=1, timeout_s=5.0), hard_grace_s=1.0) as one:
        tools = PoolToolRunner(one, max_outstanding=2)
        c, engine, ledger, runner = _setup(tokenizer, one, limit=1, runner_tools=tools, clock=lambda: now[0])
        one.run_tool("blocker", wait_for, (str(gate),), 120.0)  # the only worker is busy until the gate opens
        c.feeder.top_up(1, limit=1)
        c.feeder.poll()  # first turns back: G lookups
        assert len(tools.outstanding) == 2 and len(runner.queued) == G - 2  # the rest wait in the runner
        assert list(runner.queued) == [j for j in runner.jobs if j not in tools.outstanding]
        now[0] = 1e6  # far past any deadline counted from the submission
        for _ in range(3):
            assert not c.feeder.poll()
        assert runner.counts["lost_jobs"] == 0 and len(runner.jobs) == G
        gate.touch()
        [group] = c.feeder.wait_groups(1, deadline=float("inf"))
        assert runner.counts["lost_jobs"] == 0 and [r.correct for r in group.rewards] == [True] * G
        assert all(s.metadata["episode_metrics"].get("tool_errors", 0) == 0 for s in group.samples)


def test_the_pool_cancels_queued_jobs_and_scores_rows_first(tmp_path) -> None:
    """`cancel_jobs` forgets queued jobs (no answer); rows queued after a job are scored before it runs."""
    gate = tmp_path / "release"
    with VerifierPool(RewardsSettings(num_workers=1, timeout_s=5.0), hard_grace_s=1.0) as one:
        one.run_tool("blocker", wait_for, (str(gate),), 120.0)
        one.run_tool("late", wait_for, (str(tmp_path / "never"), 0.0), 10.0)
        one.run_tool("gone", wait_for, (str(gate),), 10.0)
        assert one.cancel_jobs(["gone", "unknown"]) == 1
        one.submit("rows", [("\\boxed{4}", {"ground_truth": "4", "verifier": "math"}, None)])
        gate.touch()
        answers: dict = {}
        started: list = []
        batches: list = []
        while len(answers) < 2 or not batches:
            done, taken = one.poll_tools(started=True)
            answers.update(done)
            started += taken
            batches += one.poll()
        assert answers == {"blocker": "released", "late": "released"} and started == ["blocker", "late"]
        assert batches[0][0] == "rows" and batches[0][1][0].total == 1.0
        assert one.metrics()["reward/pool/jobs_queued"] == 0


def test_a_prompt_too_long_for_a_turn_is_its_own_end_reason_and_never_stale(tokenizer, pool) -> None:
    """Issue 19 (4): episodes whose first observation leaves no room for a turn carry the version they were
    admitted under (not -1, always stale: dropped and replaced forever)."""
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=4, limits=EpisodeLimits(4, 64, 100))
    for step in range(2):
        groups, m = c.collect(step)
        assert len(groups) == 2 and not m.get("rollout/dropped_stale")
        assert m["env/end_reason/prompt_too_long"] == 2 * G
        # stamped with the learner's version when pulled (this step's or, pulled ahead, the previous one's)
        assert {(s.version_start, s.version_end) for g in groups for s in g.samples} <= {(step - 1,) * 2, (step,) * 2}
        _train(c, ledger, groups, engine)
    assert not engine.requests and ledger.counts()["trained"] == 4 and not ledger.counts()["dropped_stale"]
    runner.note_version(7)
    runner.start(PromptRequest("x", [1], 1, SamplingParams(), metadata=c.feeder.stream.rows[0]), "tool_lookup", 0)
    [g] = runner.take_finished()
    assert g.samples[0].version_start == 7 and g.samples[0].metadata["end_reason"] == "prompt_too_long"


class _BrokenReset:
    def reset(self, row: dict) -> Any:
        raise KeyError("table")

    def step(self, turn_text: str, turn_token_ids: list[int]) -> Any:
        raise AssertionError("never stepped")


class _NoJobs:
    """A staged environment whose step hands out no jobs: the step must end at once."""

    def reset(self, row: dict) -> Any:
        from rlvr.envs.base import Observation

        return Observation(text=row["prompt"])

    def step(self, turn_text: str, turn_token_ids: list[int]) -> Any:
        raise AssertionError("staged: begin_step/end_step")

    def begin_step(self, turn_text: str, turn_token_ids: list[int]) -> Any:
        from rlvr.envs.jobs import PendingStep

        return PendingStep(jobs=[])

    def end_step(self, pending: Any, outputs: list) -> Any:
        from rlvr.envs.base import StepResult

        assert outputs == []
        return StepResult(None, {"math": 1.0}, done=True)


def test_an_environment_that_fails_to_start_is_an_env_error_episode(tokenizer, pool, monkeypatch) -> None:
    """Issue 19 (5): env.reset raising (also on the abort-restart path) ends that episode, not the run."""
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=2)
    make = runner.settings.make
    calls = [0]

    def sometimes_broken(name: str) -> Any:
        calls[0] += 1
        return _BrokenReset() if calls[0] in (1, G + 1) else make(name)  # episode 0 of each group

    monkeypatch.setattr(runner.settings, "make", sometimes_broken)
    groups, m = c.collect(0)
    assert m["env/end_reason/env_error"] == 2 and m["env/end_reason/done"] == 2 * G - 2
    for g in groups:
        s = g.samples[0]
        assert s.metadata["end_reason"] == "env_error" and "KeyError" in s.metadata["error"]
        assert not s.completion_token_ids and g.rewards[0].total == 0.0 and s.version_start == 0
    # the abort-restart path: episode 1 of a fresh run's first group is aborted and its new environment breaks
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=1)
    engine.abort_once = {"p0~g0.ep1.0.0"}
    make, calls[0] = runner.settings.make, 0
    monkeypatch.setattr(runner.settings, "make", lambda name: make(name) if _count(calls) <= G else _BrokenReset())
    [group], m = c.collect(0)
    s = group.samples[1]
    assert s.metadata["end_reason"] == "env_error" and s.metadata["attempt"] == 1
    assert m["env/restarts"] == 1 and m["env/end_reason/env_error"] == 1 and m["env/lost_jobs"] == 0


def _count(calls: list[int]) -> int:
    calls[0] += 1
    return calls[0]


def test_a_staged_step_without_jobs_ends_at_once(tokenizer, pool, monkeypatch) -> None:
    c, engine, ledger, runner = _setup(tokenizer, pool, limit=2)
    monkeypatch.setattr(runner.settings, "make", lambda name: _NoJobs())
    c.feeder.top_up(2, limit=2)
    groups = c.feeder.poll()  # first turns back: their steps hand out no jobs and end the episodes
    assert len(groups) == 2 and all(r.total == 1.0 for g in groups for r in g.rewards)
    assert not runner.jobs and not runner.groups


def test_episodes_take_their_turns_while_the_learners_train(tokenizer, pool, ray_cluster) -> None:
    """The driver's wait for the learners advances the next step's episodes (next turns submitted, finished groups
    held), and the next collection trains on what arrived meanwhile. The stand-in learner trains until every
    in-flight episode has finished, so nothing here depends on timing."""
    import ray

    from rlvr.orchestration.driver import Trainer

    @ray.remote(num_cpus=0)
    class Learner:
        def __init__(self) -> None:
            self.done = False

        def finish(self) -> None:
            self.done = True

        def train_batch(self) -> int:  # returns once told (or after 60 s, which fails the test below)
            deadline = time.monotonic() + 60.0
            while not self.done and time.monotonic() < deadline:
                time.sleep(0.01)
            return int(self.done)

    c, engine, ledger, runner = _setup(tokenizer, pool, limit=8)
    engine.stalled = {"p2", "p3"}  # the window's second half waits in the engine until the learners train
    groups, _ = c.collect(0)
    assert sorted(g.prompt_id for g in groups) == ["p0", "p1"] and sorted(runner.groups) == ["p2", "p3"]
    assert not c.pending
    learner = Learner.options(max_concurrency=2).remote()
    poll = c.feeder.poll

    def poll_then_tell() -> list[Group]:
        engine.stalled.clear()
        out = poll()
        if not runner.groups:
            learner.finish.remote()
        return out

    c.feeder.poll = poll_then_tell  # type: ignore[method-assign]
    trainer = SimpleNamespace(
        feeder=c.feeder,
        collector=c,
        weights=SimpleNamespace(colocated=False),
        cfg=SimpleNamespace(rollout=SimpleNamespace(colocate_sleep=False, async_steps=1)),
    )
    ref = learner.train_batch.remote()
    m, failure = Trainer._advance_episodes_until(trainer, [ref], time.time() + 120.0)
    assert ray.get(ref) == 1 and failure is None  # the episodes finished while it trained
    assert m["env/turns_during_train"] > 0 and c.pending and not runner.groups
    held = {g.prompt_id for g in c.pending}
    assert held == {"p2", "p3"}
    c.feeder.poll = poll  # type: ignore[method-assign]
    _train(c, ledger, groups, engine)
    nxt, _ = c.collect(1)
    assert held <= {g.prompt_id for g in nxt}
    ray.kill(learner)


def test_an_engine_failure_while_the_learners_train_is_handed_back_and_nothing_is_lost(
    tokenizer, pool, ray_cluster
) -> None:
    """The pump stops at an engine failure and returns it (the driver replaces the engine after the train step);
    the groups that came back meanwhile are kept, and re-queueing gets every prompt trained exactly once."""
    import ray

    from rlvr.orchestration.driver import Trainer

    c, engine, ledger, runner = _setup(tokenizer, pool, limit=8)
    engine.stalled = {"p2", "p3"}
    groups, _ = c.collect(0)
    engine.stalled.clear()
    engine.fail_next_poll = True
    trainer = SimpleNamespace(
        feeder=c.feeder,
        collector=c,
        weights=SimpleNamespace(colocated=False),
        cfg=SimpleNamespace(rollout=SimpleNamespace(colocate_sleep=False, async_steps=1)),
    )
    ref = ray.put(0)  # a learner that has already answered: the pump polls once
    m, failure = Trainer._advance_episodes_until(trainer, [ref], time.time() + 60.0)
    assert isinstance(failure, EngineFailure) and m == {"env/turns_during_train": 0.0}
    trainer.cfg.rollout.async_steps = 0  # on-policy: whatever it generated now would be stale, so it does not run
    assert Trainer._advance_episodes_until(trainer, [ref], time.time() + 60.0) == ({}, None)
    c.feeder.requeue_from(0)  # what the driver's engine replacement does with the prompts it had
    _train(c, ledger, groups, engine)
    trained = [g.prompt_id for g in groups]
    for step in range(1, 6):
        collected = c.collect(step)
        if collected is None:
            break
        trained += [g.prompt_id for g in collected[0]]
        _train(c, ledger, collected[0], engine)
    assert sorted(trained) == [f"p{i}" for i in range(8)]
