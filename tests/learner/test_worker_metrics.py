"""The learner's step metrics are reduced by their type: `loss/total` is the step's true loss, whatever the packing.

Each micro-batch's loss is its share of the optimizer step's loss (global normalisers), so the step loss is the SUM
of the shares; averaging them (the old code) divided it by the number of micro-batches. The same samples packed
into one micro-batch or into six must report the same `loss/total`.
"""

from __future__ import annotations

import pytest
import torch

from rlvr.algorithms.packing import PackInput, build_packed_batches
from rlvr.config import default_config, from_dict
from rlvr.data import builtin_corpus
from rlvr.learner.worker import LearnerWorker
from rlvr.models.tiny import build_tiny_model_dir


def _cfg():
    return from_dict(
        {"learner": {"backend": "torch", "lr": 0.0, "warmup_steps": 0}, "data": {"datasets": ["builtin:copy"]}},
        base=default_config(),
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    cfg = _cfg()
    return str(build_tiny_model_dir(cfg.model, builtin_corpus("copy"), tmp_path_factory.mktemp("m"), cfg.seed))


def _inputs() -> list[PackInput]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(6):
        prompt = torch.randint(3, 14, (4,), generator=g).tolist()
        completion = torch.randint(3, 14, (5 + i,), generator=g).tolist()
        out.append(PackInput(i, prompt, completion, [-3.0] * len(completion), 1.0 if i % 2 else -0.5))
    return out


def _loss(model_dir: str, micro_batch_rows: int, pack_length: int) -> tuple[float, int]:
    w = LearnerWorker(_cfg(), model_dir, 0, 1, "127.0.0.1", 0, "cpu", num_threads=1)
    batches = build_packed_batches(_inputs(), pack_length=pack_length, micro_batch_rows=micro_batch_rows)
    return w.train_batch(batches)["loss/total"], len(batches[0].micro_batches)


def test_loss_total_is_the_step_loss_not_a_micro_batch_average(model_dir) -> None:
    one, n_one = _loss(model_dir, micro_batch_rows=8, pack_length=128)  # everything in one micro-batch
    many, n_many = _loss(model_dir, micro_batch_rows=1, pack_length=16)  # one sample per micro-batch
    assert n_one == 1 and n_many == 6
    assert abs(one) > 1e-3
    assert many == pytest.approx(one, rel=1e-4, abs=1e-6)
