"""The real learner on packed multi-turn episodes: it trains on the policy's tokens only, against the engine's
log-probs at exactly those positions.

The engine log-probs of every policy token are set to the learner's own teacher-forced log-probs
(`LearnerWorker.score`), observation tokens keep the 0 an episode records. If an observation token entered the
loss, or the engine log-probs were shifted by a position, the logged engine/learner drift would be of the order of
a log-prob (~1), not ~0.
"""

from __future__ import annotations

import random

import pytest

from rlvr.algorithms.advantages import assign_group_advantages
from rlvr.algorithms.packing import pack_step
from rlvr.config import default_config, from_dict
from rlvr.data import builtin_corpus
from rlvr.envs.engine_turns import episode_to_sample
from rlvr.envs.episode import Episode, TurnRecord
from rlvr.learner.worker import LearnerWorker
from rlvr.models.tiny import build_tiny_model_dir
from rlvr.types import Group, RewardResult, Sample


def _cfg():
    return from_dict(
        {"learner": {"backend": "torch", "lr": 0.0, "warmup_steps": 0}, "data": {"datasets": ["builtin:copy"]}},
        base=default_config(),
    )


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> LearnerWorker:
    cfg = _cfg()
    model_dir = build_tiny_model_dir(cfg.model, builtin_corpus("copy"), tmp_path_factory.mktemp("m"), cfg.seed)
    return LearnerWorker(cfg, str(model_dir), 0, 1, "127.0.0.1", 0, "cpu", num_threads=1)


def _episode_sample(rng: random.Random, worker: LearnerWorker, index: int) -> Sample:
    ep = Episode([], [], [], [], prompt_length=4)
    ep.append([rng.randrange(3, 14) for _ in range(4)], generated=False)
    for k in range(3):
        start = len(ep.token_ids)
        ids = [rng.randrange(3, 14) for _ in range(rng.randint(2, 5))]
        ep.append(ids, True, [0.0] * len(ids), version=0)
        turn = TurnRecord(start, len(ep.token_ids), 0, "stop", "")
        if k < 2:
            turn.observation_start = len(ep.token_ids)
            ep.append([rng.randrange(3, 14) for _ in range(rng.randint(3, 6))], generated=False)
            turn.observation_end = len(ep.token_ids)
        ep.turns.append(turn)
    ep.end_reason = "done"
    sample = episode_to_sample(ep, f"p{index // 4}", sample_index=index % 4)
    scores = worker.score(sample.prompt_token_ids, sample.completion_token_ids)
    sample.logprobs = [s if m else 0.0 for s, m in zip(scores, sample.metadata["completion_loss_mask"])]
    return sample


def _train(worker: LearnerWorker, groups: list[Group]) -> dict[str, float]:
    per_rank, _ = pack_step(groups, num_mini_batches=1, pack_length=64, micro_batch_rows=2)
    return dict(worker.train_batch(per_rank[0]))


def test_learner_trains_on_policy_tokens_with_engine_logprobs_at_their_positions(worker: LearnerWorker) -> None:
    rng = random.Random(0)
    samples = [_episode_sample(rng, worker, i) for i in range(8)]
    groups = [
        Group(f"p{n}", samples[4 * n : 4 * n + 4], [RewardResult({}, float(i % 2)) for i in range(4)]) for n in range(2)
    ]
    assign_group_advantages(groups)
    metrics = _train(worker, groups)
    policy = sum(sum(s.metadata["completion_loss_mask"]) for s in samples)
    assert policy < sum(len(s.completion_token_ids) for s in samples)
    assert metrics["loss/num_tokens"] == policy
    assert metrics["loss/logprob_drift_max"] < 1e-3
    assert metrics["loss/tis_clipped_frac"] == 0.0
    assert abs(metrics["loss/total"]) > 1e-6
    # engine log-probs on observation tokens (which have none) change nothing (lr is 0: same weights)
    for s in samples:
        s.logprobs = [x if m else -7.0 for x, m in zip(s.logprobs, s.metadata["completion_loss_mask"])]
    again = _train(worker, groups)
    for key in ("loss/total", "loss/num_tokens", "loss/logprob_drift_max", "loss/tis_weight_mean"):
        assert again[key] == pytest.approx(metrics[key], rel=1e-6, abs=1e-9), key
