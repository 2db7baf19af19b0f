"""The torch backend's float32 master weights for bfloat16 models (`learner.fp32_master_weights`).

Without them AdamW writes its update straight into bfloat16 weights, and an update below half a weight's bfloat16
step is rounded away: the model does not move at all at a small learning rate. With them the optimizer owns float32
copies, the update accumulates there, and the model's weights are the copies rounded to bfloat16. The copies are
trainer state: a checkpoint carries them, and resume continues bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlvr.algorithms.packing import PackInput, build_packed_batches
from rlvr.config import default_config, from_dict
from rlvr.data import builtin_corpus
from rlvr.learner.worker import LearnerWorker
from rlvr.models.tiny import build_tiny_model_dir


def _cfg(**learner):
    base = {"backend": "torch", "lr": 1e-5, "warmup_steps": 0, "max_grad_norm": 0.0}
    return from_dict(
        {"model": {"dtype": "bfloat16"}, "learner": {**base, **learner}, "data": {"datasets": ["builtin:copy"]}},
        base=default_config(),
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    cfg = _cfg()
    return str(build_tiny_model_dir(cfg.model, builtin_corpus("copy"), tmp_path_factory.mktemp("m"), cfg.seed))


def _batches(seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    inputs = []
    for i in range(6):
        prompt = torch.randint(3, 14, (4,), generator=g).tolist()
        completion = torch.randint(3, 14, (5,), generator=g).tolist()
        inputs.append(PackInput(i, prompt, completion, [-3.0] * 5, 1.0 if i % 2 else -1.0))
    return build_packed_batches(inputs, pack_length=16, micro_batch_rows=1)  # several micro-batches a step


def _worker(cfg, model_dir: str) -> LearnerWorker:
    return LearnerWorker(cfg, model_dir, 0, 1, "127.0.0.1", 0, "cpu", num_threads=1)


def _weights(w: LearnerWorker) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in w.model.named_parameters()}


def _moved(before: dict[str, torch.Tensor], w: LearnerWorker) -> float:
    """Share of weight elements that differ from `before`."""
    diff = total = 0
    for n, p in w.model.named_parameters():
        diff += int((p.detach() != before[n]).sum())
        total += p.numel()
    return diff / total


def test_small_updates_are_lost_without_master_weights_and_kept_with_them(model_dir) -> None:
    plain, master = _worker(_cfg(fp32_master_weights=False), model_dir), _worker(_cfg(), model_dir)
    start = _weights(plain)
    assert all(torch.equal(start[n], p) for n, p in master.model.named_parameters())  # the same init
    for step in range(8):  # AdamW's update is about lr = 1e-5 a step: far below bfloat16's step for most weights
        plain.train_batch(_batches(step))
        master.train_batch(_batches(step))
    lost, kept = _moved(start, plain), _moved(start, master)  # 0.15 and 0.36 here
    assert kept > 0.3 and kept > 2 * lost  # 8 updates added up in float32 and crossed a bfloat16 step
    assert all(p.dtype == torch.bfloat16 for p in master.model.parameters())


def test_the_optimizer_owns_float32_copies_and_the_model_is_their_rounding(model_dir) -> None:
    w = _worker(_cfg(lr=1e-3), model_dir)
    w.train_batch(_batches(0))
    backend = w.backend
    assert backend.master is not None
    owned = [p for group in backend.optimizer.param_groups for p in group["params"]]
    assert [id(p) for p in owned] == [id(m) for m in backend.master]
    assert all(m.dtype == torch.float32 for m in owned)
    for p, m in zip(backend.params, backend.master, strict=True):
        assert torch.equal(p.detach(), m.detach().to(torch.bfloat16))
        assert p.grad is None and m.grad is None  # cleared after the step


def test_float32_models_need_no_copies(model_dir) -> None:
    cfg = from_dict({"model": {"dtype": "float32"}}, base=_cfg())
    assert _worker(cfg, model_dir).backend.master is None


def test_resume_with_master_weights_is_exact(model_dir, tmp_path: Path) -> None:
    cfg = _cfg(lr=1e-4)
    a = _worker(cfg, model_dir)
    a.train_batch(_batches(0))
    ckpt = tmp_path / "ckpt"
    a.save(str(ckpt / "trainer_state"), str(ckpt), model_dir)
    losses_a = [a.train_batch(_batches(s))["loss/total"] for s in (1, 2)]
    b = _worker(from_dict({"seed": 7}, base=cfg), model_dir)
    b.load(str(ckpt / "trainer_state"), str(ckpt))
    losses_b = [b.train_batch(_batches(s))["loss/total"] for s in (1, 2)]
    assert losses_b == losses_a
    assert a.backend.master is not None and b.backend.master is not None
    for ma, mb in zip(a.backend.master, b.backend.master, strict=True):
        assert torch.equal(ma, mb)  # not re-derived from the bfloat16 weights: those lost the low bits


def test_a_checkpoint_whose_copies_do_not_fit_is_refused(model_dir, tmp_path: Path) -> None:
    w = _worker(_cfg(), model_dir)
    ckpt = tmp_path / "ckpt"
    w.save(str(ckpt / "trainer_state"), str(ckpt), model_dir)
    state_file = ckpt / "trainer_state" / "optimizer.pt"
    state = torch.load(state_file, weights_only=True)
    state["master"] = state["master"][:-1]
    torch.save(state, state_file)
    with pytest.raises(ValueError, match="'master' holds"):
        _worker(_cfg(), model_dir).load(str(ckpt / "trainer_state"), str(ckpt))
