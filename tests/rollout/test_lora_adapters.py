"""What a vLLM engine does with a received LoRA adapter before vLLM sees it (no vLLM needed): the PEFT directory
it writes in shared memory, the engine arguments it starts vLLM with, and clean-up."""

from __future__ import annotations

import json
import os

import pytest
import torch

from rlvr.rollout import lora

SPEC = lora.LoraSpec(rank=12, alpha=24, dropout=0.0, target_modules=("q_proj", "v_proj"))


def test_adapter_directories_are_peft_format_and_only_the_last_two_are_kept(tmp_path):
    store = lora.SharedMemoryAdapters(SPEC, str(tmp_path / "base"), "t")
    try:
        named = [
            ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", torch.ones(12, 8)),
            ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", torch.zeros(8, 12)),
        ]
        first = store.write(named, 1)
        config, tensors = lora.read_adapter_dir(first)
        assert (config["r"], config["lora_alpha"], sorted(config["target_modules"])) == (12, 24, ["q_proj", "v_proj"])
        assert config["base_model_name_or_path"] == str(tmp_path / "base") and config["peft_type"] == "LORA"
        assert list(tensors) == [n for n, _ in named] and torch.equal(tensors[named[0][0]], named[0][1])
        json.dumps(config)  # vLLM's PEFTHelper reads it as JSON
        second = store.write(named, 1)  # the same version again (a replaced engine): a new directory
        assert second != first and first.exists()  # the one served until `second` is loaded stays
        third = store.write(named, 2)
        assert not first.exists() and second.exists() and third.exists()
    finally:
        store.close()
    assert not store.root.exists()


def test_tensors_received_as_views_of_one_bucket_are_written_whole(tmp_path):
    flat = torch.arange(20, dtype=torch.bfloat16)  # what GlooWeightGroup.receive yields: views into one buffer
    a, b = torch.split(flat, [8, 12])
    named = [("m.q_proj.lora_A.weight", a.view(2, 4)), ("m.q_proj.lora_B.weight", b.view(4, 3))]
    path = lora.write_adapter_dir(named, lora.adapter_config_dict(SPEC, None), tmp_path / "a")
    _, tensors = lora.read_adapter_dir(path)
    assert torch.equal(tensors["m.q_proj.lora_A.weight"], a.view(2, 4))
    assert torch.equal(tensors["m.q_proj.lora_B.weight"], b.view(4, 3))


def test_safetensors_written_from_memory_read_back_with_the_safetensors_library(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file

    flat = torch.randn(64).to(torch.bfloat16)
    a, b = torch.split(flat, [24, 40])
    named = [
        ("x.lora_A.weight", a.view(4, 6)),
        ("x.lora_B.weight", b.view(8, 5)),
        ("y.lora_A.weight", torch.randn(3, 7)),
        ("y.lora_B.weight", torch.randn(2, 3).half()),
    ]
    lora.write_safetensors(named, tmp_path / "a.safetensors")
    got = load_file(str(tmp_path / "a.safetensors"))
    assert sorted(got) == sorted(n for n, _ in named)
    for name, t in named:
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    with safe_open(str(tmp_path / "a.safetensors"), framework="pt") as f:  # how vLLM reads an adapter
        assert f.metadata() == {"format": "pt"} and torch.equal(f.get_tensor("x.lora_B.weight"), b.view(8, 5))
    with pytest.raises(ValueError, match="cannot write"):
        lora.write_safetensors([("i", torch.arange(3))], tmp_path / "b.safetensors")


def test_stores_of_dead_processes_are_swept(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"rlvr-lora-{int(done.stdout)}-e0-abc"  # that pid has exited
    alive = tmp_path / f"rlvr-lora-{os.getpid()}-learner-xyz"
    other = tmp_path / "rlvr-lora-notapid-x"
    for p in (dead, alive, other):
        (p / "v1-1").mkdir(parents=True)
    assert lora.sweep_dead(tmp_path) == 1
    assert not dead.exists() and alive.exists() and other.exists()


@pytest.mark.parametrize("rank, max_rank", [(1, 1), (2, 8), (8, 8), (12, 16), (300, 320), (512, 512)])
def test_vllm_gets_the_smallest_max_lora_rank_that_holds_the_rank(rank, max_rank):
    args = lora.vllm_engine_args(lora.LoraSpec(rank, 16, 0.0, ("q_proj",)))
    assert args.pop("worker_extension_cls") == "rlvr.rollout.vllm_lora_ipc.LoraIpcWorkerExtension"  # lora_ipc loads
    assert args == {"enable_lora": True, "max_lora_rank": max_rank, "max_loras": 1, "max_cpu_loras": 1}


def test_a_rank_vllm_cannot_serve_is_refused():
    with pytest.raises(ValueError, match="lora-rank 513"):
        lora.vllm_engine_args(lora.LoraSpec(513, 16, 0.0, ("q_proj",)))


def test_peft_names_map_to_live_parameter_names():
    assert (
        lora.module_name("base_model.model.model.layers.3.mlp.down_proj.lora_B.weight")
        == "base_model.model.model.layers.3.mlp.down_proj.lora_B.default.weight"
    )
    assert lora.module_name("base_model.model.lm_head.weight") == "base_model.model.lm_head.weight"
