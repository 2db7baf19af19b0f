"""Benchmark of rlvr's algorithm core on CPU; prints ONE JSON line.

- packing: first-fit-decreasing + rank balancing + tensor building for completions whose lengths follow a
  lognormal distribution clipped to [1k, 32k] tokens (pack_length 32768, 8 ranks): samples/s and packing
  efficiency (real tokens / rows * pack_length).
- loss: policy_loss (DAPO token-mean and GRPO seq-mean-token-mean, TIS + k3 KL) forward + backward for
  64 samples of up to 4096 tokens, packed into rows of 4096, against the naive padded baseline
  ([64, 4096] rows, one sample per row) measured in the same run.
Run: python bench/algorithms.py   (about 30 s on 2 CPU cores)
"""

from __future__ import annotations

import json
import random
import statistics
import time

import torch

from rlvr.algorithms.correction import importance_weights
from rlvr.algorithms.losses import LossConfig, policy_loss
from rlvr.algorithms.packing import PackInput, build_packed_batches, first_fit_decreasing


def _lognormal_lengths(n: int, low: int, high: int, seed: int, mu: float = 8.3, sigma: float = 0.9) -> list[int]:
    rng = random.Random(seed)
    return [min(high, max(low, int(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def _inputs(lengths: list[int], prompt_length: int) -> list[PackInput]:
    out = []
    for i, total in enumerate(lengths):
        completion = total - prompt_length
        out.append(PackInput(i, [1] * prompt_length, [2] * completion, [-0.5] * completion, 1.0 - 2 * (i % 2)))
    return out


def bench_packing() -> dict[str, float]:
    lengths = _lognormal_lengths(1024, 1024, 32768, seed=0)
    inputs = _inputs(lengths, prompt_length=256)
    start = time.perf_counter()
    bins = first_fit_decreasing(lengths, 32768)
    ffd_s = time.perf_counter() - start
    start = time.perf_counter()
    batches = build_packed_batches(inputs, pack_length=32768, num_ranks=8, micro_batch_rows=1)
    build_s = time.perf_counter() - start
    return {
        "pack_num_samples": float(len(lengths)),
        "pack_mean_tokens": statistics.mean(lengths),
        "pack_num_rows": float(len(bins)),
        "pack_efficiency": batches[0].metrics["perf/packing_efficiency"],
        "pack_rank_token_imbalance": batches[0].metrics["perf/rank_token_imbalance"],
        "pack_ffd_samples_per_s": len(lengths) / ffd_s,
        "pack_build_samples_per_s": len(lengths) / build_s,
    }


def _time_loss(tensors: dict[str, torch.Tensor], config: LossConfig, n_tok: int, n_seq: int, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        lp = tensors["lp"].clone().requires_grad_(True)
        start = time.perf_counter()
        weights, _ = importance_weights(lp.detach(), tensors["gen"], tensors["mask"], sample_ids=tensors["ids"])
        loss, _ = policy_loss(
            lp,
            tensors["old"],
            tensors["adv"],
            tensors["mask"],
            config,
            global_num_loss_tokens=n_tok,
            global_num_samples=n_seq,
            sample_ids=tensors["ids"],
            ref_logprobs=tensors["ref"],
            is_weights=weights,
        )
        loss.backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _random_tensors(ids: torch.Tensor, mask: torch.Tensor, adv: torch.Tensor) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(ids.shape, generator=g) * 3
    noise = lambda: torch.randn(ids.shape, generator=g) * 0.1  # noqa: E731
    return {
        "lp": lp,
        "old": lp + noise(),
        "gen": lp + noise(),
        "ref": lp + noise(),
        "mask": mask,
        "adv": adv,
        "ids": ids,
    }


def bench_loss() -> dict[str, float]:
    lengths = _lognormal_lengths(64, 256, 4096, seed=1, mu=7.3, sigma=0.7)
    inputs = _inputs(lengths, prompt_length=128)
    (batch,) = build_packed_batches(inputs, pack_length=4096, micro_batch_rows=64)
    (mb,) = batch.micro_batches
    packed = _random_tensors(mb.sample_ids, mb.loss_mask, mb.advantages)
    padded_ids = torch.full((64, 4096), -1, dtype=torch.long)
    padded_mask = torch.zeros(64, 4096, dtype=torch.bool)
    padded_adv = torch.zeros(64, 4096)
    for item in inputs:
        padded_ids[item.sample_id, : item.num_tokens] = item.sample_id
        padded_mask[item.sample_id, len(item.prompt_token_ids) : item.num_tokens] = True
        padded_adv[item.sample_id, len(item.prompt_token_ids) : item.num_tokens] = item.advantage
    padded = _random_tensors(padded_ids, padded_mask, padded_adv)
    out: dict[str, float] = {
        "loss_num_samples": 64.0,
        "loss_real_tokens": float(sum(lengths)),
        "loss_packed_rows": float(mb.input_ids.shape[0]),
    }
    for name, config in (
        ("dapo", LossConfig(loss="dapo", kl_beta=0.01)),
        ("grpo", LossConfig(loss="grpo", kl_beta=0.01)),
    ):
        n_tok, n_seq = batch.global_num_loss_tokens, batch.global_num_samples
        out[f"loss_{name}_packed_s"] = _time_loss(packed, config, n_tok, n_seq)
        out[f"loss_{name}_padded_s"] = _time_loss(padded, config, n_tok, n_seq)
        out[f"loss_{name}_speedup"] = out[f"loss_{name}_padded_s"] / out[f"loss_{name}_packed_s"]
    return out


def main() -> None:
    torch.manual_seed(0)
    start = time.perf_counter()
    result: dict[str, float | str] = {"bench": "algorithms", "device": "cpu", "threads": float(torch.get_num_threads())}
    result.update(bench_packing())
    result.update(bench_loss())
    result["wall_s"] = time.perf_counter() - start
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
