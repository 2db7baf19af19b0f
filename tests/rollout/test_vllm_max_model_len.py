"""vLLM's max model length covers a whole episode where episodes run (a transcript is one turn's prompt), and data
that routes rows to an environment without the config saying so is refused at start naming the flag."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from rlvr.config import default_config, from_dict
from rlvr.data import builtin_corpus
from rlvr.models.tiny import build_tiny_model_dir
from rlvr.orchestration.episodes import check_env_at_start
from rlvr.rollout.vllm_support import default_max_model_len, runs_episodes


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    cfg = default_config()
    return str(build_tiny_model_dir(cfg.model, builtin_corpus("copy"), tmp_path_factory.mktemp("m"), cfg.seed))


def _cfg(**sections: object):
    base = {"data": {"max_prompt_tokens": 64}, "generation": {"max_new_tokens": 32}, "env": {"max_total_tokens": 256}}
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v}  # type: ignore[dict-item]
    return from_dict(base, base=default_config())


def test_single_turn_keeps_prompt_plus_new_tokens(model_dir: str) -> None:
    cfg = _cfg()
    assert not runs_episodes(cfg)
    assert default_max_model_len(model_dir, cfg) == 96


@pytest.mark.parametrize(
    "sections",
    [
        {"env": {"name": "math_python"}},
        {"data": {"datasets": ["builtin:tool-lookup"]}},
        {"eval": {"datasets": ["builtin:tool-lookup"]}},
    ],
    ids=["env.name", "train data", "eval data"],
)
def test_episodes_get_the_whole_transcript(model_dir: str, sections: dict) -> None:
    cfg = _cfg(**sections)
    assert runs_episodes(cfg)
    assert default_max_model_len(model_dir, cfg) == 256


def test_the_flag_wins_and_the_model_caps(model_dir: str) -> None:
    assert default_max_model_len(model_dir, _cfg(rollout={"vllm_max_model_len": 200})) == 200
    huge = _cfg(env={"name": "math_python", "max_total_tokens": 10**7})
    assert default_max_model_len(model_dir, huge) < 10**7  # the model's positions


def test_routed_rows_of_own_data_on_vllm_need_the_flag(model_dir: str, tmp_path: Path) -> None:
    rows = [{"extra": {"env": "tool_lookup"}}]
    stream = types.SimpleNamespace(_datasets=[types.SimpleNamespace(rows=rows)])
    cfg = _cfg(data={"datasets": [str(tmp_path / "own.jsonl")]}, rollout={"backend": "vllm"})
    with pytest.raises(ValueError, match="--rollout.vllm-max-model-len 256"):
        check_env_at_start(cfg, model_dir, stream, [])
    check_env_at_start(_cfg(rollout={"backend": "vllm", "vllm_max_model_len": 256}), model_dir, stream, [])
    check_env_at_start(_cfg(data={"datasets": [str(tmp_path / "own.jsonl")]}), model_dir, stream, [])  # HF engine
