"""LoRA settings the engines cannot serve are refused at config time, naming the flag and the reason (issue 20)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlvr.config import ConfigError, default_config, from_dict, validate

VLLM = {"rollout": {"backend": "vllm"}, "cluster": {"device": "cuda"}}


@pytest.mark.parametrize(
    "sections, pattern",
    [
        (
            {**VLLM, "learner": {"lora_rank": 1024}},
            r"--learner.lora-rank 1024 exceeds the largest LoRA rank vLLM serves \(512",
        ),
        (
            {**VLLM, "learner": {"lora_rank": 8, "lora_target_modules": ["q_proj", "lm_head"]}},
            r"--learner.lora-target-modules lm_head: the vLLM engine serves adapters on q_proj",
        ),
        (
            {"learner": {"lora_rank": 8, "backend": "deepspeed", "zero_stage": 3}},
            r"--learner.lora-rank with --learner.zero-stage 3",
        ),
        ({"learner": {"lora_rank": -1}}, r"--learner.lora-rank must be >= 0"),
        ({"learner": {"lora_rank": 8, "lora_alpha": 0}}, r"--learner.lora-alpha must be > 0"),
        ({"learner": {"lora_rank": 8, "lora_dropout": 1.0}}, r"--learner.lora-dropout must be in \[0, 1\)"),
        ({"learner": {"lora_rank": 8, "lora_target_modules": []}}, r"--learner.lora-target-modules is empty"),
    ],
)
def test_unservable_lora_settings_are_refused(sections, pattern):
    with pytest.raises(ConfigError, match=pattern):
        validate(from_dict(sections, base=default_config()))


def test_servable_lora_settings_pass():
    validate(from_dict({**VLLM, "learner": {"lora_rank": 512}}, base=default_config()))
    # the transformers engine applies any peft adapter: no vLLM limits there
    validate(from_dict({"learner": {"lora_rank": 1024, "lora_target_modules": ["lm_head"]}}, base=default_config()))


def test_cli_exits_2_naming_the_flag():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlvr.cli",
            "train",
            "--rollout.backend",
            "vllm",
            "--cluster.device",
            "cuda",
            "--learner.lora-rank",
            "1024",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "--learner.lora-rank 1024 exceeds" in out.stderr
