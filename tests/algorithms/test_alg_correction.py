"""TIS / IcePop-style masking weights, drift metrics and staleness accounting."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rlvr.algorithms.correction import CorrectionConfig, importance_weights, staleness_filter


def _t(values: list[float]) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64)


def test_token_tis_hand() -> None:
    old, gen = _t([0.0, 0.0, 0.0, 0.0]), _t([0.0, -2.0, 0.5, 0.0])  # ratios 1, e^2, e^-0.5, masked
    mask = _t([1, 1, 1, 0]).bool()
    w, m = importance_weights(old, gen, mask, CorrectionConfig("token", 2.0))
    torch.testing.assert_close(w, _t([1.0, 2.0, math.exp(-0.5), 0.0]))
    assert m["loss/tis_clipped_frac"] == pytest.approx(1 / 3)
    assert m["loss/logprob_drift_max"] == pytest.approx(2.0)
    assert m["loss/logprob_drift_mean"] == pytest.approx(2.5 / 3)
    assert not w.requires_grad


def test_token_mask_hand() -> None:
    old, gen, mask = _t([0.0, 0.0, 0.0]), _t([0.0, -2.0, 1.0]), _t([1, 1, 1]).bool()
    w, m = importance_weights(old, gen, mask, CorrectionConfig("token_mask", 2.0, 0.5))
    torch.testing.assert_close(w, _t([1.0, 0.0, 0.0]))  # e^2 > 2 and e^-1 < 0.5 dropped
    assert m["loss/tis_clipped_frac"] == pytest.approx(2 / 3)


def test_sequence_mask_hand() -> None:
    old = _t([0.0, 0.3, 0.3, 0.0, 0.1, 0.0])
    gen = _t([0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    mask = _t([0, 1, 1, 0, 1, 0]).bool()
    sample_ids = torch.tensor([[0, 0, 0, 1, 1, -1]])
    w, m = importance_weights(old, gen, mask, CorrectionConfig("sequence_mask", 1.5, 0.5), sample_ids)
    # sample 0: exp(0.6) = 1.82 > 1.5 -> masked; sample 1: exp(0.1) kept
    torch.testing.assert_close(w, _t([0, 0, 0, 0, 1, 0]))
    assert m["loss/tis_seq_masked_frac"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="sample_ids"):
        importance_weights(old, gen, mask, CorrectionConfig("sequence_mask"))


def test_off_and_validation() -> None:
    w, _ = importance_weights(_t([0.0, 1.0]), _t([3.0, 0.0]), _t([1, 1]).bool(), CorrectionConfig("off"))
    torch.testing.assert_close(w, _t([1.0, 1.0]))
    with pytest.raises(ValueError, match="tis_mode"):
        importance_weights(_t([0.0]), _t([0.0]), _t([1]).bool(), CorrectionConfig("bogus"))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        importance_weights(_t([0.0]), _t([0.0]), _t([1]).bool(), CorrectionConfig("token", 0.5, 1.0))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("mode", ["token", "token_mask", "sequence_mask"])
def test_loop_reference(seed: int, mode: str) -> None:
    rng = random.Random(seed)
    rows, length = 3, 12
    old = [[rng.gauss(-1, 0.5) for _ in range(length)] for _ in range(rows)]
    gen = [[o + rng.gauss(0, 0.4) for o in row] for row in old]
    mask = [[rng.random() < 0.7 for _ in range(length)] for _ in range(rows)]
    mask[1] = [False] * length  # an empty row
    ids = [[(r * 10 + t // 4) if t < 10 else -1 for t in range(length)] for r in range(rows)]
    mask = [[m and i >= 0 for m, i in zip(mrow, irow)] for mrow, irow in zip(mask, ids)]  # padding never in loss
    cfg = CorrectionConfig(mode, 1.3, 0.8)  # type: ignore[arg-type]
    w, _ = importance_weights(
        torch.tensor(old, dtype=torch.float64),
        torch.tensor(gen, dtype=torch.float64),
        torch.tensor(mask),
        cfg,
        torch.tensor(ids),
    )
    seq_sum: dict[int, float] = {}
    for r in range(rows):
        for t in range(length):
            if mask[r][t]:
                seq_sum[ids[r][t]] = seq_sum.get(ids[r][t], 0.0) + old[r][t] - gen[r][t]
    for r in range(rows):
        for t in range(length):
            ratio = math.exp(old[r][t] - gen[r][t])
            if not mask[r][t]:
                expected = 0.0
            elif mode == "token":
                expected = min(ratio, 1.3)
            elif mode == "token_mask":
                expected = ratio if 0.8 <= ratio <= 1.3 else 0.0
            else:
                expected = 1.0 if 0.8 <= math.exp(seq_sum[ids[r][t]]) <= 1.3 else 0.0
            assert float(w[r, t]) == pytest.approx(expected, rel=1e-12)


def test_staleness() -> None:
    keep, m = staleness_filter([5, 4, 3, 2], learner_step=5, max_staleness=2)
    assert keep == [True, True, True, False]
    assert m == {"rollout/staleness_mean": 1.5, "rollout/staleness_max": 3.0, "rollout/dropped_stale": 1.0}
    assert staleness_filter([5], 5, 0)[0] == [True]
    with pytest.raises(ValueError, match="ahead"):
        staleness_filter([6], 5, 1)
    with pytest.raises(ValueError):
        staleness_filter([1], 5, -1)
