"""Multi-turn episodes in the collector (docs/multi-turn.md): a state machine per episode over the engines'
non-blocking `submit`/`poll`, with tool calls in the verifier pool.

A prompt routed to an environment (`EnvSettings.route`) becomes G = `num_samples` episodes instead of one request
for G completions. Each episode is, at any time, in one of three states:

- waiting for a turn: a `PromptRequest(num_samples=1, prompt_token_ids=transcript so far)` is on the group's
  engine, id `<prompt_id>~ep<k>.<attempt>.<turn>`; its sample (engine ids, log-probs, the engine's policy version)
  is appended exactly (`add_turn`);
- waiting for jobs: the environment's `begin_step` handed out tool calls or an answer check (`rlvr.envs.jobs`),
  sent to the `ToolRunner` (the verifier pool's workers: their timeouts, and a hard kill as backstop); a job
  with no answer by `timeout_s * 2 + JOB_GRACE_S` is answered here with a `JobFailure` ("timeout"), so a lost
  job or a dead verifier actor cannot stall a step; `end_step` turns the outputs into the step's result;
- done: an end reason (`rlvr.envs.episode`).

Nothing here blocks: `start`, `on_sample` and `poll_jobs` return the next turn requests for the feeder to submit.
A group whose G episodes are done becomes a `Group` of `episode_to_sample` records with rewards from the
environment's reward terms (`episode_reward`), handed out by `take_finished`.

Restarts: an aborted turn restarts its episode from scratch (a fresh environment and transcript, attempt + 1) up
to `max_restarts` times, then ends it with reason "abort"; `drop` forgets a group whose engine is replaced (the
feeder re-queues the prompt, which starts over). Answers for an attempt or group that is gone are ignored.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from rlvr.algorithms.policy_tokens import EPISODE_MARKER
from rlvr.data.prompts import ROW_MESSAGES, ROW_PROMPT
from rlvr.envs.base import Environment, StepResult
from rlvr.envs.engine_turns import episode_to_sample
from rlvr.envs.episode import Episode, GeneratedTurn, add_step, add_turn, start_episode, turn_budget
from rlvr.envs.jobs import Job, JobFailure, PendingStep, StagedEnvironment
from rlvr.envs.settings import EnvSettings
from rlvr.envs.turns import ObservationTokenizer
from rlvr.telemetry.logs import get_logger
from rlvr.types import Group, PromptRequest, RewardResult, Sample

logger = get_logger(__name__)

JOB_GRACE_S = 30.0
"""Seconds past twice a job's own limit after which the collector stops waiting for the pool's answer."""
SEED_STRIDE_EPISODE, SEED_STRIDE_TURN = 7919, 104729


class ToolRunner(Protocol):
    """Where jobs run: `submit` never blocks; `poll` returns (job_id, output or `JobFailure`) pairs."""

    def submit(self, job_id: str, job: Job) -> None: ...

    def poll(self) -> list[tuple[str, Any]]: ...


def _as_failure(output: Any) -> Any:
    """The pool's own `JobFailure` (rlvr.rewards.pool, which cannot import envs) as the environments' one."""
    if type(output).__name__ == "JobFailure" and not isinstance(output, JobFailure):
        return JobFailure(output.reason, output.message, output.latency_s)
    return output


class PoolToolRunner:
    """Jobs in an in-process `VerifierPool` (tests, `rlvr eval`)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def submit(self, job_id: str, job: Job) -> None:
        self.pool.run_tool(job_id, job.fn, job.args, job.timeout_s)

    def poll(self) -> list[tuple[str, Any]]:
        return [(job_id, _as_failure(out)) for job_id, out in self.pool.poll_tools()]


class ActorToolRunner:
    """Jobs on the verifier actors (`actors.verifiers`, read on every call: a replaced actor is picked up),
    spread round-robin. A dead actor's jobs are answered by the runner's deadline, never waited on forever."""

    def __init__(self, actors: Any, timeout_s: float) -> None:
        self.actors, self.timeout_s = actors, timeout_s
        self._next = 0

    def submit(self, job_id: str, job: Job) -> None:
        verifiers = self.actors.verifiers
        self._next = (self._next + 1) % len(verifiers)
        verifiers[self._next].run_tool.remote(job_id, job.fn, job.args, job.timeout_s)

    def poll(self) -> list[tuple[str, Any]]:
        import ray

        out: list[tuple[str, Any]] = []
        for ref in [v.poll_tools.remote() for v in self.actors.verifiers]:
            try:
                out += [(job_id, _as_failure(o)) for job_id, o in ray.get(ref, timeout=self.timeout_s)]
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                logger.warning("verifier actor did not answer poll_tools (%s); its jobs will time out", e)
        return out


@dataclass
class _Episode:
    index: int
    attempt: int
    env: Environment
    ep: Episode
    started: float
    turn: int = 0
    pending_turn: str = ""
    pending: PendingStep | None = None
    outputs: list[Any] = field(default_factory=list)
    done: bool = False


@dataclass
class _Group:
    request: PromptRequest
    name: str
    engine: int
    row: dict[str, Any]
    episodes: list[_Episode] = field(default_factory=list)


_MISSING = object()
TURN_MARK = "~ep"
"""Marks a turn request id: `<prompt_id>~ep<k>.<attempt>.<turn>`."""


def _turn_id(prompt_id: str, e: _Episode) -> str:
    return f"{prompt_id}{TURN_MARK}{e.index}.{e.attempt}.{e.turn}"


def episode_reward(terms: dict[str, float], primary: str | None) -> RewardResult:
    """An episode's reward: scores = the environment's reward terms, total = their sum (each term weighs 1;
    0.0 when the episode earned none, e.g. it never answered), correct = the primary (verifier) term at its
    maximum 1.0."""
    key = primary if primary in terms else next(iter(terms), None)
    return RewardResult(
        scores=dict(terms),
        total=float(sum(terms.values())),
        correct=bool(key is not None and terms[key] >= 1.0),
    )


def is_episode(sample: Sample) -> bool:
    """Whether a sample is an episode's record: the private marker only `episode_to_sample` sets (data columns
    named like an episode's keys, e.g. a reused samples.jsonl, are rejected at load and never decide this)."""
    return sample.metadata.get(EPISODE_MARKER) is True


def sample_episode_reward(sample: Sample) -> RewardResult:
    """`episode_reward` of an episode's record (its terms and its row's verifier are in the metadata)."""
    return episode_reward(dict(sample.metadata["reward_terms"]), _primary(sample.metadata))


def _primary(metadata: dict[str, Any]) -> str | None:
    v = metadata.get("verifier")
    return v[0] if isinstance(v, list) and v else v if isinstance(v, str) else None


class EpisodeRunner:
    """The episodes of routed prompts (module docstring)."""

    def __init__(
        self,
        settings: EnvSettings,
        tokens: ObservationTokenizer,
        tools: ToolRunner,
        max_restarts: int = 2,
        clock: Any = time.monotonic,
    ) -> None:
        self.settings, self.tokens, self.tools = settings, tokens, tools
        self.max_restarts, self.clock = max_restarts, clock
        self.groups: dict[str, _Group] = {}
        self.turns: dict[str, tuple[str, int]] = {}  # turn request id -> (prompt id, episode index)
        self.jobs: dict[str, tuple[str, int, str, int, float]] = {}  # job id -> (pid, k, turn id, slot, deadline)
        self.finished: list[Group] = []
        self.counts = {"restarts": 0, "lost_jobs": 0}

    # ---------------------------------------------------------------- feeder API
    def route(self, request: PromptRequest) -> str | None:
        """The environment `request` runs, or None (single-turn)."""
        return self.settings.route(request.metadata)

    def owns(self, prompt_id: str) -> bool:
        """Whether a sample id is one of this runner's turn requests (current or stale)."""
        return prompt_id in self.turns or TURN_MARK in prompt_id

    def start(self, request: PromptRequest, name: str, engine: int) -> list[PromptRequest]:
        """Begin G episodes of `request` on `engine`; returns their first turn requests."""
        md = request.metadata  # the row's raw prompt (rendered exactly once, by the first observation)
        row = {**md, "prompt": md[ROW_PROMPT] if ROW_PROMPT in md else md.get("prompt") or request.prompt_text}
        row["messages"] = md.get(ROW_MESSAGES)
        group = _Group(request, name, engine, row)
        self.groups[request.prompt_id] = group
        out: list[PromptRequest] = []
        for k in range(request.num_samples):
            group.episodes.append(self._new_episode(group, k, attempt=0))
            out += self._advance(group, group.episodes[k])
        self._maybe_finish(group)
        return out

    def on_sample(self, sample: Sample) -> list[PromptRequest]:
        """An engine answered a turn; returns the turn requests to submit next (to `engine_of`)."""
        where = self.turns.pop(sample.prompt_id, None)
        group = self.groups.get(where[0]) if where else None
        if where is None or group is None:
            return []
        e = group.episodes[where[1]]
        if e.done or e.pending_turn != sample.prompt_id:
            return []
        e.pending_turn = ""
        if sample.finish_reason == "abort" and e.attempt < self.max_restarts:
            self.counts["restarts"] += 1
            e = group.episodes[e.index] = self._new_episode(group, e.index, e.attempt + 1)
            out = self._advance(group, e)
            self._maybe_finish(group)
            return out
        turn = GeneratedTurn(
            list(sample.completion_token_ids), list(sample.logprobs), sample.finish_reason, sample.version_start
        )
        try:  # the transcript has not changed since the request: this is the budget it was sent with
            ended = add_turn(e.ep, turn, self.tokens, self._budget(e), self.settings.limits)
        except ValueError as err:  # an engine answer that breaks the turn contract ends this episode only
            out = self._env_error(group, e, err)
            self._maybe_finish(group)
            return out
        out = self._finish(group, e, ended) if ended else self._begin_step(group, e)
        self._maybe_finish(group)
        return out

    def poll_jobs(self) -> list[PromptRequest]:
        """Job answers (and jobs past their deadline); returns the turn requests to submit next."""
        if not self.jobs:
            return []  # nothing to ask the pool (single-turn runs never do)
        answers = self.tools.poll()
        now = self.clock()
        for job_id, (_, _, _, _, deadline) in list(self.jobs.items()):
            if now > deadline:
                self.counts["lost_jobs"] += 1
                answers.append((job_id, JobFailure("timeout", "no answer from the verifier pool in time")))
        out: list[PromptRequest] = []
        touched: set[str] = set()
        for job_id, output in answers:
            where = self.jobs.pop(job_id, None)
            group = self.groups.get(where[0]) if where else None
            if where is None or group is None:
                continue
            pid, k, turn_id, slot, _ = where
            e = group.episodes[k]
            if e.done or e.pending is None or e.pending_turn != turn_id:
                continue
            e.outputs[slot] = output
            if any(o is _MISSING for o in e.outputs):
                continue
            pending, outputs = e.pending, e.outputs
            e.pending, e.outputs, e.pending_turn = None, [], ""
            try:
                result = e.env.end_step(pending, outputs)  # type: ignore[attr-defined]
            except Exception as err:  # trust boundary: a user environment's bug ends this episode, not the run
                out += self._env_error(group, e, err)
            else:
                out += self._after_step(group, e, result)
            touched.add(pid)
        for pid in touched:
            if pid in self.groups:
                self._maybe_finish(self.groups[pid])
        return out

    def engine_of(self, request: PromptRequest) -> int:
        """The engine a turn request goes to: its group's (later turns reuse that engine's prefix cache)."""
        return self.groups[self.turns[request.prompt_id][0]].engine

    def drop(self, prompt_id: str) -> None:
        """Forget a group (its engine was replaced; the prompt is re-queued and starts over)."""
        self.groups.pop(prompt_id, None)
        for turn_id in [t for t, (pid, _) in self.turns.items() if pid == prompt_id]:
            del self.turns[turn_id]

    def drop_eval(self) -> None:
        """Forget every eval group (a new eval starts; an earlier one was dropped with its engine)."""
        for pid in [pid for pid, g in self.groups.items() if g.request.is_eval]:
            self.drop(pid)

    def take_finished(self) -> list[Group]:
        """Groups whose episodes are all done since the last call."""
        done, self.finished = self.finished, []
        return done

    @property
    def active(self) -> int:
        return len(self.groups)

    # ---------------------------------------------------------------- the state machine
    def _new_episode(self, group: _Group, k: int, attempt: int) -> _Episode:
        env = self.settings.make(group.name)
        ep = start_episode(env, group.row, self.tokens)
        return _Episode(k, attempt, env, ep, self.clock())

    def _budget(self, e: _Episode) -> int:
        return turn_budget(e.ep, self.settings.limits)

    def _advance(self, group: _Group, e: _Episode) -> list[PromptRequest]:
        """The episode's next turn request, or its end when no room is left."""
        budget = self._budget(e)
        if budget <= 0 or e.turn >= self.settings.limits.max_turns:
            return self._finish(group, e, "max_total_tokens" if budget <= 0 else "max_turns")
        req = group.request
        turn_id = _turn_id(req.prompt_id, e)
        seed = req.sampling.seed
        sampling = replace(
            req.sampling,
            max_new_tokens=budget,
            seed=None if seed is None else seed + SEED_STRIDE_EPISODE * e.index + SEED_STRIDE_TURN * e.turn,
            stop_strings=list(req.sampling.stop_strings) + list(getattr(e.env, "stop_strings", [])),
        )
        e.pending_turn = turn_id
        self.turns[turn_id] = (req.prompt_id, e.index)
        return [PromptRequest(turn_id, list(e.ep.token_ids), 1, sampling, is_eval=req.is_eval)]

    def _begin_step(self, group: _Group, e: _Episode) -> list[PromptRequest]:
        text, ids = e.ep.turns[-1].text, e.ep.token_ids[e.ep.turns[-1].start : e.ep.turns[-1].end]
        try:
            if isinstance(e.env, StagedEnvironment):
                begun = e.env.begin_step(text, ids)
            else:
                begun = e.env.step(text, ids)  # a plain environment steps here (it should be cheap)
        except Exception as err:  # trust boundary: a user environment's bug ends this episode, not the run
            return self._env_error(group, e, err)
        if isinstance(begun, StepResult):
            return self._after_step(group, e, begun)
        turn_id = _turn_id(group.request.prompt_id, e)
        e.pending, e.outputs, e.pending_turn = begun, [_MISSING] * len(begun.jobs), turn_id
        now = self.clock()
        for slot, job in enumerate(begun.jobs):
            job_id = f"{turn_id}/j{slot}"
            self.jobs[job_id] = (group.request.prompt_id, e.index, turn_id, slot, now + 2 * job.timeout_s + JOB_GRACE_S)
            self.tools.submit(job_id, job)
        return []

    def _after_step(self, group: _Group, e: _Episode, result: StepResult) -> list[PromptRequest]:
        ended = add_step(e.ep, result, e.turn, self.tokens, self.settings.limits)
        e.turn += 1
        return self._finish(group, e, ended) if ended else self._advance(group, e)

    def _env_error(self, group: _Group, e: _Episode, err: Exception) -> list[PromptRequest]:
        e.ep.error = f"{type(err).__name__}: {err}"[:500]
        return self._finish(group, e, "env_error")

    def _finish(self, group: _Group, e: _Episode, reason: str) -> list[PromptRequest]:
        e.ep.end_reason, e.done = reason, True
        e.ep.wall_s = self.clock() - e.started
        return []

    def _maybe_finish(self, group: _Group) -> None:
        if not all(e.done for e in group.episodes) or self.groups.get(group.request.prompt_id) is not group:
            return
        del self.groups[group.request.prompt_id]
        req = group.request
        primary = _primary(req.metadata)
        samples, rewards = [], []
        for e in group.episodes:
            s = episode_to_sample(e.ep, req.prompt_id, e.index, group.engine, metadata=dict(req.metadata))
            s.is_eval = req.is_eval
            s.prompt_text = self.tokens.decode(e.ep.token_ids[: e.ep.prompt_length])
            s.metadata["attempt"] = e.attempt
            samples.append(s)
            rewards.append(episode_reward(e.ep.reward_terms, primary))
        self.finished.append(Group(prompt_id=req.prompt_id, samples=samples, rewards=rewards))


def build_episode_runner(cfg: Any, model_dir: str, actors: Any) -> EpisodeRunner:
    """The trainer's runner: `cfg.env`, the run's tokenizer (read from `model_dir` as every actor does, with the
    config's chat template override), jobs on the verifier actors. Rows without an environment never touch it."""
    from transformers import AutoTokenizer

    from rlvr.data.prompts import apply_chat_template_override
    from rlvr.envs.settings import observation_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or model_dir)
    apply_chat_template_override(tokenizer, cfg.model)
    tokens = observation_tokenizer(tokenizer, cfg.data.apply_chat_template, cfg.data.system_prompt)
    return EpisodeRunner(EnvSettings.from_config(cfg.env), tokens, ActorToolRunner(actors, cfg.cluster.actor_timeout_s))


def check_env_at_start(cfg: Any, model_dir: str, stream: Any, eval_requests: list[PromptRequest]) -> None:
    """Start-up checks of multi-turn (`check_env`): every environment the config or a row names is known, and the
    limits fit the model. Raises ValueError naming the field (the CLI exits 2)."""
    from rlvr.envs.settings import ENV_COLUMN, check_env, model_context

    names = {str(r.metadata[ENV_COLUMN]) for r in eval_requests if r.metadata.get(ENV_COLUMN)}
    for dataset in getattr(stream, "_datasets", []):  # PromptStream's loaded rows: their extra columns
        names |= {str(row["extra"][ENV_COLUMN]) for row in dataset.rows if (row.get("extra") or {}).get(ENV_COLUMN)}
    check_env(cfg, model_context(model_dir), names)
    if names and cfg.rollout.backend == "vllm" and not cfg.rollout.vllm_max_model_len:
        from rlvr.rollout.vllm_support import runs_episodes

        if (
            not runs_episodes(cfg)
            and cfg.data.max_prompt_tokens + cfg.generation.max_new_tokens < cfg.env.max_total_tokens
        ):
            raise ValueError(
                f"rows route to environment(s) {', '.join(sorted(names))}: vLLM's max model length must hold a whole "
                f"episode; set --rollout.vllm-max-model-len {cfg.env.max_total_tokens} (--env.max-total-tokens)"
            )
