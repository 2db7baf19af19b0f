"""`rlvr eval` and `evaluate` with the real TransformersEngine on the built-in tiny model and real scoring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.cli import main as rlvr_main
from rlvr.config import default_config, to_yaml
from rlvr.eval.cli import EvalArgs, default_ks, resolve_config, run_config_for
from rlvr.eval.runner import evaluate
from rlvr.rewards import RewardScorer


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlvr.data import builtin_corpus
    from rlvr.models.tiny import build_tiny_model_dir

    return build_tiny_model_dir(
        default_config().model, builtin_corpus("copy"), tmp_path_factory.mktemp("m") / "tiny", seed=0
    )


def _eval_args(model: Path, out: Path, *extra: str) -> list[str]:
    return [
        "eval",
        "--model",
        str(model),
        "--dataset",
        "builtin:copy",
        "--num-samples",
        "4",
        "--max-prompts",
        "4",
        "--max-new-tokens",
        "8",
        "--device",
        "cpu",
        "--output",
        str(out),
        *extra,
    ]


def test_rlvr_eval_writes_summary_and_completions(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert rlvr_main(_eval_args(tiny_model, tmp_path / "a")) == 0
    assert "pass@4=" in capsys.readouterr().out
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "a" / "completions.jsonl").read_text().splitlines()]
    m = summary["metrics"]
    assert summary["ks"] == [1, 2, 4] and not summary["greedy"] and m["num_samples"] == len(rows) == 16
    assert {
        "pass@1",
        "pass@4",
        "maj@4",
        "reward/copy_mean",
        "completion_len_mean",
        "stop_rate",
        "dataset/builtin:copy/pass@1",
    } <= set(m)
    assert all(r["completion_len"] <= 8 and set(r["scores"]) == {"copy"} for r in rows)
    assert m["reward/copy_mean"] == pytest.approx(sum(r["scores"]["copy"] for r in rows) / len(rows))
    # Same seed, same samples, same numbers.
    assert rlvr_main(_eval_args(tiny_model, tmp_path / "b")) == 0
    again = json.loads((tmp_path / "b" / "summary.json").read_text())["metrics"]
    assert again == m


def test_evaluate_with_real_engine_matches_rescoring(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    from rlvr.data import eval_requests
    from rlvr.rollout.hf_engine import TransformersEngine

    cfg = resolve_config(
        EvalArgs(model=str(tiny_model), dataset=["builtin:copy"], num_samples=3, max_prompts=3, max_new_tokens=6)
    )
    requests = eval_requests(cfg, AutoTokenizer.from_pretrained(tiny_model))
    engine = TransformersEngine(str(tiny_model), 0, device="cpu", max_batch_size=8)
    scorer = RewardScorer(cfg.rewards)
    try:
        summary, rows = evaluate(engine, requests, scorer, ks=(1, 3))
    finally:
        engine.shutdown()
    assert len(rows) == 9 and [r["sample_index"] for r in rows[:3]] == [0, 1, 2]
    for row, req in zip(rows[::3], requests):
        assert row["prompt_id"] == req.prompt_id and row["prompt"] == req.prompt_text
        # rlvr eval scores with the engine's finish reason (the copy reward counts the stop), so rescoring does too
        again = scorer.score(row["completion"], {**req.metadata, "finish_reason": row["finish_reason"]})
        assert again.scores == row["scores"] and again.correct == row["correct"]
    assert summary["pass@1"] == pytest.approx(sum(bool(r["correct"]) for r in rows) / 9)


def test_config_resolution(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_4"
    ckpt.mkdir(parents=True)
    cfg = default_config()
    cfg.seed, cfg.eval.max_prompts, cfg.generation.max_new_tokens = 7, 5, 12
    (run / "config.yaml").write_text(to_yaml(cfg))
    assert run_config_for(str(ckpt)) == (run / "config.yaml").resolve()
    assert run_config_for(str(tmp_path)) is None
    got = resolve_config(EvalArgs(model=str(ckpt)))
    assert (got.seed, got.eval.max_prompts, got.generation.max_new_tokens, got.model.path) == (7, 5, 12, str(ckpt))
    assert got.eval.greedy and got.eval.num_samples == 1
    got = resolve_config(EvalArgs(model=str(ckpt), num_samples=8, seed=1, max_prompts=0))
    assert (got.seed, got.eval.num_samples, got.eval.greedy, got.eval.max_prompts) == (1, 8, False, 0)
    assert default_ks(1) == [1] and default_ks(8) == [1, 2, 4, 8] and default_ks(6) == [1, 2, 4, 6]


@pytest.mark.parametrize(
    "change",
    [
        lambda c: setattr(c.rewards, "custom", ["mypkg.rewards"]),
        lambda c: setattr(c.rewards, "functions", [{"name": "builtins:exec"}]),
    ],
)
def test_a_run_config_found_beside_a_checkpoint_imports_no_code(tmp_path: Path, change) -> None:
    """The run's config.yaml is read on its own when --model is a checkpoint: a tampered one that names code
    (`builtins:exec` as a reward) is refused, naming the field; the same file given with --config is the user's."""
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "step_4"
    ckpt.mkdir(parents=True)
    cfg = default_config()
    change(cfg)
    (run / "config.yaml").write_text(to_yaml(cfg))
    with pytest.raises(
        ValueError,
        match=r"names Python code to import \(rewards\.(custom=mypkg\.rewards|functions\.name=builtins:exec)\)",
    ):
        resolve_config(EvalArgs(model=str(ckpt)))
    resolve_config(EvalArgs(model=str(ckpt), config=str(run / "config.yaml")))  # named by the user: used


def test_vllm_engine_missing_names_the_gpu_extra(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is installed")
    except ImportError:
        pass
    assert rlvr_main(_eval_args(tiny_model, tmp_path / "v", "--engine", "vllm")) == 2
    err = capsys.readouterr().err
    assert "gpu" in err and "rlvr[gpu]" in err
