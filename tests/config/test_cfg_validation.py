"""Each validation error is raised with an actionable message."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlvr.config import ConfigError, default_config, from_dict, load_config, validate


def _validate(**sections):
    return validate(from_dict(sections, base=default_config()))


def test_unknown_key_suggests_closest(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("learner:\n  lrr: 1.0e-6\n")
    with pytest.raises(ConfigError, match=r"unknown config key `learner.lrr`; did you mean `learner.lr`"):
        load_config(p)


def test_unknown_section_suggests_closest():
    with pytest.raises(ConfigError, match=r"`algorithim`.*did you mean `algorithm`"):
        from_dict({"algorithim": {}})


@pytest.mark.parametrize(
    "data, pattern",
    [
        ({"learner": {"lr": "fast"}}, r"learner.lr: expected a number, got str 'fast'"),
        ({"generation": {"num_samples": 2.5}}, r"generation.num_samples: expected an integer"),
        ({"rollout": {"backend": "sglang"}}, r"rollout.backend: 'sglang' is not allowed; expected one of"),
        ({"data": {"datasets": "a.jsonl"}}, r"data.datasets: expected a list"),
        ({"cluster": {"colocate": "yes"}}, r"cluster.colocate: expected true/false"),
        ({"model": 3}, r"model: expected a mapping"),
    ],
)
def test_wrong_types(data, pattern):
    with pytest.raises(ConfigError, match=pattern):
        from_dict(data)


def test_yaml_scientific_string_is_a_number():
    assert from_dict({"learner": {"lr": "1e-6"}}).learner.lr == 1e-6


@pytest.mark.parametrize(
    "data, pattern",
    [
        ({"learner": {"lr": float("inf")}}, r"learner.lr: expected a finite number"),
        ({"learner": {"lr": "inf"}}, r"learner.lr: expected a finite number"),
        ({"algorithm": {"kl_beta": float("nan")}}, r"algorithm.kl_beta: expected a finite number"),
        ({"learner": {"lr": 10**400}}, r"learner.lr: .* is out of range"),
    ],
)
def test_config_file_numbers_must_be_finite(data, pattern):
    """Range checks such as `lr > 0` let inf through (and training then died in a Ray traceback)."""
    with pytest.raises(ConfigError, match=pattern):
        from_dict(data)


@pytest.mark.parametrize(
    "flag",
    [["--learner.lr", "inf"], ["--algorithm.kl-beta", "-inf"], ["--num-steps", "3", "--generation.temperature", "nan"]],
)
def test_cli_numbers_must_be_finite(flag):
    """Flags bypass the YAML conversion; the built config is checked as a whole, naming the flag (exit 2)."""
    p = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", *flag, "--dry-run", "True"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    name = flag[-2]
    assert p.returncode == 2 and f"{name} " in p.stderr and "finite" in p.stderr, p.stderr[-1000:]
    assert "Traceback" not in p.stderr


def test_config_file_not_utf8_is_named(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_bytes(b"learner:\n  lr: \xff\n")
    with pytest.raises(ConfigError, match=r"bad.yaml' is not UTF-8 text"):
        load_config(p)


@pytest.mark.parametrize(
    "sections, pattern",
    [
        ({"generation": {"num_samples": 1}}, r"num-samples must be >= 2"),
        ({"algorithm": {"clip_eps_low": 0.0}}, r"clip-eps-low must be > 0"),
        ({"algorithm": {"clip_eps_high": -0.1}}, r"clip-eps-high must be > 0"),
        ({"learner": {"pack_length": 16}}, r"pack-length \(16\) is shorter .* = 32 \+ 5 = 37"),
        (
            {"cluster": {"device": "cuda", "num_learners": 6, "num_engines": 4, "gpus_per_node": 8}},
            r"num_learners 6 \+ num_engines 4 \* engine_tp 1 = 10 GPUs, but the cluster has num_nodes 1 \* gpus_per_node 8 = 8",
        ),
        ({"cluster": {"device": "cuda", "engine_tp": 4, "gpus_per_node": 2, "num_nodes": 4}}, r"engine-tp 4 exceeds"),
        ({"algorithm": {"mask_truncated": True, "overlong_buffer": 4}}, r"mutually exclusive"),
        ({"rollout": {"active_sampling": True, "filter_zero_variance": False}}, r"active-sampling needs"),
        ({"rollout": {"backend": "vllm"}, "cluster": {"device": "cpu"}}, r"vllm needs GPUs"),
        ({"learner": {"backend": "torch", "zero_stage": 3}}, r"needs --learner.backend deepspeed"),
        ({"learner": {"backend": "deepspeed", "zero_stage": 2, "offload_params": True}}, r"offload-params needs"),
        ({"learner": {"zero3_gather_mb": 0}}, r"zero3-gather-mb must be > 0"),
        ({"data": {"datasets": ["a", "b"], "weights": [1.0]}}, r"weights has 1 entries"),
        ({"algorithm": {"loss": "gspo", "aggregation": "token-mean"}}, r"gspo is a sequence-level loss"),
        ({"num_steps": 0}, r"--num-steps must be >= 1"),
        ({"cluster": {"device": "cuda", "colocate": True, "engine_tp": 2}}, r"colocate supports --cluster.engine-tp 1"),
        (
            {"learner": {"attention": "mask"}, "model": {"attn_implementation": "torch_varlen"}},
            r"attention mask passes a block-diagonal mask, which --model.attn-implementation torch_varlen",
        ),
        # flash kernels compute in bf16/fp16 only: float32 + an explicit flash kernel is rejected with the fix
        (
            {"model": {"dtype": "float32", "attn_implementation": "torch_varlen"}},
            r"attn-implementation torch_varlen runs flash kernels, .* float32: use --model.attn-implementation sdpa",
        ),
        (
            {"model": {"dtype": "float32", "attn_implementation": "flash_attention_2"}},
            r"attn-implementation flash_attention_2 runs flash kernels",
        ),
    ],
)
def test_impossible_values(sections, pattern):
    with pytest.raises(ConfigError, match=pattern):
        _validate(**sections)


def test_colocated_split_counts_the_larger_role():
    _validate(cluster={"device": "cuda", "colocate": True, "num_learners": 8, "num_engines": 8, "gpus_per_node": 8})


def test_cli_reports_config_error_with_flag():
    out = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", "train", "--generation.num-samples", "1", "--dry-run"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert "--generation.num-samples must be >= 2" in out.stderr


def test_resource_check_shows_arithmetic():
    from rlvr.config import check_resources

    cfg = from_dict({"cluster": {"device": "cuda", "num_learners": 2, "num_engines": 2, "engine_tp": 2}})
    with pytest.raises(ConfigError, match=r"= 6 GPUs, but Ray reports 4"):
        check_resources(cfg, num_gpus=4, num_cpus=64)


@pytest.mark.parametrize("name", ["../escape", "a/b", ".", "..", "/abs"])
def test_run_name_is_one_directory_name(name):
    """A run name with a path in it put the run outside --checkpoint.output-dir."""
    with pytest.raises(ConfigError, match=r"--logging.run-name .*one directory name"):
        _validate(logging={"run_name": name})
    _validate(logging={"run_name": "my-run.2"})
