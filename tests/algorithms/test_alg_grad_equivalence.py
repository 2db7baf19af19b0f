"""One optimizer step's gradient is identical (1e-6, float64) whole, in 2 or 4 micro-batches, or over 2 gloo ranks.

The "policy" is a bigram table E [V, V] (logits of token t = E[token t-1]), enough to exercise every path of
policy_loss (surrogate, TIS weights, KL, entropy bonus, aggregation with global normalisers). BNPO normalises
per micro-batch by definition and is exempt.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlvr.algorithms.correction import CorrectionConfig, importance_weights
from rlvr.algorithms.entropy import entropy_from_logits
from rlvr.algorithms.losses import LossConfig, policy_loss
from rlvr.algorithms.packing import PackInput, build_packed_batches
from rlvr.launch.local_cluster import free_port
from rlvr.types import PackedBatch

VOCAB, PACK_LENGTH = 11, 24
CONFIGS = [
    LossConfig(
        loss=loss,
        aggregation=agg,
        clip_delta=3.0,
        kl_beta=0.05,
        entropy_coef=0.01,
        max_completion_length=16,
        cispo_eps_max=1.2,
        clip_eps_low=0.1,
        clip_eps_high=0.1,
    )
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
    for loss in ("dapo", "gspo", "cispo", "sapo")
]


def _table(seed: int = 0) -> torch.Tensor:
    return torch.randn(VOCAB, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _logprobs(table: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Aligned log-probs and entropies: position t from the logits of token t-1 (0 at t = 0)."""
    logits = table[ids[:, :-1]]
    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = entropy_from_logits(logits, requires_grad=True)
    zeros = torch.zeros(ids.shape[0], 1, dtype=table.dtype)
    return torch.cat([zeros, lp], 1), torch.cat([zeros, ent], 1)


def _inputs(seed: int) -> list[PackInput]:
    rng = random.Random(seed)
    table0, gen = _table(1), torch.Generator().manual_seed(seed)
    out = []
    for i in range(14):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 5))]
        completion = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 10))]
        ids = torch.tensor([prompt + completion])
        lp = _logprobs(table0, ids)[0][0, len(prompt) :]
        engine = (lp + torch.randn(len(completion), dtype=torch.float64, generator=gen) * 0.3).tolist()
        out.append(PackInput(i, prompt, completion, engine, rng.gauss(0, 1), in_loss=rng.random() > 0.15))
    return out


def step_grad(table: torch.Tensor, batch: PackedBatch, config: LossConfig) -> torch.Tensor:
    """Sum of the micro-batch gradients of one rank (what gradient accumulation does)."""
    table = table.detach().clone().requires_grad_(True)
    for mb in batch.micro_batches:
        lp, ent = _logprobs(table, mb.input_ids)
        old = mb.engine_logprobs
        weights, _ = importance_weights(old, old * 1.1, mb.loss_mask, CorrectionConfig("token", 1.5), mb.sample_ids)
        loss, _ = policy_loss(
            lp,
            old,
            mb.advantages,
            mb.loss_mask,
            config,
            global_num_loss_tokens=batch.global_num_loss_tokens,
            global_num_samples=batch.global_num_samples,
            sample_ids=mb.sample_ids,
            ref_logprobs=old * 0.9,
            is_weights=weights,
            entropy=ent,
        )
        loss.backward()
    assert table.grad is not None
    return table.grad


def _packed(seed: int, num_ranks: int, micro_batch_rows: int) -> list[PackedBatch]:
    return build_packed_batches(
        _inputs(seed),
        pack_length=PACK_LENGTH,
        num_ranks=num_ranks,
        micro_batch_rows=micro_batch_rows,
        dtype=torch.float64,
    )


def _num_rows(seed: int) -> int:
    return len(_packed(seed, 1, 1)[0].micro_batches)


def _seed_with_rows_multiple_of_4() -> int:
    return next(s for s in range(100) if _num_rows(s) % 4 == 0)


def test_micro_batch_splits_give_same_gradient() -> None:
    seed = _seed_with_rows_multiple_of_4()
    num_rows = _num_rows(seed)
    table = _table()
    for config in CONFIGS:
        whole = _packed(seed, 1, num_rows)[0]
        assert len(whole.micro_batches) == 1
        reference = step_grad(table, whole, config)
        assert reference.abs().sum() > 0
        for parts in (2, 4):
            split = _packed(seed, 1, num_rows // parts)[0]
            assert len(split.micro_batches) == parts
            torch.testing.assert_close(step_grad(table, split, config), reference, rtol=0, atol=1e-6)
            torch.testing.assert_close(step_grad(table, split, config), reference, rtol=1e-9, atol=1e-12)


def test_bnpo_is_not_composable() -> None:
    seed = _seed_with_rows_multiple_of_4()
    num_rows = _num_rows(seed)
    config = LossConfig(loss="dapo", aggregation="bnpo")
    whole = step_grad(_table(), _packed(seed, 1, num_rows)[0], config)
    split = step_grad(_table(), _packed(seed, 1, num_rows // 2)[0], config)
    assert not torch.allclose(whole, split)  # documents why BNPO is exempt


def _worker(rank: int, world_size: int, port: int, seed: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.set_num_threads(1)
        batch = _packed(seed, world_size, 2)[rank]
        grads = []
        for config in CONFIGS:
            grad = step_grad(_table(), batch, config)
            dist.all_reduce(grad, op=dist.ReduceOp.SUM)  # SUM, not mean: the normaliser is already global
            grads.append(grad)
        if rank == 0:
            torch.save(grads, Path(out_dir) / "grads.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_two_gloo_ranks_give_same_gradient(tmp_path: Path) -> None:
    seed = 0
    batches = _packed(seed, 2, 2)
    assert all(any(mb.loss_mask.any() for mb in b.micro_batches) for b in batches)
    mp.spawn(_worker, args=(2, free_port(), seed, str(tmp_path)), nprocs=2, join=True)
    grads = torch.load(tmp_path / "grads.pt")
    for config, grad in zip(CONFIGS, grads):
        reference = step_grad(_table(), _packed(seed, 1, 100)[0], config)
        torch.testing.assert_close(grad, reference, rtol=1e-9, atol=1e-12, msg=f"{config.loss}/{config.aggregation}")
