"""LoRA with DeepSpeed ZeRO-2 on CPU/gloo, 2 ranks (2 processes): only the adapters train, both ranks hold the same
adapters after each step, ZeRO's optimizer holds only adapter parameters, and a checkpoint (frozen base excluded)
restores them."""

from __future__ import annotations

import json
import textwrap

import pytest
from two_ranks import rank_result, run_two_ranks

from rlvr.config import default_config, from_dict
from rlvr.data import builtin_corpus
from rlvr.models.tiny import build_tiny_model_dir

OVERRIDES = {
    "learner": {"backend": "deepspeed", "zero_stage": 2, "lora_rank": 4, "lora_alpha": 8, "lr": 1e-2},
    "data": {"datasets": ["builtin:copy"]},
}

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    from rlvr.algorithms.packing import PackInput, build_packed_batches
    from rlvr.config import default_config, from_dict
    from rlvr.learner.worker import LearnerWorker
    from rlvr.rollout import lora

    out, model_dir, port, rank = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    cfg = from_dict(json.loads(sys.argv[5]), base=default_config())

    def batches(seed):
        g = torch.Generator().manual_seed(seed)
        inputs = [PackInput(i, torch.randint(3, 14, (4,), generator=g).tolist(),
                            torch.randint(3, 14, (5,), generator=g).tolist(), [-3.0] * 5, 1.0 if i % 2 else -1.0)
                  for i in range(8)]
        return build_packed_batches(inputs, pack_length=32, micro_batch_rows=2, num_ranks=2)[rank:rank + 1]

    w = LearnerWorker(cfg, model_dir, rank, 2, "127.0.0.1", port, "cpu", num_threads=1)
    before = {n: p.detach().clone() for n, p in w.model.named_parameters()}
    for step in range(2):
        w.train_batch(batches(step))
    adapter = set(lora.adapter_parameter_names(w.model))
    changed = sorted(n for n, p in w.model.named_parameters() if not torch.equal(p.detach(), before[n]))
    opt = w.backend.optimizer
    in_opt = sum(p.numel() for group in opt.bit16_groups for p in group)
    sums = {n: float(t.double().sum()) for n, t in lora.adapter_tensors(w.model).items()}
    w.save(out + "/state", out + "/hf", model_dir)
    torch.distributed.barrier()  # rank 0 wrote the adapter every rank loads
    saved = {n: t.clone() for n, t in lora.adapter_tensors(w.model).items()}
    w.train_batch(batches(5))
    w.load(out + "/state", out + "/hf")
    restored = all(torch.equal(t, saved[n]) for n, t in lora.adapter_tensors(w.model).items())
    print("RESULT " + json.dumps({
        "changed_is_adapter": set(changed) == adapter, "num_adapter": len(adapter), "sums": sums,
        "opt_numel": in_opt, "adapter_numel": sum(p.numel() for n, p in w.model.named_parameters() if n in adapter),
        "restored": restored, "version": w.version}), flush=True)
    torch.distributed.barrier()
    w.shutdown()
""")


@pytest.mark.timeout(300)
def test_lora_zero2_two_ranks_train_only_equal_adapters_and_restore(tmp_path) -> None:
    cfg = from_dict(OVERRIDES, base=default_config())
    model_dir = str(build_tiny_model_dir(cfg.model, builtin_corpus("copy"), tmp_path / "model", cfg.seed))
    outs = run_two_ranks(
        SCRIPT,
        lambda port, rank: [str(tmp_path / "ckpt"), model_dir, port, str(rank), json.dumps(OVERRIDES)],
        timeout_s=280,
    )
    res = [rank_result(o) for o in outs]
    for r in res:
        assert r["changed_is_adapter"] and r["num_adapter"] > 0
        assert r["opt_numel"] == r["adapter_numel"]  # ZeRO's fp32 partitions cover the adapters, nothing frozen
        assert r["restored"] and r["version"] == 2
    assert res[0]["sums"] == res[1]["sums"]  # gradients were reduced: the ranks stay identical
    assert not any(
        f.name.endswith("model_states.pt") and f.stat().st_size > 200_000
        for f in (tmp_path / "ckpt" / "state").rglob("*")
    )  # the frozen base is not in DeepSpeed's files
