"""The tiny CPU model's tool task end to end with scripted turns: `builtin:tool-lookup` rows, the
`tool_lookup_tiny` environment (postfix compact calls `B?`), the real character-level tiny tokenizer and plain-text
observations, as `rlvr train --config configs/tools-cpu.yaml` runs them. The answer is only obtainable through
the tool: a guess, even the exact value, scores 0; a call with the prompt's key shows the value."""

from __future__ import annotations

from typing import Any

import pytest

from rlvr.data import builtin_corpus, builtin_rows
from rlvr.envs.episode import Episode, EpisodeLimits, GeneratedTurn, run_episode
from rlvr.envs.registry import make_env
from rlvr.envs.settings import observation_tokenizer
from rlvr.envs.tool_calls import CompactFormat, ToolResult
from rlvr.models.tiny import build_tokenizer

LIMITS = EpisodeLimits(max_turns=2, max_tokens_per_turn=6, max_total_tokens=32)  # configs/tools-cpu.yaml


@pytest.fixture(scope="module")
def tiny_tokenizer() -> Any:
    return build_tokenizer(builtin_corpus("tool-lookup"), 0)


class Turns:
    """Scripted turns: each text tokenized, closed with EOS unless it ends with the stop string "?"."""

    def __init__(self, tokenizer: Any, texts: list[str]) -> None:
        self.tokenizer, self.texts = tokenizer, list(texts)

    def generate_turn(self, token_ids: list[int], max_new_tokens: int) -> GeneratedTurn:
        text = self.texts.pop(0)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        ids += [] if text.endswith("?") else [self.tokenizer.eos_token_id]
        return GeneratedTurn(ids, [-0.1] * len(ids), "stop", 0)


def _play(tokenizer: Any, row: dict[str, Any], texts: list[str]) -> Episode:
    return run_episode(
        make_env(row["env"]), row, Turns(tokenizer, texts), observation_tokenizer(tokenizer, False), LIMITS
    )


def _row() -> dict[str, Any]:
    return builtin_rows("tool-lookup", "train", 1, seed=5)[0]


def test_the_answer_comes_through_the_call(tiny_tokenizer: Any) -> None:
    row = _row()
    key, value = row["prompt"], row["ground_truth"]
    ep = _play(tiny_tokenizer, row, [f"{key}?", value])
    assert ep.end_reason == "done" and ep.reward_terms == {"tool_call": 0.1, "clean_call": 0.1, "copy": 1.0}
    assert ep.turns[0].observation_text == value + "=" and ep.env_metrics["tool_calls"] == 1
    prompt = tiny_tokenizer.decode(ep.token_ids[: ep.prompt_length])
    assert prompt.strip() == key and value not in prompt  # the value is never in the prompt: only the tool shows it


def test_a_guess_scores_zero_even_when_exact(tiny_tokenizer: Any) -> None:
    row = _row()
    ep = _play(tiny_tokenizer, row, [row["ground_truth"]])
    assert ep.reward_terms == {"copy": 0.0} and ep.env_metrics["answered_without_call"] == 1
    assert len(ep.turns) == 1


def test_a_wrong_key_shows_an_error_and_earns_nothing(tiny_tokenizer: Any) -> None:
    row = _row()
    for key in ("a", next(k for k in "ABCD" if k != row["prompt"])):  # not a key; another row's key
        ep = _play(tiny_tokenizer, row, [f"{key}?", row["ground_truth"]])
        assert ep.turns[0].observation_text == "!=" and ep.env_metrics["tool_errors"] == 1
        assert ep.reward_terms == {"copy": 0.0}


def test_the_turn_after_the_call_is_the_answer_with_partial_credit(tiny_tokenizer: Any) -> None:
    row = _row()
    key, value = row["prompt"], row["ground_truth"]
    # a second call is read as the answer, and the stop string "?" that ended it is its delimiter, like EOS
    ep = _play(tiny_tokenizer, row, [f"{key}?", f"{value}?"])
    assert ep.end_reason == "done" and ep.env_metrics["tool_calls"] == 1
    assert ep.reward_terms == {"tool_call": 0.1, "clean_call": 0.1, "copy": 1.0}
    wrong_last = value[:-1] + next(c for c in "abcde" if c != value[-1])
    for answer, score in ((f"{wrong_last}?", 2 / 3), (f"{value}??", 3 / 4), (f"{value}!", 3 / 4)):
        ep = _play(tiny_tokenizer, row, [f"{key}?", answer])
        assert ep.reward_terms["copy"] == pytest.approx(score), answer  # one delimiter only; other text counts


def test_a_call_with_text_before_it_works_but_earns_no_clean_call_term(tiny_tokenizer: Any) -> None:
    row = _row()
    key, value = row["prompt"], row["ground_truth"]
    for junk in ("!", "<|system|>", "==", " ", "\n"):  # a key-less prefix: the call parses and shows the value
        ep = _play(tiny_tokenizer, row, [f"{junk}{key}?", value])
        assert ep.turns[0].observation_text == value + "=" and ep.env_metrics["tool_calls"] == 1
        assert ep.reward_terms == {"tool_call": 0.1, "copy": 1.0}, junk


def test_postfix_compact_format_parses_renders_and_stops() -> None:
    fmt = CompactFormat(
        key_prefix="", max_calls=1, error_text="!", call_pattern=r"([A-Za-z0-9_]+)\?", stop_strings=["?"]
    )
    parsed = fmt.parse("xB?")
    assert [c.arguments for c in parsed.calls] == [{"key": "xB"}] and not parsed.errors and parsed.other_text == ""
    assert fmt.parse("!B?").other_text == "!" and fmt.parse(" B?").other_text == " "  # a space is a token too
    assert not fmt.parse("dbe").calls and not fmt.parse("?").calls
    assert fmt.stop_strings == ["?"]
    results = [ToolResult("lookup", "dbe"), ToolResult("lookup", "error: no entry", ok=False, reason="crash")]
    assert fmt.render(results) == "dbe !"
    default = CompactFormat()  # unchanged defaults: prefix calls, errors shown, "item " keys
    closed = CompactFormat(error_text="!", result_suffix="=")  # the observation's closing delimiter
    assert closed.render(results) == "dbe !=" and closed.render(results[1:]) == "!="
    assert default.parse("?K3").calls[0].arguments == {"key": "item K3"} and default.stop_strings == []
    assert default.render(results[1:]) == "error: no entry"


def test_a_call_turn_ended_by_its_stop_string_is_still_clean() -> None:
    """`clean_call` asks for nothing but the call: the stop string that ended the turn is its delimiter, not text."""
    from rlvr.envs.tool_env import ToolEnv

    fmt = CompactFormat(key_prefix="item ", stop_strings=["."])  # prefix calls `?K3`, turns stopped at "."
    row = {"prompt": "K3", "ground_truth": "4821", "verifier": "copy", "table": {"item K3": "4821"}}
    for turn, clean in (("?K3.", True), ("?K3", True), ("x?K3.", False), ("?K3 .", False)):
        env = ToolEnv(tools=["lookup"], tool_format=fmt, instructions="", call_reward=0.1, clean_call_reward=0.1)
        env.reset(row)
        result = env.step(turn, [])
        assert result.observation is not None and result.observation.text == "4821", turn
        assert ("clean_call" in result.reward_terms) is clean, turn
