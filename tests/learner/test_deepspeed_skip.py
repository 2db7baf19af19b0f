"""A skipped optimizer step leaves nothing behind in DeepSpeed: real ZeRO-2 and ZeRO-3 on CPU/gloo, 2 ranks.

When one rank's loss is non-finite every rank skips the step. The other rank's gradients of that step are finite and
have already been reduced into ZeRO's gradient partitions, and those live inside DeepSpeed, not in `param.grad`. If
the skip only dropped `param.grad`, the next step would apply them on top of its own. So a run of steps 1, 2 (skipped
by a NaN on rank 0), 3 must end with exactly the weights of a run of steps 1 and 3 alone.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from two_ranks import rank_result, run_two_ranks

from rlvr.config import default_config, from_dict
from rlvr.data import builtin_corpus
from rlvr.models.tiny import build_tiny_model_dir

OVERRIDES = {
    "learner": {"backend": "deepspeed", "zero_stage": 2, "lr": 1e-2, "warmup_steps": 0},
    "data": {"datasets": ["builtin:copy"]},
}

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    from rlvr.algorithms.packing import PackInput, build_packed_batches
    from rlvr.config import default_config, from_dict
    from rlvr.learner.worker import LearnerWorker

    model_dir, port, rank, out, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[5], sys.argv[6]
    cfg = from_dict(json.loads(sys.argv[4]), base=default_config())
    w = LearnerWorker(cfg, model_dir, rank, 2, "127.0.0.1", port, "cpu", num_threads=1)

    def batches(step):
        g = torch.Generator().manual_seed(100 * step + rank)
        inputs = [PackInput(i, torch.randint(3, 14, (4,), generator=g).tolist(),
                            torch.randint(3, 14, (6,), generator=g).tolist(), [-3.0] * 6, 1.0 if i % 2 else -1.0)
                  for i in range(4)]
        return build_packed_batches(inputs, pack_length=10, micro_batch_rows=1)  # 4 micro-batches per rank

    skipped = []
    for step in [int(s) for s in steps.split(",")]:
        skipped.append(w.train_batch(batches(step))["learner/skipped_steps"])
    weights = {n: t.detach().clone() for n, t in w.named_weights()}  # whole tensors (gathered under ZeRO-3)
    if rank == 0:
        torch.save(weights, out)
    print("RESULT " + json.dumps({"rank": rank, "skipped": skipped}), flush=True)
    torch.distributed.barrier()
    w.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's teardown of DeepSpeed's gloo groups (see test_zero3_gather.py)
""")


def _run(model_dir: str, out: Path, steps: str, fault_on_rank0: str | None, stage: int) -> list[dict]:
    overrides = {**OVERRIDES, "learner": {**OVERRIDES["learner"], "zero_stage": stage}}
    outs = run_two_ranks(
        SCRIPT,
        lambda port, rank: [model_dir, port, str(rank), json.dumps(overrides), str(out), steps],
        timeout_s=240,
        rank_env={0: {"RLVR_INJECT_FAULTS": fault_on_rank0}} if fault_on_rank0 else None,
    )
    return [rank_result(o) for o in outs]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage", [2, 3])
def test_a_skipped_zero_step_leaves_no_gradient_behind(tmp_path: Path, stage: int) -> None:
    cfg = from_dict(OVERRIDES, base=default_config())
    model_dir = str(build_tiny_model_dir(cfg.model, builtin_corpus("copy"), tmp_path / "model", cfg.seed))
    # the fault fires at learner version 2, the second call: steps "1,2,3" skip step 2
    skipped = _run(model_dir, tmp_path / "with_skip.pt", "1,2,3", "nan_loss@2", stage)
    assert sorted(r["rank"] for r in skipped) == [0, 1]
    assert all(r["skipped"] == [0.0, 1.0, 1.0] for r in skipped)  # both ranks skipped step 2, and only it
    _run(model_dir, tmp_path / "without.pt", "1,3", None, stage)
    a, b = torch.load(tmp_path / "with_skip.pt"), torch.load(tmp_path / "without.pt")
    start = _load_start(model_dir)
    assert a.keys() == b.keys() and set(a) <= set(start)
    assert all(a[n].shape == start[n].shape for n in a)  # whole weights, not ZeRO-3's empty partitions
    assert any(not torch.equal(a[n], start[n].to(a[n].dtype)) for n in a)  # the steps did train
    diffs = {n: float((a[n] - b[n]).abs().max()) for n in a}
    assert max(diffs.values()) == 0.0, {n: d for n, d in diffs.items() if d > 0}


def _load_start(model_dir: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state
