"""The `env` section: validation names the field, routing by the row's `env` column, environments made with the
section's tool settings, and the start-up checks (unknown environment, limits beyond the model's context)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlvr.config import ConfigError, default_config, from_dict, validate
from rlvr.envs.episode import EpisodeLimits
from rlvr.envs.settings import EnvSettings, check_env, model_context
from rlvr.envs.tasks import write_rows
from rlvr.envs.tool_env import ToolEnv


@pytest.mark.parametrize(
    ("env", "flag"),
    [
        ({"max_turns": 0}, "--env.max-turns"),
        ({"max_tokens_per_turn": 0}, "--env.max-tokens-per-turn"),
        ({"tool_timeout_s": 0.0}, "--env.tool-timeout-s"),
        ({"name": "tool", "max_total_tokens": 16}, "--env.max-total-tokens"),
        ({"name": "tool", "max_total_tokens": 100_000}, "--learner.pack-length"),
        ({"tools": [" "]}, "--env.tools"),
    ],
)
def test_bad_env_values_name_the_field(env: dict, flag: str) -> None:
    cfg = from_dict({"env": env}, base=default_config())
    with pytest.raises(ConfigError, match=flag.replace(".", r"\.")):
        validate(cfg)


def test_rows_route_by_their_env_column_else_the_section_name() -> None:
    settings = EnvSettings.from_config(default_config().env)
    assert settings.route({"env": "tool_lookup"}) == "tool_lookup" and settings.route({}) is None
    named = EnvSettings.from_config(from_dict({"env": {"name": "math_python"}}, base=default_config()).env)
    assert named.route({}) == "math_python" and named.route({"env": "tool_lookup"}) == "tool_lookup"


def test_environments_get_the_section_settings() -> None:
    cfg = from_dict(
        {
            "env": {
                "tool_format": "compact",
                "tools": ["lookup", "calculator"],
                "end_on_tool_error": True,
                "tool_timeout_s": 0.5,
                "max_turns": 2,
                "max_tokens_per_turn": 9,
                "max_total_tokens": 99,
                "params": {"verifier": "gsm8k"},
            }
        },
        base=default_config(),
    )
    settings = EnvSettings.from_config(cfg.env)
    assert settings.limits == EpisodeLimits(2, 9, 99)
    env = settings.make("tool_lookup")
    assert isinstance(env, ToolEnv) and env.tool_names == ("lookup", "calculator") and env.end_on_tool_error
    assert type(env.format).__name__ == "CompactFormat" and env.verifier == "gsm8k"
    assert {t.timeout_s for t in env.tools.tools.values()} == {0.5}  # type: ignore[attr-defined]


def test_start_up_checks_name_the_field(tmp_path: Path) -> None:
    cfg = default_config()
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    assert model_context(str(tmp_path)) == 512 and model_context(str(tmp_path / "none")) is None
    check_env(cfg, 512, set())  # nothing routed: nothing to check
    with pytest.raises(ValueError, match="the data's `env` column: unknown environment 'nope'"):
        check_env(cfg, 512, {"nope"})
    cfg.env.name = "tool_lookup"
    cfg.learner.pack_length = cfg.env.max_total_tokens = 4096
    with pytest.raises(ValueError, match=r"--env\.max-total-tokens \(4096\) exceeds the model's context \(512"):
        check_env(cfg, 512, set())
    cfg.env.name = "pkg_that_does_not_exist:Env"
    with pytest.raises(ValueError, match=r"--env\.name: cannot import environment module"):
        check_env(cfg, None, set())


def test_write_rows_gives_routed_rows(tmp_path: Path) -> None:
    train, test = write_rows(str(tmp_path), 5, 3)
    rows = [json.loads(line) for line in Path(train).read_text().splitlines()]
    assert len(rows) == 5 and all(r["env"] == "tool_lookup" and r["table"] for r in rows)
    assert len(Path(test).read_text().splitlines()) == 3


def test_a_vllm_max_model_len_below_an_episode_is_refused_naming_both_flags() -> None:
    base = {"cluster": {"device": "cuda"}, "learner": {"pack_length": 4096}}
    rollout = {"backend": "vllm", "vllm_max_model_len": 1024}
    cfg = from_dict({**base, "rollout": rollout, "env": {"name": "tool", "max_total_tokens": 2048}}, default_config())
    with pytest.raises(ConfigError, match=r"--rollout\.vllm-max-model-len \(1024\).*--env\.max-total-tokens 2048"):
        validate(cfg)
    cfg.rollout.vllm_max_model_len = 2048
    validate(cfg)
    cfg.rollout.vllm_max_model_len, cfg.env.name = 1024, ""  # no episodes configured: a single-turn run
    validate(cfg)
    with pytest.raises(ValueError, match=r"--rollout\.vllm-max-model-len \(1024\).*--env\.max-total-tokens 2048"):
        check_env(cfg, None, {"tool_lookup"})  # rows route to an environment (start-up check)


def test_an_overlong_buffer_beyond_the_episode_lmax_is_refused() -> None:
    cfg = from_dict(
        {
            "generation": {"max_new_tokens": 1024},
            "learner": {"pack_length": 4096},
            "algorithm": {"overlong_buffer": 512},
            "env": {"name": "tool", "max_turns": 2, "max_tokens_per_turn": 200},
        },
        default_config(),
    )
    with pytest.raises(ConfigError, match=r"--algorithm\.overlong-buffer \(512\).*episode's Lmax \(400"):
        validate(cfg)
    cfg.env.name = ""
    validate(cfg)  # a single-turn run: its Lmax is --generation.max-new-tokens
    with pytest.raises(ValueError, match=r"--algorithm\.overlong-buffer \(512\).*episode's Lmax \(400"):
        check_env(cfg, None, {"tool_lookup"})


def test_the_python_tool_needs_an_isolating_sandbox_or_the_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlvr.rewards import sandbox

    cfg = from_dict({"env": {"name": "math_python"}, "learner": {"pack_length": 4096}}, default_config())
    monkeypatch.setattr(sandbox, "isolation_level", lambda: "rlimits")
    with pytest.raises(
        ValueError, match=r"math_python run the `python` tool.*'rlimits'.*--env\.allow-unisolated-python"
    ):
        check_env(cfg, None, set())
    with pytest.raises(ValueError, match=r"tool_lookup run the `python` tool"):  # a routed row's env, tools from config
        check_env(
            from_dict({"env": {"tools": ["python"]}, "learner": {"pack_length": 4096}}, default_config()),
            None,
            {"tool_lookup"},
        )
    no_python = from_dict({"env": {"tools": ["calculator"]}, "learner": {"pack_length": 4096}}, default_config())
    check_env(no_python, None, {"tool_lookup"})  # no python tool: no sandbox needed
    cfg.env.allow_unisolated_python = True
    check_env(cfg, None, set())  # opted in
    cfg.env.allow_unisolated_python = False
    monkeypatch.setattr(sandbox, "isolation_level", lambda: "userns")
    check_env(cfg, None, set())  # isolated
