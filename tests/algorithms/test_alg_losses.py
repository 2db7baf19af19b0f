"""Policy losses and aggregations: hand-computed cases and a per-token Python-loop reference (float64)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from rlvr.algorithms.kl import kl_penalty
from rlvr.algorithms.losses import LossConfig, aggregate_loss, policy_loss, resolve_aggregation, surrogate_loss
from rlvr.config import ConfigError, default_config, from_dict, validate

F64 = torch.float64


def _t(values: list[float]) -> torch.Tensor:
    return torch.tensor([values], dtype=F64)


def test_resolve_aggregation() -> None:
    expected = {
        "dapo": "token-mean",
        "grpo": "seq-mean-token-mean",
        "dr_grpo": "seq-mean-token-sum-norm",
        "gspo": "seq-mean-token-mean",
        "cispo": "token-mean",
        "sapo": "token-mean",
    }
    for loss, agg in expected.items():
        assert resolve_aggregation(loss) == agg
        assert resolve_aggregation(loss, "bnpo") == "bnpo"
    with pytest.raises(ValueError, match="algorithm.loss"):
        resolve_aggregation("ppo")
    with pytest.raises(ValueError, match="algorithm.aggregation"):
        resolve_aggregation("dapo", "sum")
    with pytest.raises(ValueError, match="clip_delta"):
        LossConfig(clip_delta=1.0)


def test_clipped_surrogate_hand() -> None:
    lp = _t([math.log(1.5), math.log(0.5), math.log(4.0), math.log(1.1)])
    old, adv, mask = torch.zeros_like(lp), _t([1.0, -1.0, -1.0, 1.0]), torch.ones_like(lp)
    loss, ratio = surrogate_loss(lp, old, adv, mask, LossConfig())
    torch.testing.assert_close(loss, _t([-1.28, 0.8, 4.0, -1.1]))
    torch.testing.assert_close(ratio, _t([1.5, 0.5, 4.0, 1.1]))
    dual, _ = surrogate_loss(lp, old, adv, mask, LossConfig(clip_delta=3.0))
    torch.testing.assert_close(dual, _t([-1.28, 0.8, 3.0, -1.1]))  # dual clip bounds the negative-A loss at 3|A|


def test_dual_clip_delta_must_exceed_the_trust_region() -> None:
    """clip_delta <= 1 + eps_high would bound negative-advantage tokens whose ratio the ordinary clip still allows
    (delta 1.1 < 1.28 cut the gradient of ratios in (1.1, 1.28]): LossConfig and config validation refuse it,
    each naming the flag."""
    for delta in (1.1, 1.28):
        with pytest.raises(ValueError, match=r"1 \+ clip_eps_high.*--algorithm.clip-delta"):
            LossConfig(clip_delta=delta)
        with pytest.raises(ConfigError, match="--algorithm.clip-delta"):
            validate(from_dict({"algorithm": {"clip_delta": delta}}, base=default_config()))
    assert LossConfig(clip_eps_high=0.05, clip_delta=1.1).clip_delta == 1.1  # fine above 1 + eps_high


def test_dual_clip_never_touches_positive_advantages() -> None:
    """Dual clip bounds negative advantages only: a positive-advantage token keeps the ordinary clipped loss."""
    lp = torch.tensor([math.log(1.2), math.log(2.0), math.log(2.0)], dtype=torch.float64, requires_grad=True)
    adv, mask = _t([1.0, 1.0, -1.0]), _t([1.0, 1.0, 1.0])
    loss, _ = surrogate_loss(lp, torch.zeros(3, dtype=torch.float64), adv, mask, LossConfig(clip_delta=1.5))
    torch.testing.assert_close(loss.detach(), _t([-1.2, -1.28, 1.5]))  # plain ratio; eps_high clip; bounded at delta
    loss.sum().backward()
    assert lp.grad is not None and lp.grad[0].item() == pytest.approx(-1.2)  # d(-rho A)/d logp = -rho A
    assert lp.grad[1].item() == 0.0 and lp.grad[2].item() == 0.0


def test_clip_metrics_hand() -> None:
    lp = _t([math.log(1.5), math.log(0.5), math.log(4.0), math.log(1.1)])
    _, m = policy_loss(
        lp,
        torch.zeros_like(lp),
        _t([1.0, -1.0, -1.0, 1.0]),
        torch.ones_like(lp),
        LossConfig(clip_delta=3.0),
        global_num_loss_tokens=4,
        global_num_samples=1,
    )
    assert m["loss/clip_frac_high"] == 0.25 and m["loss/clip_frac_low"] == 0.25 and m["loss/dual_clip_frac"] == 0.25
    assert m["loss/ratio_max"] == pytest.approx(4.0) and m["loss/ratio_min"] == pytest.approx(0.5)
    assert m["loss/ratio_mean"] == pytest.approx((1.5 + 0.5 + 4.0 + 1.1) / 4)


def test_gspo_hand() -> None:
    lp, old = _t([0.1, 0.3, 0.0]), _t([0.0, 0.0, 0.0])
    mask, adv = _t([1.0, 1.0, 0.0]), _t([1.0, 1.0, 1.0])
    loss, ratio = surrogate_loss(lp, old, adv, mask, LossConfig(loss="gspo"), torch.tensor([[0, 0, -1]]))
    s = math.exp(0.2)
    torch.testing.assert_close(ratio[0, :2], torch.tensor([s, s], dtype=F64))
    torch.testing.assert_close(loss[0, :2], torch.tensor([-s, -s], dtype=F64))


def test_cispo_hand_value_and_grad() -> None:
    lp = _t([-1.0, -1.0]).requires_grad_(True)
    old = _t([-3.0, -1.5])  # ratios e^2 (capped at 5) and e^0.5
    loss, _ = surrogate_loss(lp, old, _t([1.0, -2.0]), torch.ones_like(old), LossConfig(loss="cispo"))
    torch.testing.assert_close(loss.detach(), _t([-5.0 * -1.0, -math.exp(0.5) * -2.0 * -1.0]))
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, _t([-5.0, 2.0 * math.exp(0.5)]))  # stopgrad weight: d/dl = -w A


def test_sapo_hand() -> None:
    lp = _t([0.0, 0.0]).requires_grad_(True)
    loss, _ = surrogate_loss(
        lp, torch.zeros(1, 2, dtype=F64), _t([1.0, -1.0]), torch.ones(1, 2), LossConfig(loss="sapo")
    )
    torch.testing.assert_close(loss.detach(), _t([-2.0, 2.0 / 1.05]))
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, _t([-1.0, 1.0]))  # at rho = 1 the gradient is -A, like the plain PG


def test_aggregations_hand() -> None:
    per_token = _t([1.0, 2.0, 3.0, 4.0, 9.0])
    mask = _t([1, 1, 1, 1, 0])
    ids = torch.tensor([[0, 0, 0, 1, -1]])
    kw = dict(global_num_loss_tokens=4, global_num_samples=2, max_completion_length=5, sample_ids=ids)
    assert float(aggregate_loss(per_token, mask, "token-mean", **kw)) == pytest.approx(2.5)
    assert float(aggregate_loss(per_token, mask, "seq-mean-token-mean", **kw)) == pytest.approx(3.0)
    assert float(aggregate_loss(per_token, mask, "seq-mean-token-sum-norm", **kw)) == pytest.approx(1.0)
    assert float(aggregate_loss(per_token, mask, "bnpo", **kw)) == pytest.approx(2.5)
    kw.update(global_num_loss_tokens=8, global_num_samples=4)  # a micro-batch of a bigger step
    assert float(aggregate_loss(per_token, mask, "token-mean", **kw)) == pytest.approx(10 / 8)
    assert float(aggregate_loss(per_token, mask, "seq-mean-token-mean", **kw)) == pytest.approx(6 / 4)
    assert float(aggregate_loss(per_token, mask, "seq-mean-token-sum-norm", **kw)) == pytest.approx(10 / 20)
    assert float(aggregate_loss(per_token, mask, "bnpo", **kw)) == pytest.approx(2.5)
    with pytest.raises(ValueError, match="max_completion_length"):
        aggregate_loss(per_token, mask, "seq-mean-token-sum-norm", global_num_loss_tokens=4, global_num_samples=2)


def test_kl_requires_ref_and_unpacked_default_ids() -> None:
    lp = torch.zeros(2, 3, dtype=F64)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(
            lp, lp, lp, torch.ones_like(lp), LossConfig(kl_beta=0.1), global_num_loss_tokens=6, global_num_samples=2
        )
    loss, _ = policy_loss(
        lp,
        lp,
        _t([1.0, 1.0, 1.0]).expand(2, 3),
        torch.ones_like(lp),
        LossConfig(loss="grpo"),
        global_num_loss_tokens=6,
        global_num_samples=2,
    )
    assert float(loss) == pytest.approx(-1.0)  # unpacked rows: one sample per row


# ---------------------------------------------------------------- loop reference
def _ref_token_loss(
    l: torch.Tensor, o: float, a: float, cfg: LossConfig, seq_ratio: torch.Tensor | None
) -> torch.Tensor:
    rho = torch.exp(l - o) if seq_ratio is None else seq_ratio
    if cfg.loss == "cispo":
        return -min(math.exp(float(l.detach()) - o), cfg.cispo_eps_max) * a * l
    if cfg.loss == "sapo":
        tau = cfg.sapo_tau_pos if a > 0 else cfg.sapo_tau_neg
        return -torch.sigmoid(tau * (rho - 1)) * (4 / tau) * a
    c1 = rho if cfg.clip_delta is None else torch.clamp(rho, max=cfg.clip_delta)
    clipped = torch.clamp(rho, 1 - cfg.clip_eps_low, 1 + cfg.clip_eps_high)
    return -torch.minimum(c1 * a, clipped * a)


def _reference_loss(samples: list[dict], cfg: LossConfig, n_tok: int, n_seq: int) -> torch.Tensor:
    agg = resolve_aggregation(cfg.loss, cfg.aggregation)
    total, local_tokens = torch.zeros((), dtype=F64), 0
    for s in samples:
        idx = [t for t in range(len(s["l"])) if s["m"][t]]
        local_tokens += len(idx)
        if not idx:
            continue
        seq_ratio = None
        if cfg.loss == "gspo":
            seq_ratio = torch.exp(sum(s["l"][t] - s["o"][t] for t in idx) / len(idx))
        token_losses = []
        for t in idx:
            loss_t = _ref_token_loss(s["l"][t], s["o"][t], s["a"], cfg, seq_ratio) * s["w"][t]
            diff = s["l"][t] - s["r"][t]
            loss_t = loss_t + cfg.kl_beta * (torch.exp(-diff) - 1 + diff)
            token_losses.append(loss_t)
        seq_sum = sum(token_losses)
        if agg == "seq-mean-token-mean":
            total = total + seq_sum / len(idx) / n_seq
        elif agg == "token-mean":
            total = total + seq_sum / n_tok
        elif agg == "seq-mean-token-sum-norm":
            total = total + seq_sum / (n_seq * cfg.max_completion_length)
        else:
            total = total + seq_sum
    return total / max(local_tokens, 1) if agg == "bnpo" else total


CONFIGS = [
    LossConfig(loss="dapo"),
    LossConfig(loss="grpo", clip_delta=3.0),
    LossConfig(loss="dr_grpo", max_completion_length=16),
    LossConfig(loss="gspo"),
    LossConfig(loss="cispo", cispo_eps_max=1.5),
    LossConfig(loss="sapo"),
    LossConfig(loss="dapo", aggregation="bnpo", kl_beta=0.3),
    LossConfig(loss="gspo", aggregation="token-mean", kl_beta=0.1),
    LossConfig(loss="sapo", aggregation="seq-mean-token-sum-norm", max_completion_length=12, kl_beta=0.2),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.loss}-{c.aggregation}-{c.kl_beta}")
def test_policy_loss_matches_loop_reference(seed: int, cfg: LossConfig) -> None:
    rng = random.Random(seed)
    rows, length = 3, 20
    lp = torch.full((rows, length), 0.0, dtype=F64)
    tensors = {k: torch.zeros(rows, length, dtype=F64) for k in ("o", "a", "r", "w", "m")}
    ids = torch.full((rows, length), -1, dtype=torch.long)
    samples, sid = [], 0
    for r in range(rows):
        pos = 0
        while pos < length - 2 and r != 1:  # row 1 is pure padding
            n = rng.randint(1, min(8, length - pos))
            s = {"l": [], "o": [], "r": [], "w": [], "m": [], "a": rng.gauss(0, 1), "slots": []}
            masked_sample = rng.random() < 0.2  # an all-masked sample
            for t in range(pos, pos + n):
                value = (rng.gauss(-1, 0.5), rng.gauss(-1, 0.5), rng.gauss(-1, 0.5), rng.uniform(0, 2))
                lp[r, t], tensors["o"][r, t], tensors["r"][r, t], tensors["w"][r, t] = value
                tensors["m"][r, t] = 0.0 if masked_sample or rng.random() < 0.2 else 1.0
                tensors["a"][r, t] = s["a"]
                ids[r, t] = sid
                s["slots"].append((r, t))
            samples.append(s)
            pos, sid = pos + n, sid + 1
    lp.requires_grad_(True)
    for s in samples:
        for r, t in s["slots"]:
            s["l"].append(lp[r, t])
            s["o"].append(float(tensors["o"][r, t]))
            s["r"].append(float(tensors["r"][r, t]))
            s["w"].append(float(tensors["w"][r, t]))
            s["m"].append(bool(tensors["m"][r, t]))
    n_tok = int(tensors["m"].sum()) + 3  # pretend other micro-batches exist
    n_seq = sum(any(s["m"]) for s in samples) + 1
    loss, metrics = policy_loss(
        lp,
        tensors["o"],
        tensors["a"],
        tensors["m"],
        cfg,
        global_num_loss_tokens=n_tok,
        global_num_samples=n_seq,
        sample_ids=ids,
        ref_logprobs=tensors["r"],
        is_weights=tensors["w"],
    )
    (grad,) = torch.autograd.grad(loss, lp)
    ref = _reference_loss(samples, cfg, n_tok, n_seq)
    (ref_grad,) = torch.autograd.grad(ref, lp, allow_unused=True)
    torch.testing.assert_close(loss, ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad if ref_grad is not None else torch.zeros_like(lp), rtol=1e-10, atol=1e-12)
    assert all(math.isfinite(v) for v in metrics.values())
    if cfg.kl_beta > 0:
        m = tensors["m"].bool()
        assert metrics["loss/kl"] == pytest.approx(float(kl_penalty(lp.detach(), tensors["r"])[m].mean()))


def test_entropy_bonus_enters_only_with_coef() -> None:
    lp = torch.zeros(1, 3, dtype=F64)
    ent = torch.ones(1, 3, dtype=F64)
    kw = dict(global_num_loss_tokens=3, global_num_samples=1, entropy=ent)
    base, m = policy_loss(lp, lp, lp, torch.ones_like(lp), LossConfig(), **kw)
    bonus, _ = policy_loss(lp, lp, lp, torch.ones_like(lp), LossConfig(entropy_coef=0.1), **kw)
    assert float(base) == 0.0 and float(bonus) == pytest.approx(-0.1) and m["loss/entropy"] == 1.0
