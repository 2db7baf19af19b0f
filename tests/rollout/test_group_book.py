"""GroupBook: the prompt bookkeeping both engines (transformers and vLLM) use behind poll / generate / abort."""

from __future__ import annotations

import threading
import time

import pytest

from rlvr.rollout.base import EngineError, GroupBook
from rlvr.types import PromptRequest, Sample, SamplingParams


def _req(pid: str) -> PromptRequest:
    return PromptRequest(prompt_id=pid, prompt_token_ids=[1, 2], sampling=SamplingParams(), num_samples=1)


def _sample(pid: str) -> Sample:
    return Sample(
        prompt_id=pid,
        sample_index=0,
        prompt_token_ids=[1, 2],
        completion_token_ids=[3],
        completion_text="c",
        logprobs=[-0.5],
        finish_reason="stop",
        version_start=0,
        version_end=0,
    )


def _ok() -> None:
    pass


def test_poll_groups_and_generate_groups_are_kept_apart() -> None:
    cond = threading.Condition()
    book = GroupBook(cond)
    with cond:
        streamed = book.new_uids(1, wait=False)
        waited = book.new_uids(2, wait=True)
        assert len(set(streamed + waited)) == 3
        book.file(waited[1], [_sample("c")])
        book.file(streamed[0], [_sample("a")])
        book.file(waited[0], [_sample("b")])
        assert [s.prompt_id for s in book.take()] == ["a"] and book.take() == []
        got = book.collect([_req("b"), _req("c")], waited, time.monotonic() + 5, _ok, 0)
    assert [s.prompt_id for s in got] == ["b", "c"]  # request order, whatever order they finished in
    assert book.waiting == {}


def test_collect_wakes_on_a_filing_from_another_thread() -> None:
    cond = threading.Condition()
    book = GroupBook(cond)
    with cond:
        (uid,) = book.new_uids(1, wait=True)

    def finish() -> None:
        time.sleep(0.2)
        with cond:
            book.file(uid, [_sample("x")])

    threading.Thread(target=finish).start()
    with cond:
        assert [s.prompt_id for s in book.collect([_req("x")], [uid], time.monotonic() + 10, _ok, 0)] == ["x"]


def test_collect_raises_on_abort_timeout_and_failure_and_forgets_the_uids() -> None:
    cond = threading.Condition()
    book = GroupBook(cond)
    with cond:
        uids = book.new_uids(2, wait=True)
        book.abort([uids[0], 99])  # 99 was never waited on: not recorded
        assert book.aborted == {uids[0]}
        book.file(uids[1], [_sample("b")])
        with pytest.raises(EngineError, match=r"aborted: \['a'\]"):
            book.collect([_req("a"), _req("b")], uids, time.monotonic() + 5, _ok, 3)
        assert book.waiting == {} and book.aborted == set()

        (late,) = book.new_uids(1, wait=True)
        with pytest.raises(TimeoutError, match="engine 3: generate"):
            book.collect([_req("l")], [late], time.monotonic() + 0.1, _ok, 3)
        assert book.waiting == {}

        def broken() -> None:
            raise EngineError("worker failed")

        (gone,) = book.new_uids(1, wait=True)
        with pytest.raises(EngineError, match="worker failed"):
            book.collect([_req("g")], [gone], time.monotonic() + 5, broken, 3)
        assert book.waiting == {}
