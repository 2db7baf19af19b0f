"""`rlvr reward --list` and docs/rewards.md: every built-in listed with its real parameters, each example scored
by the real function (and by the printed `rlvr reward` command) to the score the list claims; exit codes."""

from __future__ import annotations

import inspect
import json
import shlex
from pathlib import Path

import pytest
import tyro

from rlvr.cli import main as rlvr_main
from rlvr.rewards.catalog import EXAMPLES, catalog_lines, markdown
from rlvr.rewards.cli import RewardArgs, run_reward
from rlvr.rewards.ifeval import constraint_types
from rlvr.rewards.registry import get_reward, known_rewards

ROOT = Path(__file__).resolve().parents[2]


def _builtins() -> list[str]:
    return [n for n in known_rewards() if get_reward(n).fn.__module__.startswith("rlvr.")]


def test_catalog_has_an_example_for_every_builtin() -> None:
    assert sorted(EXAMPLES) == _builtins()


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_catalog_example_scores_what_it_claims(name: str) -> None:
    ex = EXAMPLES[name]
    score = get_reward(name).fn(ex.completion, {**ex.metadata, "completion_token_ids": None}, **ex.params)
    assert score == pytest.approx(ex.score, abs=1e-9)


def test_catalog_commands_reproduce_the_scores(capsys: pytest.CaptureFixture[str]) -> None:
    lines = catalog_lines()
    commands = [ln.strip() for ln in lines if ln.strip().startswith("rlvr reward ")]
    assert len(commands) >= 8
    for cmd in commands:
        argv = shlex.split(cmd)[2:]
        name = argv[argv.index("--fn") + 1]
        args = tyro.cli(RewardArgs, args=argv + ["--num-workers", "0"])
        assert run_reward(args) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["scores"][name] == pytest.approx(EXAMPLES[name].score, abs=1e-9), cmd


def test_reward_list_cli_names_params_and_constraints(capsys: pytest.CaptureFixture[str]) -> None:
    assert rlvr_main(["reward", "--list"]) == 0
    out = capsys.readouterr().out
    blocks = {b.split("\n", 1)[0]: b for b in out.split("\n\n")}
    for name in _builtins():
        block = blocks[name]
        for p in list(inspect.signature(get_reward(name).fn).parameters.values())[2:]:
            assert f"{p.name}={p.default!r}" in block, (name, p.name)
        assert f"-> {EXAMPLES[name].score:.4g}" in block
    for t in constraint_types():
        assert f"\n  {t}(" in out
    assert "number_words(num_words, relation)" in out
    assert "min(0, lambda)" in blocks["length"]  # why a wrong answer scores 0 however short


def test_reward_help_names_the_functions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        rlvr_main(["reward", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--list" in out and all(n in out for n in ("math", "ifeval", "cosine_length", "soft_overlong"))


def test_docs_rewards_page_is_current() -> None:
    assert (ROOT / "docs" / "rewards.md").read_text() == markdown(), (
        "docs/rewards.md is stale: python -m rlvr.rewards.catalog --write docs/rewards.md"
    )


def test_failed_rows_exit_2_and_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        {"completion": r"\boxed{2}", "verifier": "math", "ground_truth": "2"},
        {"completion": "x", "verifier": "ifeval", "ground_truth": [{"type": "no_such_constraint"}]},
        {"completion": "y", "verifier": "math", "ground_truth": "3"},
    ]
    src, dst = tmp_path / "rows.jsonl", tmp_path / "scored.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert run_reward(RewardArgs(input=str(src), output=str(dst), num_workers=0)) == 2
    err = capsys.readouterr().err
    assert "1 of 3 rows failed to score (error 1)" in err
    assert f"{src}:2: error: " in err and "no_such_constraint" in err and f"{src}:1" not in err
    scored = [json.loads(line) for line in dst.read_text().splitlines()]
    assert [s["status"] for s in scored] == ["ok", "error", "ok"]  # every row still written, as it was read
    assert all(
        set(s) - {"scores", "total", "correct", "status", "error", "elapsed_s"} == set(r) for s, r in zip(scored, rows)
    )
    # without --output: the results on stdout, the same exit code; all rows fine: 0
    assert run_reward(RewardArgs(input=str(src), num_workers=0)) == 2
    assert len(capsys.readouterr().out.splitlines()) == 3
    src.write_text(json.dumps(rows[0]) + "\n")
    assert run_reward(RewardArgs(input=str(src), num_workers=0)) == 0


def test_bad_json_line_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "rows.jsonl"
    src.write_text('{"completion": "a"}\n{"completion": \n')
    assert run_reward(RewardArgs(input=str(src), fn=["math"], num_workers=0)) == 2
    assert f"{src}:2: not valid JSON" in capsys.readouterr().err
