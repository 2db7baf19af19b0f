"""LoRA on the learner and the transformers engine (issue 20), with real peft, real gloo and a tiny model built in code.

A step changes only the adapter (and only the adapter has optimizer state); after a gloo sync that carries only the
adapter, the engine's log-probs equal the learner's; `rlvr export --merge` gives a plain HF model with the adapted
model's outputs; a checkpoint (PEFT adapter + trainer state) resumes bit for bit.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from rlvr.algorithms.packing import PackInput, build_packed_batches
from rlvr.config import default_config, from_dict
from rlvr.data import builtin_corpus
from rlvr.launch.local_cluster import free_port
from rlvr.learner.worker import LearnerWorker
from rlvr.models.tiny import build_tiny_model_dir
from rlvr.rollout import lora
from rlvr.rollout.hf_engine import TransformersEngine
from rlvr.weight_sync.gloo import GlooWeightGroup

LORA = {"lora_rank": 4, "lora_alpha": 8, "backend": "torch", "lr": 1e-2, "warmup_steps": 0}


def _cfg(**learner):
    return from_dict({"learner": {**LORA, **learner}, "data": {"datasets": ["builtin:copy"]}}, base=default_config())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    cfg = _cfg()
    return str(build_tiny_model_dir(cfg.model, builtin_corpus("copy"), tmp_path_factory.mktemp("m"), cfg.seed))


def _batches(seed: int, vocab: int = 14) -> list:
    """One rollout batch of 6 samples with mixed-sign advantages and engine log-probs near the learner's."""
    g = torch.Generator().manual_seed(seed)
    inputs = []
    for i in range(6):
        prompt = torch.randint(3, vocab, (4,), generator=g).tolist()
        completion = torch.randint(3, vocab, (5,), generator=g).tolist()
        inputs.append(PackInput(i, prompt, completion, [-3.0] * 5, 1.0 if i % 2 else -1.0))
    return build_packed_batches(inputs, pack_length=32, micro_batch_rows=2)


def _worker(cfg, model_dir: str) -> LearnerWorker:
    return LearnerWorker(cfg, model_dir, 0, 1, "127.0.0.1", 0, "cpu", num_threads=1)


def _adapter(w: LearnerWorker) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in lora.adapter_tensors(w.model).items()}


def test_step_trains_only_the_adapter_which_alone_has_optimizer_state(model_dir):
    w = _worker(_cfg(), model_dir)
    before = {n: p.detach().clone() for n, p in w.model.named_parameters()}
    adapter_names = set(lora.adapter_parameter_names(w.model))
    assert adapter_names and {n for n, p in w.model.named_parameters() if p.requires_grad} == adapter_names
    for step in range(2):  # lora_B starts at 0, so lora_A only moves from the second step on
        w.train_batch(_batches(step))
    changed = {n for n, p in w.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed == adapter_names
    opt = w.backend.optimizer
    trained = {id(p) for n, p in w.model.named_parameters() if n in adapter_names}
    assert {id(p) for group in opt.param_groups for p in group["params"]} == trained
    assert {id(p) for p in opt.state} == trained


def test_base_weights_stay_bf16_and_frozen_with_a_bf16_model(model_dir):
    cfg = from_dict({"model": {"dtype": "bfloat16"}}, base=_cfg())
    w = _worker(cfg, model_dir)
    frozen = [p for p in w.model.parameters() if not p.requires_grad]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    assert all(p.dtype == torch.float32 for p in w.model.parameters() if p.requires_grad)  # peft keeps adapters fp32
    # the sync sends the adapter in the base's dtype (what the engines compute it in)
    assert {t.dtype for _, t in w.named_weights()} == {torch.bfloat16}


def test_engine_logprobs_after_a_gloo_sync_of_the_adapter_equal_the_learners(model_dir):
    cfg = _cfg()
    w = _worker(cfg, model_dir)
    for step in range(2):
        w.train_batch(_batches(step))
    engine = TransformersEngine(
        model_dir, device="cpu", dtype="float32", num_threads=1, lora=lora.LoraSpec.from_config(cfg)
    )
    try:
        prompt, completion = [5, 6, 7, 8], [9, 10, 11, 12, 13]
        stale = engine.score(prompt, completion)
        port, got, sent = free_port(), [], {}

        def receive() -> None:
            group = GlooWeightGroup("127.0.0.1", port, 1, 2, timeout_s=60)
            got.extend(group.receive())
            engine.load_weights(got, version=2)

        thread = threading.Thread(target=receive)
        thread.start()
        sent = GlooWeightGroup("127.0.0.1", port, 0, 2, timeout_s=60).send(w.named_weights())
        thread.join(timeout=60)
        assert engine.policy_version == 2
        adapter = lora.adapter_tensors(w.model)
        assert [n for n, _ in got] == list(adapter)  # only the adapter crossed, under PEFT names
        assert sent["sync/bytes"] == sum(t.numel() * t.element_size() for t in adapter.values())
        full = sum(p.numel() * p.element_size() for p in w.model.get_base_model().parameters())
        assert sent["sync/bytes"] < full / 5
        learner = w.score(prompt, completion)
        torch.testing.assert_close(
            torch.tensor(engine.score(prompt, completion)), torch.tensor(learner), atol=1e-5, rtol=0
        )
        assert max(abs(a - b) for a, b in zip(stale, learner)) > 1e-3  # the sync changed what the engine computes
    finally:
        engine.shutdown()


def _train_save(w: LearnerWorker, ckpt: Path, model_dir: str) -> None:
    w.save(str(ckpt / "trainer_state"), str(ckpt), model_dir)


def test_export_merge_writes_a_plain_model_with_the_adapted_outputs(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from rlvr.cli import main

    w = _worker(_cfg(), model_dir)
    for step in range(2):
        w.train_batch(_batches(step))
    ckpt = tmp_path / "step_2"
    _train_save(w, ckpt, model_dir)
    assert (ckpt / lora.CONFIG_FILE).is_file() and not (ckpt / "model.safetensors").exists()
    assert main(["export", "--merge", str(ckpt), str(tmp_path / "merged")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    base = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    w.model.eval()
    with torch.no_grad():
        want, got, plain = w.model(input_ids=ids).logits, merged(input_ids=ids).logits, base(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert (want - plain).abs().max() > 1e-3  # the adapter matters: a merge that dropped it would fail above
    assert not any("lora" in n for n in merged.state_dict())


def test_export_refuses_a_full_checkpoint_and_a_missing_merge_flag(model_dir, tmp_path, capsys):
    from rlvr.cli import main

    assert main(["export", "--merge", model_dir, str(tmp_path / "out")]) == 2
    assert "no LoRA adapter" in capsys.readouterr().err
    assert main(["export", model_dir, str(tmp_path / "out")]) == 2
    assert "--merge" in capsys.readouterr().err


def test_resume_from_an_adapter_checkpoint_is_exact(model_dir, tmp_path):
    cfg = _cfg()
    a = _worker(cfg, model_dir)
    a.train_batch(_batches(0))
    _train_save(a, tmp_path / "ckpt", model_dir)
    losses_a = [a.train_batch(_batches(s))["loss/total"] for s in (1, 2)]
    b = _worker(from_dict({"seed": 7}, base=cfg), model_dir)  # another init: everything must come from the checkpoint
    b.load(str(tmp_path / "ckpt" / "trainer_state"), str(tmp_path / "ckpt"))
    assert b.version == 1
    losses_b = [b.train_batch(_batches(s))["loss/total"] for s in (1, 2)]
    assert losses_b == losses_a
    wa, wb = _adapter(a), _adapter(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_loading_an_adapter_of_another_rank_names_the_setting(model_dir, tmp_path):
    a = _worker(_cfg(), model_dir)
    _train_save(a, tmp_path / "ckpt", model_dir)
    b = _worker(_cfg(lora_rank=8), model_dir)
    with pytest.raises(ValueError, match="lora-rank"):
        b.load(str(tmp_path / "ckpt" / "trainer_state"), str(tmp_path / "ckpt"))


def test_eval_of_an_adapter_checkpoint_asks_for_export_merge(model_dir, tmp_path, capsys):
    from rlvr.cli import main

    _train_save(_worker(_cfg(), model_dir), tmp_path / "step_1", model_dir)
    assert main(["eval", "--model", str(tmp_path / "step_1"), "--output", str(tmp_path / "out")]) == 2
    assert "rlvr export --merge" in capsys.readouterr().err
