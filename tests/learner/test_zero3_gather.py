"""ZeRO-3 weight gathers for sync and saves (real DeepSpeed on CPU/gloo, one rank, in a subprocess).

The weight sync gathers parameters in buckets of `learner.zero3_gather_mb` instead of the whole model, and a
save gathers one module at a time onto rank 0's CPU: both must give back exactly the weights.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from rlvr.learner.backends import _gather_buckets

SCRIPT = textwrap.dedent('''
    import json, sys
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    from rlvr.config import default_config, from_dict
    from rlvr.data import build_tiny_model_dir, builtin_corpus
    from rlvr.learner.backends import _gather_buckets
    from rlvr.learner.worker import LearnerWorker

    out, port = sys.argv[1], int(sys.argv[2])
    cfg = from_dict({"learner": {"backend": "deepspeed", "zero_stage": 3, "zero3_gather_mb": 0.01},
                     "data": {"datasets": ["builtin:copy"]}}, base=default_config())
    model_dir = str(build_tiny_model_dir(cfg.model, builtin_corpus("copy"), out + "/model", cfg.seed))
    ref = {k: v.detach() for k, v in AutoModelForCausalLM.from_pretrained(model_dir).named_parameters()}
    w = LearnerWorker(cfg, model_dir, 0, 1, "127.0.0.1", port, "cpu")
    partitioned = sum(p.numel() for p in w.model.parameters())
    got = list(w.named_weights())
    buckets = len(_gather_buckets(list(w.model.named_parameters()), int(0.01 * 2**20)))
    w.save(out + "/state", out + "/hf", model_dir)
    saved = load_file(out + "/hf/model.safetensors")
    print("RESULT " + json.dumps({
        "names": [n for n, _ in got], "ref_names": list(ref),
        "max_diff": max(float((t - ref[n]).abs().max()) for n, t in got),
        "saved_max_diff": max(float((saved[n] - ref[n]).abs().max()) for n in ref if n in saved),
        "saved_missing": [n for n in ref if n not in saved],
        "buckets": buckets, "params": len(got), "partitioned_numel": partitioned,
        "full_numel": sum(v.numel() for v in ref.values())}))
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(300)
def test_zero3_bucketed_sync_and_consolidated_save_give_the_exact_weights(tmp_path) -> None:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(_free_port())], capture_output=True,
                          text=True, timeout=280, env=env)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and line, proc.stderr[-3000:]
    r = json.loads(line[0][len("RESULT "):])
    assert r["partitioned_numel"] < r["full_numel"] / 10  # ZeRO-3 really partitioned (1 rank: placeholders)
    assert r["names"] == r["ref_names"]
    assert 1 < r["buckets"] < r["params"]  # several gathers, several parameters per gather
    assert r["max_diff"] == 0.0
    assert r["saved_missing"] == [] and r["saved_max_diff"] == 0.0


def test_gather_buckets_respect_the_byte_limit() -> None:
    params = [(f"p{i}", torch.nn.Parameter(torch.zeros(n))) for i, n in enumerate([10, 10, 30, 5, 100, 1])]
    buckets = _gather_buckets(params, limit=40 * 4)  # float32: 4 bytes per element
    assert [[n for n, _ in b] for b in buckets] == [["p0", "p1"], ["p2", "p3"], ["p4"], ["p5"]]
    assert [n for b in buckets for n, _ in b] == [n for n, _ in params]  # order kept, nothing lost
