"""TransformersEngine on a tiny random Qwen2 (CPU): sampling, stop rules, grouping, weight updates, threads."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
import torch

from rlvr.rollout.base import EngineError, GenerationEngine
from rlvr.rollout.hf_engine import TransformersEngine
from rlvr.types import PromptRequest, Sample, SamplingParams

Make = Callable[..., TransformersEngine]
PROMPTS = {"a": "1+2=", "b": "the cat sat on", "c": "hello world 7*8=5"}


def _req(engine: TransformersEngine, key: str, n: int = 1, **sampling: object) -> PromptRequest:
    ids = engine.tokenizer(PROMPTS[key]).input_ids
    return PromptRequest(f"p-{key}", ids, n, SamplingParams(**sampling), metadata={"k": key}, prompt_text=PROMPTS[key])


def _wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def _slow_down(engine: TransformersEngine, delay_s: float = 0.003) -> list[int]:
    """Make every model forward sleep a little; returns a list that grows by one per forward call."""
    calls: list[int] = []
    model = engine._model
    assert model is not None
    original = model.forward

    def forward(*args: object, **kwargs: object) -> object:
        calls.append(1)
        time.sleep(delay_s)
        return original(*args, **kwargs)

    model.forward = forward  # type: ignore[method-assign]
    return calls


def _perturbed(engine: TransformersEngine, seed: int = 1) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    assert engine._model is not None
    return [(n, p.detach() + 0.5 * torch.randn(p.shape, generator=gen)) for n, p in engine._model.named_parameters()]


def _tokens(samples: list[Sample]) -> dict[tuple[str, int], list[int]]:
    return {(s.prompt_id, s.sample_index): s.completion_token_ids for s in samples}


def test_engine_satisfies_protocol_and_default_eos(make_engine: Make) -> None:
    engine = make_engine()
    assert isinstance(engine, GenerationEngine)
    assert engine.eos_token_ids == [engine.tokenizer.eos_token_id]
    with pytest.raises(ValueError, match="no tokens"):
        engine.submit([PromptRequest("empty", [], 1)])


def test_greedy_is_deterministic_and_independent_of_batching(make_engine: Make) -> None:
    engine = make_engine(max_batch_size=3, eos_token_ids=[])
    reqs = [_req(engine, k, n=2, temperature=0.0, max_new_tokens=12) for k in PROMPTS]
    together = engine.generate(reqs)
    alone = [s for r in reqs for s in engine.generate([r])]
    assert _tokens(together) == _tokens(alone)
    for s in together:
        assert len(s.completion_token_ids) == 12 and s.finish_reason == "length"
        # Greedy rows record temperature-1 log-probs.
        score = engine.score(s.prompt_token_ids, s.completion_token_ids, temperature=1.0)
        assert s.logprobs == pytest.approx(score, abs=1e-5)
    by_prompt = {(s.prompt_id, s.sample_index): s for s in together}
    assert by_prompt["p-a", 0].completion_token_ids == by_prompt["p-a", 1].completion_token_ids


def test_seeded_sampling_is_independent_of_batch_composition(make_engine: Make) -> None:
    engine = make_engine(max_batch_size=8, eos_token_ids=[])
    target = _req(engine, "b", n=3, seed=123, max_new_tokens=16)
    alone = engine.generate([target])
    crowded = make_engine(max_batch_size=2, eos_token_ids=[])
    others = [_req(crowded, "c", n=3, max_new_tokens=5), _req(crowded, "a", n=2, seed=9, max_new_tokens=20)]
    mixed = crowded.generate([others[0], target, others[1]])
    assert _tokens(alone) == {k: v for k, v in _tokens(mixed).items() if k[0] == "p-b"}
    assert len({tuple(s.completion_token_ids) for s in alone}) > 1, "sample j uses seed + j"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_score(make_engine: Make, temperature: float) -> None:
    engine = make_engine(max_batch_size=4)
    reqs = [_req(engine, k, n=2, temperature=temperature, max_new_tokens=24, seed=5) for k in PROMPTS]
    for s in engine.generate(reqs):
        assert len(s.logprobs) == len(s.completion_token_ids) > 0
        score = engine.score(s.prompt_token_ids, s.completion_token_ids, temperature=temperature)
        assert s.logprobs == pytest.approx(score, abs=1e-5)


def test_stop_token_stop_string_length_and_eos(make_engine: Make) -> None:
    engine = make_engine(eos_token_ids=[])
    greedy = {"temperature": 0.0, "max_new_tokens": 12}
    ref = engine.generate([_req(engine, "b", **greedy)])[0].completion_token_ids

    short = engine.generate([_req(engine, "b", temperature=0.0, max_new_tokens=5)])[0]
    assert (short.completion_token_ids, short.finish_reason) == (ref[:5], "length")

    stop_id = ref[4]
    by_token = engine.generate([_req(engine, "b", **greedy, stop_token_ids=[stop_id])])[0]
    expected = ref[: ref.index(stop_id) + 1]
    assert (by_token.completion_token_ids, by_token.finish_reason) == (expected, "stop")
    assert len(by_token.logprobs) == len(expected)

    decode = engine._decode_text
    stop_text = next(decode([t]) for t in ref[2:] if decode([t]))
    cut = next(i for i in range(1, len(ref) + 1) if stop_text in decode(ref[:i]))
    by_string = engine.generate([_req(engine, "b", **greedy, stop_strings=[stop_text])])[0]
    assert (by_string.completion_token_ids, by_string.finish_reason) == (ref[:cut], "stop")
    assert by_string.completion_text == decode(ref[:cut])

    with_eos = make_engine(eos_token_ids=[ref[3]])
    eos_sample = with_eos.generate([_req(with_eos, "b", **greedy)])[0]
    assert (eos_sample.completion_token_ids, eos_sample.finish_reason) == (ref[: ref.index(ref[3]) + 1], "stop")


def test_poll_returns_whole_groups_in_order(make_engine: Make) -> None:
    engine = make_engine(max_batch_size=2, engine_id=7)
    reqs = [_req(engine, k, n=4, max_new_tokens=8 + 4 * i) for i, k in enumerate(PROMPTS)]
    reqs[1].is_eval = True
    engine.submit(reqs)
    got: list[Sample] = []
    deadline = time.monotonic() + 20
    while len(got) < 12:
        assert time.monotonic() < deadline
        batch = engine.poll()
        for prompt_id, count in Counter(s.prompt_id for s in batch).items():
            assert count == 4, f"partial group of {prompt_id} returned"
            assert [s.sample_index for s in batch if s.prompt_id == prompt_id] == [0, 1, 2, 3]
        got.extend(batch)
        time.sleep(0.002)
    req_by_id = {r.prompt_id: r for r in reqs}
    for s in got:
        r = req_by_id[s.prompt_id]
        assert (s.engine_id, s.version_start, s.version_end) == (7, 0, 0)
        assert (s.metadata, s.is_eval, s.prompt_text, s.prompt_token_ids) == (
            r.metadata,
            r.is_eval,
            r.prompt_text,
            r.prompt_token_ids,
        )
        assert s.completion_text == engine.tokenizer.decode(s.completion_token_ids, skip_special_tokens=True)
    stats = engine.stats()
    assert stats["completed_prompts"] == 3 and stats["completed_samples"] == 12 and stats["running"] == 0


def test_pause_and_resume(make_engine: Make) -> None:
    engine = make_engine()
    engine.pause()
    engine.submit([_req(engine, "a", n=3, max_new_tokens=4)])
    time.sleep(0.2)
    assert engine.poll() == []
    assert engine.stats()["queued"] == 3 and engine.stats()["running"] == 0
    engine.resume()
    got: list[Sample] = []
    _wait_for(lambda: bool(got.extend(engine.poll())) or len(got) == 3)


def test_inflight_update_bumps_version_mid_sequence(make_engine: Make) -> None:
    engine = make_engine(eos_token_ids=[], inflight_updates=True)
    probe = engine.tokenizer("1+2=3 hello").input_ids
    before = engine.score(probe[:3], probe[3:])
    calls = _slow_down(engine)
    engine.submit([_req(engine, "a", max_new_tokens=80)])
    _wait_for(lambda: len(calls) >= 5)
    engine.load_weights(_perturbed(engine), version=1)
    assert engine.policy_version == 1
    got: list[Sample] = []
    _wait_for(lambda: bool(got.extend(engine.poll())) or len(got) == 1)
    sample = got[0]
    assert (sample.version_start, sample.version_end, sample.finish_reason) == (0, 1, "length")
    assert len(sample.completion_token_ids) == 80
    assert engine.score(probe[:3], probe[3:]) != pytest.approx(before, abs=1e-3)
    assert engine.generate([_req(engine, "b", max_new_tokens=3)])[0].version_start == 1


def test_update_without_inflight_drains_running_first(make_engine: Make) -> None:
    engine = make_engine(eos_token_ids=[], inflight_updates=False)
    calls = _slow_down(engine)
    engine.submit([_req(engine, "a", max_new_tokens=40)])
    _wait_for(lambda: len(calls) >= 3)
    updater = threading.Thread(target=engine.load_weights, args=(_perturbed(engine), 1))
    updater.start()
    _wait_for(lambda: engine.stats()["paused"] == 1.0)
    engine.submit([_req(engine, "b", max_new_tokens=3)])  # must wait for the new weights
    updater.join(timeout=30)
    assert not updater.is_alive()
    first = engine.poll()
    assert [(s.prompt_id, s.version_start, s.version_end) for s in first] == [("p-a", 0, 0)]
    got: list[Sample] = []
    _wait_for(lambda: bool(got.extend(engine.poll())) or len(got) == 1)
    assert (got[0].prompt_id, got[0].version_start, got[0].version_end) == ("p-b", 1, 1)


def test_abort_all_returns_ids_and_engine_keeps_working(make_engine: Make) -> None:
    engine = make_engine(max_batch_size=2, eos_token_ids=[])
    calls = _slow_down(engine)
    engine.submit([_req(engine, k, n=2, max_new_tokens=100) for k in PROMPTS])
    _wait_for(lambda: len(calls) >= 3)
    assert sorted(engine.abort_all()) == ["p-a", "p-b", "p-c"]
    stats = engine.stats()
    assert stats["running"] == 0 and stats["queued"] == 0
    assert engine.poll() == []
    assert engine.abort_all() == []
    assert len(engine.generate([_req(engine, "a", max_new_tokens=3)], timeout_s=30)) == 1


def test_load_weights_rejects_unknown_names(make_engine: Make) -> None:
    engine = make_engine()
    with pytest.raises(ValueError, match="unknown weight"):
        engine.load_weights([("not.a.weight", torch.zeros(2))], version=3)
    assert engine.policy_version == 0


def test_worker_exception_surfaces(make_engine: Make) -> None:
    engine = make_engine()
    assert engine._model is not None

    def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("boom")

    engine._model.forward = broken  # type: ignore[method-assign]
    engine.submit([_req(engine, "a", max_new_tokens=3)])
    deadline = time.monotonic() + 20
    with pytest.raises(EngineError, match="boom") as info:
        while time.monotonic() < deadline:
            engine.poll()
            time.sleep(0.005)
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(EngineError):
        engine.stats()
    with pytest.raises(EngineError):
        engine.generate([_req(engine, "b")], timeout_s=5)
