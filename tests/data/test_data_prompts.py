"""Rendering, the prompt stream (mixer, epochs, drops, exact resume) and eval requests."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rlvr.config import ExperimentConfig
from rlvr.data import DataError, PromptStream, eval_requests, render_prompt
from rlvr.types import PromptRequest


def _cfg(datasets: list[str], **data: Any) -> ExperimentConfig:
    cfg = ExperimentConfig()
    cfg.data.datasets = datasets
    cfg.data.apply_chat_template = False
    cfg.data.num_builtin_rows = 60
    for k, v in data.items():
        setattr(cfg.data, k, v)
    return cfg


def _drain(stream: PromptStream, limit: int = 100_000) -> list[PromptRequest]:
    out = []
    while (req := stream.next_request()) is not None and len(out) < limit:
        out.append(req)
    return out


def test_render_raw_and_chat(tiny_tokenizer: Any) -> None:
    cfg = ExperimentConfig().data
    row = {"prompt": "bdac=", "ground_truth": "bdac"}
    cfg.apply_chat_template = False
    text, ids = render_prompt(row, tiny_tokenizer, cfg)
    assert text == "bdac=" and tiny_tokenizer.decode(ids) == "bdac="
    cfg.system_prompt = "copy"
    assert render_prompt(row, tiny_tokenizer, cfg)[0] == "copy\nbdac="
    cfg.apply_chat_template = True
    text, ids = render_prompt(row, tiny_tokenizer, cfg)
    assert text == "<|system|>\ncopy<|endoftext|>\n<|user|>\nbdac=<|endoftext|>\n<|assistant|>\n"
    assert (
        ids
        == tiny_tokenizer.apply_chat_template(
            [{"role": "system", "content": "copy"}, {"role": "user", "content": "bdac="}],
            tokenize=True,
            add_generation_prompt=True,
            return_dict=True,
        )["input_ids"]
    )
    msgs = {"messages": [{"role": "user", "content": "ab="}], "ground_truth": "ab"}
    assert render_prompt(msgs, tiny_tokenizer, cfg)[0].startswith("<|system|>\ncopy")


def test_stream_requests_and_epochs(tiny_tokenizer: Any) -> None:
    cfg = _cfg(["builtin:copy"], num_epochs=2)
    cfg.generation.num_samples = 4
    cfg.generation.max_new_tokens = 9
    reqs = _drain(PromptStream(cfg, tiny_tokenizer))
    assert len(reqs) == 120
    ids = [r.prompt_id for r in reqs]
    assert len(set(ids)) == 120
    assert {i.rsplit(":", 1)[1] for i in ids[:60]} == {"0"} and {i.rsplit(":", 1)[1] for i in ids[60:]} == {"1"}
    assert ids[:60] != [i.replace(":1", ":0") for i in ids[60:]]  # each epoch reshuffled
    r = reqs[0]
    assert r.num_samples == 4 and r.sampling.max_new_tokens == 9 and not r.is_eval
    assert r.metadata["ground_truth"] + "=" == r.prompt_text == r.metadata["prompt_text"]
    assert r.metadata["verifier"] == "copy" and r.metadata["dataset"] == "builtin:copy"
    assert tiny_tokenizer.decode(r.prompt_token_ids) == r.prompt_text
    # seeds: deterministic per prompt id, different across prompts
    again = _drain(PromptStream(cfg, tiny_tokenizer))
    assert [(q.prompt_id, q.sampling.seed) for q in again] == [(q.prompt_id, q.sampling.seed) for q in reqs]
    assert len({q.sampling.seed for q in reqs}) > 100


def test_too_long_and_bad_rows_counted(tiny_tokenizer: Any, fixtures_dir: Path, tmp_path: Path) -> None:
    long_rows = [{"prompt": "xy" * n, "ground_truth": "x"} for n in (1, 40, 2, 50)]
    (tmp_path / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in long_rows))
    cfg = _cfg(
        [str(tmp_path / "long.jsonl"), str(fixtures_dir / "bad_rows.jsonl")], on_bad_row="skip", max_prompt_tokens=20
    )  # "xy" * 40 is 80 tokens (x, y are unknown)
    stream = PromptStream(cfg, tiny_tokenizer, known_verifiers={"math"})
    reqs = _drain(stream)
    c = stream.counters
    assert c == {"pulled": 12, "dropped_too_long": 2, "skipped_bad_row": 6}
    assert c["pulled"] == len(reqs) + c["dropped_too_long"] + c["skipped_bad_row"]
    dropped = stream.pop_dropped()
    assert sorted(dropped) == sorted(
        [(f"long:{i}:0", "dropped_too_long") for i in (1, 3)]
        + [(f"bad_rows:{i}:0", "skipped_bad_row") for i in range(1, 7)]
    )
    assert {r.prompt_id for r in reqs} | {d[0] for d in dropped} == (
        {f"long:{i}:0" for i in range(4)} | {f"bad_rows:{i}:0" for i in range(8)}
    )
    assert stream.pop_dropped() == []


def test_error_mode_lists_bad_rows_of_every_dataset(tiny_tokenizer: Any, fixtures_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    cfg = _cfg([str(fixtures_dir / "bad_rows.jsonl"), str(tmp_path / "empty.jsonl")])
    with pytest.raises(DataError) as info:
        PromptStream(cfg, tiny_tokenizer, known_verifiers={"math"})
    assert "bad_rows.jsonl:7 (row 6)" in str(info.value) and "empty.jsonl" in str(info.value)


def test_mixer_weights(tiny_tokenizer: Any) -> None:
    cfg = _cfg(["builtin:copy", "builtin:arith"], weights=[3.0, 1.0], num_builtin_rows=200)
    reqs = _drain(PromptStream(cfg, tiny_tokenizer))
    assert len(reqs) == 400  # num_epochs x total rows
    share = Counter(r.metadata["dataset"] for r in reqs)["builtin:copy"] / len(reqs)
    assert 0.68 < share < 0.82
    # No weights: proportional to size, each dataset exactly one pass per epoch.
    cfg = _cfg(["builtin:copy", "builtin:arith"], num_builtin_rows=50)
    reqs = _drain(PromptStream(cfg, tiny_tokenizer))
    assert len({r.prompt_id for r in reqs}) == 100
    first_half = Counter(r.metadata["dataset"] for r in reqs[:50])
    assert 15 <= first_half["builtin:copy"] <= 35


@pytest.mark.parametrize("weights", [[], [1.0, 2.0]])
def test_exact_resume(tiny_tokenizer: Any, weights: list[float], fixtures_dir: Path) -> None:
    cfg = _cfg(
        ["builtin:copy", str(fixtures_dir / "bad_rows.jsonl")],
        weights=weights,
        num_epochs=3,
        on_bad_row="skip",
        num_builtin_rows=20,
    )
    full = _drain(PromptStream(cfg, tiny_tokenizer))
    first = PromptStream(cfg, tiny_tokenizer)
    head = [first.next_request() for _ in range(23)]
    state = json.loads(json.dumps(first.state_dict()))
    resumed = PromptStream(cfg, tiny_tokenizer)
    resumed.load_state_dict(state)
    tail = _drain(resumed)
    assert [r.prompt_id for r in head + tail] == [r.prompt_id for r in full]
    assert [r.sampling.seed for r in head + tail] == [r.sampling.seed for r in full]
    whole = PromptStream(cfg, tiny_tokenizer)
    _drain(whole)
    assert resumed.counters == whole.counters


def test_resume_rejects_other_data(tiny_tokenizer: Any) -> None:
    state = PromptStream(_cfg(["builtin:copy"]), tiny_tokenizer).state_dict()
    other = PromptStream(_cfg(["builtin:copy"], num_builtin_rows=61), tiny_tokenizer)
    with pytest.raises(ValueError, match="cannot resume"):
        other.load_state_dict(state)


def test_eval_requests(tiny_tokenizer: Any, fixtures_dir: Path) -> None:
    cfg = _cfg(["builtin:copy", str(fixtures_dir / "math_small.jsonl")], num_builtin_rows=2000)
    cfg.eval.max_prompts = 50
    cfg.eval.num_samples = 3
    ev = eval_requests(cfg, tiny_tokenizer)
    assert len(ev) == 50 and all(r.is_eval and r.num_samples == 3 for r in ev)
    assert all(r.sampling.temperature == 0.0 for r in ev)
    assert all(r.metadata["dataset"] == "builtin:copy" for r in ev)  # local file: no eval split
    again = eval_requests(cfg, tiny_tokenizer)
    assert [(r.prompt_id, r.prompt_token_ids, r.sampling.seed) for r in again] == [
        (r.prompt_id, r.prompt_token_ids, r.sampling.seed) for r in ev
    ]
    train = {r.prompt_text for r in _drain(PromptStream(_cfg(["builtin:copy"], num_builtin_rows=2000), tiny_tokenizer))}
    assert train.isdisjoint(r.prompt_text for r in ev)
    assert all(r.prompt_id.startswith("eval/") for r in ev)
    cfg.eval.datasets = [str(fixtures_dir / "math_small.jsonl"), "builtin:arith"]
    cfg.eval.greedy = False
    cfg.eval.max_prompts = 0
    ev = eval_requests(cfg, tiny_tokenizer)
    assert (
        len(ev) == 5 + 200
        and ev[0].metadata["dataset"] == "math_small"
        and ev[1].metadata["dataset"] == "builtin:arith"
    )
    assert ev[0].sampling.temperature == cfg.generation.temperature


def test_eval_datasets_with_the_same_name_are_rejected(tiny_tokenizer: Any, fixtures_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere" / "math_small.jsonl"  # another file with the same stem
    other.parent.mkdir()
    other.write_text((fixtures_dir / "math_small.jsonl").read_text())
    cfg = _cfg(["builtin:copy"])
    cfg.eval.datasets = [str(fixtures_dir / "math_small.jsonl"), str(other)]
    with pytest.raises(ValueError, match="same name 'math_small'.*rename one"):
        eval_requests(cfg, tiny_tokenizer)


def test_chat_template_override(tiny_tokenizer: Any, tmp_path: Path) -> None:
    from rlvr.config import ModelConfig
    from rlvr.data import apply_chat_template_override

    tok = tiny_tokenizer.__class__(tokenizer_object=tiny_tokenizer.backend_tokenizer)
    (tmp_path / "t.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    apply_chat_template_override(tok, ModelConfig(chat_template=str(tmp_path / "t.jinja")))
    assert render_prompt({"prompt": "ab="}, tok, ExperimentConfig().data)[0] == "ab="
    with pytest.raises(ValueError, match="neither"):
        apply_chat_template_override(tok, ModelConfig(chat_template=str(tmp_path / "missing.jinja")))
