"""Multi-turn samples in packing, the losses, correction and shaping: only the policy's tokens carry loss or
count as completion length; token-limit end reasons count as truncation.

Episodes are built with `rlvr.envs.episode.Episode` and turned into `Sample`s by the real
`episode_to_sample`, so the metadata (`completion_loss_mask`, `end_reason`) is what the collector will hand over.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from rlvr.algorithms.advantages import assign_group_advantages
from rlvr.algorithms.correction import CorrectionConfig, importance_weights, staleness_filter
from rlvr.algorithms.entropy import entropy_from_logits
from rlvr.algorithms.filtering import filter_groups
from rlvr.algorithms.losses import LossConfig, policy_loss, run_max_completion_length
from rlvr.algorithms.packing import PackInput, build_packed_batches, pack_inputs_from_groups, pack_step
from rlvr.algorithms.policy_tokens import completion_mask, is_truncated, num_policy_tokens
from rlvr.algorithms.shaping import ShapingConfig, episode_length_cap, shape_group
from rlvr.config import default_config
from rlvr.envs.engine_turns import episode_to_sample
from rlvr.envs.episode import Episode, TurnRecord
from rlvr.learner.worker import loss_config
from rlvr.types import Group, MicroBatch, PackedBatch, RewardResult, Sample

VOCAB, PACK_LENGTH = 11, 48


def make_episode(
    rng: random.Random, turns: list[tuple[int, int]], end_reason: str = "done", versions: list[int] | None = None
) -> Episode:
    """Prompt, then per turn (generated, observation) token counts; generated tokens get engine log-probs."""
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 4))]
    ep = Episode([], [], [], [], prompt_length=len(prompt))
    ep.append(prompt, generated=False)
    for k, (num_generated, num_observation) in enumerate(turns):
        version = versions[k] if versions else 1
        start = len(ep.token_ids)
        ids = [rng.randrange(VOCAB) for _ in range(num_generated)]
        ep.append(ids, True, [-rng.uniform(0.05, 2.0) for _ in ids], version)
        turn = TurnRecord(start, len(ep.token_ids), version, "stop", "turn")
        if num_observation:
            turn.observation_start = len(ep.token_ids)
            ep.append([rng.randrange(VOCAB) for _ in range(num_observation)], False)
            turn.observation_end = len(ep.token_ids)
        ep.turns.append(turn)
    ep.end_reason = end_reason
    return ep


def make_sample(rng: random.Random, index: int, prompt_id: str = "p") -> Sample:
    turns = [(rng.randint(1, 6), rng.randint(1, 6)) for _ in range(rng.randint(1, 3))]
    turns[-1] = (turns[-1][0], 0)  # the last turn is the answer: no observation after it
    return episode_to_sample(make_episode(rng, turns), prompt_id, sample_index=index)


def _groups(seed: int, num_groups: int = 3, group_size: int = 4) -> list[Group]:
    rng = random.Random(seed)
    groups = []
    for n in range(num_groups):
        samples = [make_sample(rng, i, f"p{n}") for i in range(group_size)]
        rewards = [RewardResult({}, rng.choice([0.0, 1.0, 0.5])) for _ in samples]
        groups.append(Group(f"p{n}", samples, rewards))
    assign_group_advantages(groups)
    return groups


def _policy_positions(sample: Sample) -> list[int]:
    mask = sample.metadata["completion_loss_mask"]
    return [len(sample.prompt_token_ids) + j for j, m in enumerate(mask) if m]


def _find(pb: PackedBatch, sample_id: int) -> tuple[int, int, int]:
    """(micro-batch, row, offset of the sample's first token) of a packed sample."""
    for k, mb in enumerate(pb.micro_batches):
        hits = (mb.sample_ids == sample_id).nonzero()
        if hits.numel():
            return k, int(hits[0, 0]), int(hits[0, 1])
    raise AssertionError(f"sample {sample_id} not packed")


def test_pack_inputs_carry_the_per_token_mask() -> None:
    groups = _groups(0, num_groups=1)
    single = Sample("s", 0, [1, 2], [3, 4, 5], "x", [-0.1] * 3, "stop", 0, 0)
    groups.append(Group("s", [single, single], [RewardResult({}, 1.0)] * 2, [0.0, 0.0]))
    inputs = pack_inputs_from_groups(groups)
    for item, sample in zip(inputs, groups[0].samples):
        assert list(item.completion_mask or []) == sample.metadata["completion_loss_mask"]
        assert 0 < sum(item.completion_mask or []) < len(sample.completion_token_ids)  # both kinds of token
    assert inputs[-1].completion_mask is None  # single-turn: no mask, all tokens are the policy's


def test_loss_mask_advantages_and_engine_logprobs_on_policy_tokens_only() -> None:
    groups = _groups(1)
    groups[1].loss_masks = [True, False, True, True]  # one sample out of the loss (e.g. overlong filtering)
    (per_rank, _) = pack_step(groups, num_mini_batches=1, pack_length=PACK_LENGTH, micro_batch_rows=2)
    (pb,) = per_rank[0]
    samples = [s for g in groups for s in g.samples]
    in_loss = [m for g in groups for m in (g.loss_masks or [True] * g.num_samples)]
    advantages = [a for g in groups for a in g.advantages]
    expected_tokens = 0
    for sid, (sample, keep, adv) in enumerate(zip(samples, in_loss, advantages)):
        k, row, offset = _find(pb, sid)
        mb = pb.micro_batches[k]
        span = slice(offset, offset + sample.num_tokens)
        policy = [offset + p for p in _policy_positions(sample)]
        loss_positions = (mb.loss_mask[row, span].nonzero().flatten() + offset).tolist()
        assert loss_positions == (policy if keep else [])
        expected_tokens += len(policy) if keep else 0
        # one advantage per episode, on its policy tokens and nowhere else
        want_adv = torch.zeros(sample.num_tokens, dtype=mb.advantages.dtype)
        if keep:
            want_adv[[p - offset for p in policy]] = adv
        assert torch.equal(mb.advantages[row, span], want_adv)
        # the engine's log-probs exactly at the policy positions, 0 on prompt and observation tokens
        want_lp = torch.zeros(sample.num_tokens, dtype=mb.engine_logprobs.dtype)
        j_policy = [j for j, m in enumerate(sample.metadata["completion_loss_mask"]) if m]
        want_lp[[p - offset for p in policy]] = torch.tensor([sample.logprobs[j] for j in j_policy])
        assert torch.equal(mb.engine_logprobs[row, span], want_lp)
    assert pb.global_num_loss_tokens == expected_tokens
    assert expected_tokens < sum(len(s.completion_token_ids) for s, k in zip(samples, in_loss) if k)
    assert pb.global_num_samples == sum(in_loss)


def test_an_all_ones_mask_packs_exactly_like_a_single_turn_sample() -> None:
    rng = random.Random(2)
    plain = []
    for i in range(9):
        p, c = rng.randint(0, 4), rng.randint(1, 8)
        plain.append(PackInput(i, [5] * p, [6] * c, [-0.1 * j for j in range(c)], rng.gauss(0, 1), rng.random() > 0.2))
    masked = [replace(x, completion_mask=[1] * len(x.completion_token_ids)) for x in plain]
    a = build_packed_batches(plain, pack_length=12, num_ranks=2, micro_batch_rows=2)
    b = build_packed_batches(masked, pack_length=12, num_ranks=2, micro_batch_rows=2)
    for pa, pb in zip(a, b):
        assert (pa.global_num_loss_tokens, pa.global_num_samples) == (pb.global_num_loss_tokens, pb.global_num_samples)
        for x, y in zip(pa.micro_batches, pb.micro_batches):
            for name in ("input_ids", "position_ids", "advantages", "engine_logprobs", "loss_mask", "sample_ids"):
                assert torch.equal(getattr(x, name), getattr(y, name)), name


def test_bad_masks_name_the_field() -> None:
    sample = make_sample(random.Random(3), 0)
    sample.metadata["completion_loss_mask"] = sample.metadata["completion_loss_mask"][:-1]
    with pytest.raises(ValueError, match="completion_loss_mask.*entries"):
        completion_mask(sample)
    with pytest.raises(ValueError, match="completion_loss_mask.*entries"):
        build_packed_batches([PackInput(0, [1], [2, 3], [-0.1, -0.2], 1.0, True, [1])], pack_length=8)
    with pytest.raises(ValueError, match="completion_loss_mask.*0 and 1"):
        build_packed_batches([PackInput(0, [1], [2, 3], [-0.1, -0.2], 1.0, True, [1, 2])], pack_length=8)


def test_policy_token_count() -> None:
    ep = make_episode(random.Random(4), [(3, 5), (2, 0)])
    sample = episode_to_sample(ep, "p")
    assert num_policy_tokens(sample) == 5 == sample.metadata["episode_metrics"]["generated_tokens"]
    assert num_policy_tokens(Sample("s", 0, [1], [2, 3, 4], "x", [0.0] * 3, "stop", 0, 0)) == 3


# ------------------------------------------------------------------ the loss sees the policy tokens only


def _logprobs(table: torch.Tensor, ids: torch.Tensor, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Aligned log-probs and entropies of a bigram model whose logits at position t are table[ids[t-1]] + noise."""
    logits = table[ids[:, :-1]] + noise[:, 1:]
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = entropy_from_logits(logits, requires_grad=True)
    zeros = torch.zeros(ids.shape[0], 1, dtype=table.dtype)
    return torch.cat([zeros, lp], 1), torch.cat([zeros, ent], 1)


CONFIGS = [
    (LossConfig(loss=loss, aggregation=agg, kl_beta=0.05, entropy_coef=0.01, max_completion_length=20), tis)
    for loss, agg, tis in [
        ("dapo", "token-mean", "token"),
        ("grpo", "seq-mean-token-mean", "token_mask"),
        ("gspo", "seq-mean-token-mean", "sequence_mask"),
        ("dr_grpo", "seq-mean-token-sum-norm", "token"),
        ("cispo", "token-mean", "sequence_mask"),
        ("sapo", "token-mean", "off"),
    ]
]


def _token_kinds(mb: MicroBatch, samples: list[Sample], in_loss: list[bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """(policy, observation) bool masks of a micro-batch, read off the samples' metadata (not the packer's mask):
    policy = completion tokens the policy generated, of samples in the loss; observation = tool tokens."""
    policy = torch.zeros_like(mb.loss_mask)
    observation = torch.zeros_like(mb.loss_mask)
    for r, t in (mb.sample_ids >= 0).nonzero().tolist():
        sid = int(mb.sample_ids[r, t])
        offset = int((mb.sample_ids[r] == sid).nonzero()[0])
        j = t - offset - len(samples[sid].prompt_token_ids)
        if j >= 0:
            generated = bool(samples[sid].metadata["completion_loss_mask"][j])
            policy[r, t] = generated and in_loss[sid]
            observation[r, t] = not generated
    return policy, observation


def _step(
    table: torch.Tensor,
    batch: PackedBatch,
    samples: list[Sample],
    in_loss: list[bool],
    config: LossConfig,
    tis: str,
    noise_scale: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, ...]]]:
    """Step loss, table gradient and per micro-batch (policy, lp, old, engine, adv, ref, entropy) of one rank.

    With `noise_scale`, what the loss reads is perturbed on the observation tokens: the logits there (so the
    learner's log-prob and entropy), the old and the reference log-probs."""
    table = table.detach().clone().requires_grad_(True)
    gen = torch.Generator().manual_seed(7)
    total, parts = torch.zeros((), dtype=table.dtype), []
    for mb in batch.micro_batches:
        policy, observation = _token_kinds(mb, samples, in_loss)
        obs = observation.to(table.dtype)
        noise = noise_scale * torch.randn(*mb.input_ids.shape, VOCAB, generator=gen, dtype=table.dtype)
        lp, ent = _logprobs(table, mb.input_ids, noise * obs[..., None])
        shift = torch.rand(mb.input_ids.shape, generator=gen, dtype=table.dtype)
        old = lp.detach() - 0.3 * shift + noise_scale * obs * shift
        ref = lp.detach() + 0.2 * shift - noise_scale * obs
        corr = CorrectionConfig(tis, 2.0, 0.1)
        weights, _ = importance_weights(old, mb.engine_logprobs, mb.loss_mask, corr, mb.sample_ids)
        loss, _ = policy_loss(
            lp,
            old,
            mb.advantages,
            mb.loss_mask,
            config,
            global_num_loss_tokens=batch.global_num_loss_tokens,
            global_num_samples=batch.global_num_samples,
            sample_ids=mb.sample_ids,
            ref_logprobs=ref,
            is_weights=weights,
            entropy=ent,
        )
        total = total + loss
        parts.append((policy, old, mb.engine_logprobs, mb.advantages, ref))
    total.backward()
    assert table.grad is not None
    return total.detach(), table.grad, parts


def _batch(seed: int, garbage_on_observations: bool = False) -> tuple[PackedBatch, list[Sample], list[bool]]:
    groups = _groups(seed)
    groups[0].loss_masks = [True, True, False, True]
    samples = [s for g in groups for s in g.samples]
    if garbage_on_observations:  # engine log-probs that observation tokens never have: they must not matter
        rng = random.Random(seed + 100)
        for s in samples:
            s.logprobs = [
                x if m else rng.uniform(-9, 3) for x, m in zip(s.logprobs, s.metadata["completion_loss_mask"])
            ]
    in_loss = [m for g in groups for m in (g.loss_masks or [True] * g.num_samples)]
    (per_rank, _) = pack_step(groups, num_mini_batches=1, pack_length=PACK_LENGTH, micro_batch_rows=2)
    return per_rank[0][0], samples, in_loss


@pytest.mark.parametrize("config,tis", CONFIGS, ids=[f"{c.loss}-{t}" for c, t in CONFIGS])
def test_observation_tokens_have_no_effect_on_loss_or_gradient(config: LossConfig, tis: str) -> None:
    table = torch.randn(VOCAB, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    base_loss, base_grad, _ = _step(table, *_batch(5), config, tis)
    loss, grad, _ = _step(table, *_batch(5, garbage_on_observations=True), config, tis, noise_scale=3.0)
    assert abs(float(base_loss)) > 1e-6
    torch.testing.assert_close(loss, base_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, base_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("config,tis", CONFIGS, ids=[f"{c.loss}-{t}" for c, t in CONFIGS])
def test_the_loss_is_the_loss_of_the_policy_tokens_alone(config: LossConfig, tis: str) -> None:
    """The packed multi-turn loss equals the loss of unpacked rows holding nothing but each sample's policy
    tokens (one row per sample, global counts of policy tokens only): the token counts, GSPO's sequence ratio
    and the TIS sequence mask must all ignore the observations."""
    table = torch.randn(VOCAB, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    batch, samples, in_loss = _batch(6)
    loss, grad, parts = _step(table, batch, samples, in_loss, config, tis)
    table2 = table.detach().clone().requires_grad_(True)
    rows: dict[int, list[list[torch.Tensor]]] = {}  # sample id -> its policy tokens' values, in order
    for mb, (policy, old, eng, adv, ref) in zip(batch.micro_batches, parts):
        lp, ent = _logprobs(table2, mb.input_ids, torch.zeros(*mb.input_ids.shape, VOCAB, dtype=table.dtype))
        for r, t in policy.nonzero().tolist():
            values = [lp[r, t], old[r, t], eng[r, t], adv[r, t], ref[r, t], ent[r, t]]
            rows.setdefault(int(mb.sample_ids[r, t]), []).append(values)
    assert len(rows) == sum(in_loss)
    width = max(map(len, rows.values()))
    cols: list[list[torch.Tensor]] = [[] for _ in range(6)]
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    zero = torch.zeros((), dtype=table.dtype)
    for i, tokens in enumerate(rows.values()):
        mask[i, : len(tokens)] = True
        for c in range(6):
            cols[c].append(torch.stack([tok[c] for tok in tokens] + [zero] * (width - len(tokens))))
    lp_c, old_c, eng_c, adv_c, ref_c, ent_c = (torch.stack(col) for col in cols)
    row_ids = torch.arange(len(rows))[:, None].expand(-1, width)
    weights, _ = importance_weights(old_c, eng_c, mask, CorrectionConfig(tis, 2.0, 0.1), row_ids)
    ref_loss, _ = policy_loss(
        lp_c,
        old_c,
        adv_c,
        mask,
        config,
        global_num_loss_tokens=int(mask.sum()),
        global_num_samples=len(rows),
        ref_logprobs=ref_c,
        is_weights=weights,
        entropy=ent_c,
    )
    ref_loss.backward()
    assert abs(float(loss)) > 1e-6
    torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-10, atol=1e-12)
    assert table2.grad is not None
    torch.testing.assert_close(grad, table2.grad, rtol=1e-8, atol=1e-12)


def test_staleness_counts_from_the_oldest_turn() -> None:
    """A sample's staleness is measured from its oldest turn's weights (`version_start`), the conservative end."""
    ep = make_episode(random.Random(8), [(2, 3), (2, 3), (2, 0)], versions=[3, 4, 6])
    sample = episode_to_sample(ep, "p")
    assert (sample.version_start, sample.version_end) == (3, 6)
    keep, metrics = staleness_filter([sample.version_start], learner_step=6, max_staleness=2)
    assert keep == [False] and metrics["rollout/staleness_max"] == 3.0


# ------------------------------------------------------------------ shaping, filtering and advantages

END_REASONS = ["done", "turn_length", "max_total_tokens", "max_turns", "tool_error", "env_error"]


def _sample(end_reason: str, turns: list[tuple[int, int]], index: int = 0, seed: int = 0) -> Sample:
    return episode_to_sample(make_episode(random.Random(seed), turns, end_reason), "p", sample_index=index)


@pytest.mark.parametrize("reason", END_REASONS)
def test_token_limits_are_truncations(reason: str) -> None:
    sample = _sample(reason, [(3, 4), (2, 0)])
    truncated = reason in ("turn_length", "max_total_tokens")
    assert is_truncated(sample) is truncated
    # read from end_reason itself, not only through the finish_reason episode_to_sample derives from it
    sample.finish_reason = "stop"
    assert is_truncated(sample) is truncated
    config = ShapingConfig(max_completion_length=50, non_stop_penalty=-1.0, mask_truncated=True)
    group = Group("p", [sample, _sample("done", [(2, 0)], 1)], [RewardResult({}, 1.0), RewardResult({}, 0.0)])
    metrics = shape_group(group, config)
    assert metrics["rollout/num_truncated"] == float(truncated)
    assert group.loss_masks == [not truncated, True]
    assert group.rewards[0].total == (-1.0 if truncated else 1.0)


def test_single_turn_truncation_unchanged() -> None:
    sample = Sample("p", 0, [1], [2] * 4, "x", [-0.1] * 4, "length", 0, 0)
    assert is_truncated(sample)
    assert not is_truncated(Sample("p", 0, [1], [2] * 4, "x", [-0.1] * 4, "stop", 0, 0))


def test_overlong_penalty_counts_generated_tokens_only() -> None:
    # Lmax = 10, buffer 4: no penalty up to 6 tokens, (6 - L) / 4 up to 10, -1 beyond
    short = _sample("done", [(3, 20), (3, 0)], 0)  # 6 policy tokens, 20 observation tokens: no penalty
    long = _sample("done", [(4, 2), (4, 0)], 1, seed=1)  # 8 policy tokens: -0.5
    assert len(short.completion_token_ids) == 26 and short.metadata["episode_metrics"]["generated_tokens"] == 6
    group = Group("p", [short, long], [RewardResult({}, 1.0), RewardResult({}, 1.0)])
    shape_group(group, ShapingConfig(max_completion_length=10, overlong_buffer=4, overlong_penalty=1.0))
    assert [r.total for r in group.rewards] == [1.0, 0.5]


def test_advantages_and_filtering_are_per_episode() -> None:
    samples = [_sample("done", [(2, 5), (2, 0)], i, seed=i) for i in range(4)]
    group = Group("p", samples, [RewardResult({}, r) for r in (1.0, 0.0, 0.0, 1.0)])
    same = Group("q", samples, [RewardResult({}, 1.0)] * 4)
    kept, metrics = filter_groups([group, same])
    assert kept == [group] and metrics["data/groups_all_correct"] == 1.0
    assign_group_advantages([group])
    assert len(group.advantages) == 4  # one per episode, whatever its number of turns and tokens
    assert group.advantages[0] == pytest.approx(group.advantages[3])
    assert group.advantages[0] > 0 > group.advantages[1]


def test_episodes_are_shaped_against_the_episode_lmax_single_turn_rows_against_theirs() -> None:
    # single-turn Lmax 10, episode Lmax 40 (buffer 4): 12 policy tokens are over the single-turn limit only
    episode = _sample("done", [(6, 3), (6, 0)], 0)
    single = Sample("p", 1, [1], [2] * 12, "x", [-0.1] * 12, "stop", 0, 0)
    forged = Sample("p", 2, [1], [2] * 12, "x", [-0.1] * 12, "stop", 0, 0, metadata={"end_reason": "done"})
    group = Group("p", [episode, single, forged], [RewardResult({}, 1.0) for _ in range(3)])
    config = ShapingConfig(
        max_completion_length=10, overlong_buffer=4, overlong_penalty=1.0, episode_max_completion_length=40
    )
    shape_group(group, config)
    assert [r.total for r in group.rewards] == [1.0, 0.0, 0.0]  # metadata alone does not make an episode


def test_the_run_lmax_holds_an_episode_where_the_config_runs_episodes() -> None:
    cfg = default_config()
    cfg.generation.max_new_tokens = 128
    cfg.env.max_turns, cfg.env.max_tokens_per_turn, cfg.env.max_total_tokens = 4, 100, 2048
    assert run_max_completion_length(cfg) == 128  # no episodes: the single-turn limit, as before
    assert (
        ShapingConfig.from_config(cfg.algorithm, 128, episode_length_cap(cfg.env)).episode_max_completion_length == 400
    )
    cfg.env.name = "tool"
    assert run_max_completion_length(cfg) == 400 == episode_length_cap(cfg.env)
    cfg.env.max_total_tokens = 300  # the transcript cap binds first
    assert run_max_completion_length(cfg) == 300
    assert loss_config(cfg).max_completion_length == 300  # the learner's Dr. GRPO normaliser
