"""One way to give booleans in every subcommand (`--x True|False`, bare `--x`, `--no-x`), list-valued
`--rewards.functions`, and one defaults story: `rlvr train --help` and the README reference show the code
defaults, and the demo preset (what `rlvr train` runs without --config) is those defaults plus the listed flags."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlvr.cli import SUBCOMMANDS, main, parse_train_args
from rlvr.cli.flags import bool_flags, normalize_bool_flags, parse, reward_function_spec
from rlvr.config import ConfigError, ExperimentConfig, default_config
from rlvr.config.presets import demo_flags
from rlvr.eval.cli import EvalArgs
from rlvr.launch.ray_job import LaunchArgs
from rlvr.launch.submit import SubmitArgs
from rlvr.rewards.cli import RewardArgs

ROOT = Path(__file__).resolve().parents[2]


def _help(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "rlvr.cli", *args, "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_normalize_bool_flags_forms() -> None:
    flags = {"--dry-run", "--a.flag", "--no-wait"}
    assert normalize_bool_flags(["--dry-run"], flags) == ["--dry-run", "True"]
    assert normalize_bool_flags(["--dry-run", "False", "--x", "1"], flags) == ["--dry-run", "False", "--x", "1"]
    assert normalize_bool_flags(["--a.no-flag", "--dry-run"], flags) == ["--a.flag", "False", "--dry-run", "True"]
    assert normalize_bool_flags(["--no-dry-run"], flags) == ["--dry-run", "False"]
    assert normalize_bool_flags(["--no-wait"], flags) == ["--no-wait", "True"]  # a field named no_wait wins
    assert normalize_bool_flags(["--no-no-wait"], flags) == ["--no-wait", "False"]
    assert normalize_bool_flags(["--name", "--no-other"], flags) == ["--name", "--no-other"]  # not ours: unchanged


def test_bool_flags_found_in_nested_and_renamed_fields() -> None:
    from rlvr.cli import TrainCommand

    train = bool_flags(TrainCommand)
    assert {"--dry-run", "--rollout.active-sampling", "--eval.overlap", "--model.trust-remote-code"} <= train
    assert "--learner.lr" not in train and "--rewards.functions" not in train
    assert "--list" in bool_flags(RewardArgs) and "--greedy" in bool_flags(EvalArgs)


@pytest.mark.parametrize("form", [["--rollout.active-sampling"], ["--rollout.active-sampling", "True"]])
def test_train_bool_true_forms(form: list[str]) -> None:
    cmd = parse_train_args(
        [
            "--dry-run",
            *form,
            "--rollout.filter-zero-variance",
            "--rollout.no-inflight-updates",
            "--eval.overlap",
            "False",
        ]
    )
    assert cmd.dry_run and cmd.experiment.rollout.active_sampling
    assert not cmd.experiment.rollout.inflight_updates and not cmd.experiment.eval.overlap


def test_other_subcommands_take_the_same_forms() -> None:
    assert parse(RewardArgs, ["--list"], "rlvr reward", None).list_functions
    assert not parse(RewardArgs, ["--no-list"], "rlvr reward", None).list_functions
    args = parse(SubmitArgs, ["slurm", "--dry-run", "--slurm-container", "False"], "rlvr submit", None)
    assert args.dry_run and not args.slurm_container
    args = parse(EvalArgs, ["--model", "m", "--no-majority", "--greedy", "False"], "rlvr eval", None)
    assert args.no_majority and args.greedy is False
    args, rest = parse(LaunchArgs, ["--no-wait", "False", "--dry-run"], "rlvr launch", None, return_unknown_args=True)
    assert not args.no_wait and rest == ["--dry-run"]  # train's flags pass through to train's parser


TYRO_SUBCOMMANDS = ["train", "eval", "reward", "launch", "submit"]  # those with booleans, parsed by cli_flags.parse


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_help_has_no_double_negatives_or_flag_pairs(name: str) -> None:
    text = _help(name)
    assert "--no-no-" not in text and not re.search(r"--[\w.-]+, --[\w.-]*no-", text)


@pytest.mark.parametrize("name", TYRO_SUBCOMMANDS)
def test_help_shows_one_boolean_style(name: str) -> None:
    text = _help(name)
    assert "{True,False}" in text and "a bare `--x` means True" in text


def test_rewards_functions_from_the_command_line() -> None:
    cmd = parse_train_args(["--rewards.functions", "math", "soft_overlong,weight=0.5,max_tokens=512,verifier=math"])
    fns = cmd.experiment.rewards.functions
    assert [(f.name, f.weight, f.params) for f in fns] == [
        ("math", 1.0, {}),
        ("soft_overlong", 0.5, {"max_tokens": 512, "verifier": "math"}),
    ]
    assert parse_train_args(["--rewards.functions", "pkg.mod:fn"]).experiment.rewards.functions[0].name == "pkg.mod:fn"
    assert parse_train_args([]).experiment.rewards.functions == default_config().rewards.functions  # kept if absent
    assert reward_function_spec("x,flag=true,name=a") == {
        "name": "x",
        "weight": 1.0,
        "params": {"flag": True, "name": "a"},
    }


@pytest.mark.parametrize(
    "item,words",
    [
        ("soft_overlong,max_tokens", "is not KEY=VALUE"),
        ("math,weight=high", "weight must be a number"),
        ("weight=2", "expected NAME"),
        ("math,k=[1]", "k must be"),
    ],
)
def test_bad_rewards_functions_item_exits_2(item: str, words: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=re.escape(words)):
        parse_train_args(["--rewards.functions", item])
    assert main(["train", "--dry-run", "--rewards.functions", item]) == 2
    err = capsys.readouterr().err
    assert "--rewards.functions" in err and item in err


def test_train_help_shows_code_defaults_and_the_demo_preset() -> None:
    text = " ".join(_help("train").replace("│", " ").split())
    code = ExperimentConfig()
    assert f"--learner.lr FLOAT Peak learning rate (AdamW). (default: {code.learner.lr})" in text
    assert f"(default: {code.num_steps})" in text
    assert f"which is these defaults plus: {demo_flags()}" in text
    readme = (ROOT / "README.md").read_text()
    assert f"| `--learner.lr` | `float` | `{code.learner.lr!r}` |" in readme  # the reference: the same defaults
    # a --config's own values are what its --help shows
    text = " ".join(_help("train", "--config", "configs/tiny-cpu.yaml").replace("│", " ").split())
    assert "Peak learning rate (AdamW). (default: 0.001)" in text and "values of the --config file" in text


def test_demo_preset_is_code_defaults_plus_the_listed_flags(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    cmd = parse_train_args(["--config", str(empty), *demo_flags().split()])
    assert cmd.experiment == default_config()
    assert parse_train_args([]).experiment == default_config()


def test_train_without_config_says_it_runs_the_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--dry-run"]) == 0
    assert "running the demo preset (configs/tiny-cpu.yaml)" in capsys.readouterr().err
    assert main(["train", "--dry-run", "--config", "configs/tiny-cpu.yaml"]) == 0
    assert "demo preset" not in capsys.readouterr().err
