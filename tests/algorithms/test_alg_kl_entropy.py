"""KL estimators (Schulman) and chunked entropy: hand cases and loop references."""

from __future__ import annotations

import math

import pytest
import torch

from rlvr.algorithms.entropy import entropy_from_logits
from rlvr.algorithms.kl import kl_needed, kl_penalty


def test_kl_hand() -> None:
    lp, ref = torch.tensor([0.0, -1.0], dtype=torch.float64), torch.tensor([-0.5, -1.0], dtype=torch.float64)
    torch.testing.assert_close(kl_penalty(lp, ref, "k1"), torch.tensor([0.5, 0.0], dtype=torch.float64))
    torch.testing.assert_close(kl_penalty(lp, ref, "k2"), torch.tensor([0.125, 0.0], dtype=torch.float64))
    torch.testing.assert_close(
        kl_penalty(lp, ref, "k3"), torch.tensor([math.exp(-0.5) - 1 + 0.5, 0.0], dtype=torch.float64)
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_loop_and_clamp(seed: int, estimator: str) -> None:
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(50, generator=g, dtype=torch.float64) * 30
    ref = torch.randn(50, generator=g, dtype=torch.float64) * 30
    out = kl_penalty(lp, ref, estimator)  # type: ignore[arg-type]
    for i in range(50):
        d = max(-40.0, min(40.0, float(lp[i]) - float(ref[i])))
        expected = {"k1": d, "k2": d * d / 2, "k3": math.exp(-d) - 1 + d}[estimator]
        assert float(out[i]) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert torch.isfinite(out).all()


def test_kl_k3_nonnegative_and_errors() -> None:
    lp = torch.randn(100, dtype=torch.float64)
    assert (kl_penalty(lp, lp.flip(0), "k3") >= 0).all()
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_penalty(lp, lp, "k4")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        kl_penalty(lp, lp[:3])
    assert not kl_needed(0.0) and kl_needed(0.1)
    with pytest.raises(ValueError):
        kl_needed(-1.0)


def test_entropy_hand_uniform() -> None:
    out = entropy_from_logits(torch.zeros(2, 3, 8, dtype=torch.float64))
    torch.testing.assert_close(out, torch.full((2, 3), math.log(8), dtype=torch.float64))


@pytest.mark.parametrize("chunk_size", [1, 3, 100])
def test_entropy_loop_reference(chunk_size: int) -> None:
    logits = torch.randn(2, 7, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(chunk_size))
    out = entropy_from_logits(logits, temperature=0.7, chunk_size=chunk_size)
    for b in range(2):
        for t in range(7):
            z = [float(v) / 0.7 for v in logits[b, t]]
            norm = math.log(sum(math.exp(v) for v in z))
            expected = -sum(math.exp(v - norm) * (v - norm) for v in z)
            assert float(out[b, t]) == pytest.approx(expected, rel=1e-12)


def test_entropy_grad_only_when_requested() -> None:
    logits = torch.randn(2, 4, 6, requires_grad=True)
    assert not entropy_from_logits(logits).requires_grad
    out = entropy_from_logits(logits, requires_grad=True)
    out.sum().backward()
    assert logits.grad is not None
    assert entropy_from_logits(torch.randn(1, 0, 4)).shape == (1, 0)
