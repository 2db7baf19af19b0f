"""ZeRO-3 training with two ranks whose micro-batches differ in length: real DeepSpeed on CPU/gloo, 2 processes.

Under ZeRO-3 every module call gathers that module's parameters (a collective), so each rank must call every module
the same number of times. The log-prob head runs in chunks of `learner.logprob_chunk_size` tokens: a rank with a
longer packed row would call it more often than the other and both would wait forever in mismatched gathers (the
2-learner ZeRO-3 runs on GPUs hung at their first step). The learner agrees on one chunk count across ranks.
A non-finite loss on one rank (fault injection on rank 0) must not desynchronise them either: that rank goes on
through its remaining micro-batches with a zero-weight loss, and both ranks skip the step.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from two_ranks import rank_result, run_two_ranks

from rlvr.config import default_config, from_dict
from rlvr.data import builtin_corpus
from rlvr.models.tiny import build_tiny_model_dir

OVERRIDES = {
    "learner": {"backend": "deepspeed", "zero_stage": 3, "logprob_chunk_size": 4, "lr": 1e-3, "warmup_steps": 0},
    "data": {"datasets": ["builtin:copy"]},
}

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import torch
    from rlvr.algorithms.packing import PackInput, build_packed_batches
    from rlvr.config import default_config, from_dict
    from rlvr.learner.worker import LearnerWorker

    model_dir, port, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cfg = from_dict(json.loads(sys.argv[4]), base=default_config())
    w = LearnerWorker(cfg, model_dir, rank, 2, "127.0.0.1", port, "cpu", num_threads=1)
    g = torch.Generator().manual_seed(rank)
    n = 30 if rank == 0 else 6  # rank 0: 9 head chunks of 4 tokens, rank 1: 3 chunks
    inputs = [PackInput(i, torch.randint(3, 14, (4,), generator=g).tolist(),
                        torch.randint(3, 14, (n - i,), generator=g).tolist(), [-3.0] * (n - i), 1.0 - i)
              for i in range(2)]
    batches = build_packed_batches(inputs, pack_length=4 + n, micro_batch_rows=1)  # 2 micro-batches per rank
    assert len(batches[0].micro_batches) == 2
    metrics = [w.train_batch(batches) for _ in range(3)]  # RLVR_INJECT_FAULTS=nan_loss@2 on rank 0: step 2
    print("RESULT " + json.dumps({"rank": rank, "loss": [m.get("loss/total", 0.0) for m in metrics],
                                  "skipped": [m["learner/skipped_steps"] for m in metrics]}), flush=True)
    torch.distributed.barrier()
    w.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's teardown of DeepSpeed's gloo groups (see test_zero3_gather.py)
""")


@pytest.mark.timeout(600)
def test_zero3_ranks_with_different_row_lengths_train_together(tmp_path) -> None:
    cfg = from_dict(OVERRIDES, base=default_config())
    model_dir = str(build_tiny_model_dir(cfg.model, builtin_corpus("copy"), tmp_path / "model", cfg.seed))
    outs = run_two_ranks(  # a hang in mismatched gathers shows as a failure at the timeout
        SCRIPT,
        lambda port, rank: [model_dir, port, str(rank), json.dumps(OVERRIDES)],
        timeout_s=300,
        rank_env={0: {"RLVR_INJECT_FAULTS": "nan_loss@2"}},
    )
    results = [rank_result(o) for o in outs]
    assert sorted(r["rank"] for r in results) == [0, 1]
    for r in results:
        assert all(x == x for x in r["loss"]) and abs(r["loss"][0]) > 0  # finite losses on both ranks
        assert r["skipped"] == [0.0, 1.0, 1.0]  # the NaN on rank 0 at step 2 skipped that step on BOTH ranks
