"""Multi-turn episodes in the collector (docs/multi-turn.md): a state machine per episode over the engines'
non-blocking `submit`/`poll`, with tool calls in the verifier pool.

A prompt routed to an environment (`EnvSettings.route`) becomes G = `num_samples` episodes instead of one request
for G completions. Each episode is, at any time, in one of three states:

- waiting for a turn: a `PromptRequest(num_samples=1, prompt_token_ids=transcript so far)` is on the group's
  engine, id `<prompt_id>~g<n>.ep<k>.<attempt>.<turn>` (n: the group's incarnation, unique in this runner, so a
  prompt that starts over never takes an answer meant for an earlier start); its sample (engine ids, log-probs,
  the engine's policy version) is appended exactly (`add_turn`);
- waiting for jobs: the environment's `begin_step` handed out tool calls or an answer check (`rlvr.envs.jobs`),
  ids `<turn id>/j<slot>`, in the runner's `JobQueue` (rlvr/orchestration/episode_jobs.py: a few per verifier
  worker at a time, the rest queued first in first out, timed from their dispatch; one with no answer in time
  is answered with a `JobFailure` "timeout", counted in `lost_jobs`, so a lost job cannot stall a step). Once
  every job of the step has its answer, `end_step` turns the outputs into the step's result;
- done: an end reason (`rlvr.envs.episode`), or "prompt_too_long" (the first observation leaves no room for a
  turn; stamped with the policy version at admission, `note_version`, so it is never stale by construction), or
  "env_error" (the environment raised, also in `reset`).

Nothing here blocks: `start`, `on_sample` and `poll_jobs` return the next turn requests for the feeder to submit.
A group whose G episodes are done becomes a `Group` of `episode_to_sample` records with rewards from the
environment's reward terms (`episode_reward`, rlvr/orchestration/episode_rewards.py), handed out by
`take_finished`.

Restarts: an aborted turn restarts its episode from scratch (a fresh environment and transcript, attempt + 1) up
to `max_restarts` times, then ends it with reason "abort"; `drop` forgets a group whose engine is replaced (the
feeder re-queues the prompt, which starts over under a new incarnation): its jobs are forgotten too (cancelled
in the pool where still queued). Answers whose id is unknown (a group or attempt that is gone) are ignored.
`metrics` reports the restarts and lost jobs (`env/restarts`, `env/lost_jobs`).
"""

from __future__ import annotations

import itertools
import re
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from rlvr.data.prompts import ROW_MESSAGES, ROW_PROMPT
from rlvr.envs.base import Environment, StepResult
from rlvr.envs.engine_turns import episode_to_sample
from rlvr.envs.episode import Episode, GeneratedTurn, add_step, add_turn, start_episode, turn_budget
from rlvr.envs.jobs import PendingStep, StagedEnvironment
from rlvr.envs.settings import EnvSettings
from rlvr.envs.turns import ObservationTokenizer
from rlvr.orchestration.episode_jobs import JOBS_PER_WORKER, ActorToolRunner, JobEntry, JobQueue, ToolRunner

# `X as X`: re-exported, where `rlvr eval` (the tool runner) and the collector (the records' rewards) import them
from rlvr.orchestration.episode_jobs import PoolToolRunner as PoolToolRunner
from rlvr.orchestration.episode_rewards import episode_reward, primary_verifier
from rlvr.orchestration.episode_rewards import is_episode as is_episode
from rlvr.orchestration.episode_rewards import sample_episode_reward as sample_episode_reward
from rlvr.telemetry.logs import get_logger
from rlvr.types import Group, PromptRequest, Sample

logger = get_logger(__name__)

SEED_STRIDE_EPISODE, SEED_STRIDE_TURN = 7919, 104729


@dataclass
class _Episode:
    index: int
    attempt: int
    env: Environment | None  # None: its environment could not start (the episode is done, "env_error")
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
    incarnation: int
    version: int  # the policy version when the group was admitted
    episodes: list[_Episode] = field(default_factory=list)


_MISSING = object()
TURN_ID = re.compile(r"~g\d+\.ep\d+\.\d+\.\d+$")
"""A turn request id: `<prompt_id>~g<incarnation>.ep<k>.<attempt>.<turn>`."""


def _turn_id(group: _Group, e: _Episode) -> str:
    return f"{group.request.prompt_id}~g{group.incarnation}.ep{e.index}.{e.attempt}.{e.turn}"


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
        self.job_queue = JobQueue(tools, clock)  # the episodes' tool jobs on their way through `tools`
        self.finished: list[Group] = []
        self.counts = {"restarts": 0, "lost_jobs": 0, "groups": 0}
        self.version = -1  # the newest policy version known (`note_version`, the engines' samples)
        self._incarnations = itertools.count()

    # ---------------------------------------------------------------- feeder API
    def route(self, request: PromptRequest) -> str | None:
        """The environment `request` runs, or None (single-turn)."""
        return self.settings.route(request.metadata)

    def owns(self, prompt_id: str) -> bool:
        """Whether a sample id is one of this runner's turn requests (current or stale)."""
        return prompt_id in self.turns or TURN_ID.search(prompt_id) is not None

    def note_version(self, version: int) -> None:
        """The policy version now (the learner's step while collecting, the eval's step): groups started from
        now on are admitted under it."""
        self.version = max(self.version, version)

    def start(self, request: PromptRequest, name: str, engine: int) -> list[PromptRequest]:
        """Begin G episodes of `request` on `engine`; returns their first turn requests."""
        md = request.metadata  # the row's raw prompt (rendered exactly once, by the first observation)
        row = {**md, "prompt": md[ROW_PROMPT] if ROW_PROMPT in md else md.get("prompt") or request.prompt_text}
        row["messages"] = md.get(ROW_MESSAGES)
        group = _Group(request, name, engine, row, next(self._incarnations), self.version)
        self.groups[request.prompt_id] = group
        self.counts["groups"] += 1
        out: list[PromptRequest] = []
        for k in range(request.num_samples):
            group.episodes.append(self._new_episode(group, k, attempt=0))
            if not group.episodes[k].done:
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
        self.version = max(self.version, sample.version_start)
        if sample.finish_reason == "abort" and e.attempt < self.max_restarts:
            self.counts["restarts"] += 1
            e = group.episodes[e.index] = self._new_episode(group, e.index, e.attempt + 1)
            out = [] if e.done else self._advance(group, e)
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
        answers, num_lost = self.job_queue.poll()
        self.counts["lost_jobs"] += num_lost
        out: list[PromptRequest] = []
        touched: set[str] = set()
        for entry, output in answers:
            group = self.groups.get(entry.pid) if entry is not None else None
            if entry is None or group is None:
                continue  # unknown: a job of a group or attempt that is gone
            e = group.episodes[entry.k]
            if e.done or e.pending is None or e.pending_turn != entry.turn_id:
                continue
            e.outputs[entry.slot] = output
            if any(o is _MISSING for o in e.outputs):
                continue
            pending, outputs = e.pending, e.outputs
            e.pending, e.outputs, e.pending_turn = None, [], ""
            out += self._end_step(group, e, pending, outputs)
            touched.add(entry.pid)
        for pid in touched:
            if pid in self.groups:
                self._maybe_finish(self.groups[pid])
        self.job_queue.send()
        return out

    def engine_of(self, request: PromptRequest) -> int:
        """The engine a turn request goes to: its group's (later turns reuse that engine's prefix cache)."""
        return self.groups[self.turns[request.prompt_id][0]].engine

    def drop(self, prompt_id: str) -> None:
        """Forget a group (its engine was replaced; the prompt is re-queued and starts over), its turns and its
        jobs (cancelled in the pool where it can)."""
        self.groups.pop(prompt_id, None)
        for turn_id in [t for t, (pid, _) in self.turns.items() if pid == prompt_id]:
            del self.turns[turn_id]
        self.job_queue.drop(prompt_id)

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

    @property
    def jobs(self) -> dict[str, JobEntry]:
        """Job id -> its episode, turn, slot and deadline, for every job not answered yet (`JobQueue.jobs`)."""
        return self.job_queue.jobs

    @property
    def queued(self) -> deque[str]:
        """Ids of the jobs waiting for a free slot of the tool runner, oldest first (`JobQueue.queued`)."""
        return self.job_queue.queued

    def metrics(self) -> dict[str, float]:
        """`env/restarts` (aborted turns that restarted their episode) and `env/lost_jobs` (jobs answered by the
        runner's deadline or failed on a dead verifier actor, not by a worker), both since the start; {} before
        the first episode group, so single-turn runs log nothing new."""
        if not self.counts["groups"]:
            return {}
        lost = self.counts["lost_jobs"] + int(getattr(self.tools, "lost", 0))
        return {"env/restarts": float(self.counts["restarts"]), "env/lost_jobs": float(lost)}

    # ---------------------------------------------------------------- the state machine
    def _new_episode(self, group: _Group, k: int, attempt: int) -> _Episode:
        """A fresh episode; one whose environment cannot be made or reset is done at once ("env_error", its
        prompt the request's, no completion)."""
        try:
            env = self.settings.make(group.name)
            ep = start_episode(env, group.row, self.tokens)
        except Exception as err:  # trust boundary: a user environment's bug ends this episode, not the run
            ids = list(group.request.prompt_token_ids)
            ep = Episode(ids, [0] * len(ids), [0.0] * len(ids), [-1] * len(ids), prompt_length=len(ids))
            e = _Episode(k, attempt, None, ep, self.clock())
            self._env_error(group, e, err)
            logger.warning(
                "environment %s failed to start an episode of %s: %s", group.name, group.request.prompt_id, ep.error
            )
            return e
        return _Episode(k, attempt, env, ep, self.clock())

    def _budget(self, e: _Episode) -> int:
        return turn_budget(e.ep, self.settings.limits)

    def _advance(self, group: _Group, e: _Episode) -> list[PromptRequest]:
        """The episode's next turn request, or its end when no room is left."""
        budget = self._budget(e)
        if budget <= 0 and not e.ep.turns:
            return self._finish(group, e, "prompt_too_long")  # the first observation leaves no room for a turn
        if budget <= 0 or e.turn >= self.settings.limits.max_turns:
            return self._finish(group, e, "max_total_tokens" if budget <= 0 else "max_turns")
        req = group.request
        turn_id = _turn_id(group, e)
        seed = req.sampling.seed
        sampling = replace(
            req.sampling,
            max_new_tokens=budget,
            seed=None if seed is None else seed + SEED_STRIDE_EPISODE * e.index + SEED_STRIDE_TURN * e.turn,
            stop_strings=list(req.sampling.stop_strings) + list(getattr(e.env, "stop_strings", None) or []),
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
                begun = e.env.step(text, ids)  # type: ignore[union-attr]  # a plain environment steps here (cheap)
        except Exception as err:  # trust boundary: a user environment's bug ends this episode, not the run
            return self._env_error(group, e, err)
        if isinstance(begun, StepResult):
            return self._after_step(group, e, begun)
        if not begun.jobs:  # nothing to run: the step ends now
            return self._end_step(group, e, begun, [])
        turn_id = _turn_id(group, e)
        e.pending, e.outputs, e.pending_turn = begun, [_MISSING] * len(begun.jobs), turn_id
        for slot, job in enumerate(begun.jobs):
            self.job_queue.add(f"{turn_id}/j{slot}", JobEntry(group.request.prompt_id, e.index, turn_id, slot, job))
        self.job_queue.send()
        return []

    def _end_step(self, group: _Group, e: _Episode, pending: PendingStep, outputs: list[Any]) -> list[PromptRequest]:
        try:
            result = e.env.end_step(pending, outputs)  # type: ignore[union-attr]
        except Exception as err:  # trust boundary: a user environment's bug ends this episode, not the run
            return self._env_error(group, e, err)
        return self._after_step(group, e, result)

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
        primary = primary_verifier(req.metadata)
        samples, rewards = [], []
        for e in group.episodes:
            s = episode_to_sample(
                e.ep, req.prompt_id, e.index, group.engine, metadata=dict(req.metadata), admitted=group.version
            )
            s.is_eval = req.is_eval
            s.prompt_text = self.tokens.decode(e.ep.token_ids[: e.ep.prompt_length])
            s.metadata["attempt"] = e.attempt
            samples.append(s)
            rewards.append(episode_reward(e.ep.reward_terms, primary, e.ep.end_reason))
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
    per_actor = JOBS_PER_WORKER * max(1, int(getattr(cfg.rewards, "num_workers", 1) or 1))
    tools = ActorToolRunner(actors, cfg.cluster.actor_timeout_s, per_actor=per_actor)
    return EpisodeRunner(EnvSettings.from_config(cfg.env), tokens, tools)


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
