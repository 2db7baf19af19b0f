"""Tool calls in the verifier pool (`VerifierPool.run_tool` / `poll_tools`): answers come back by id, and a tool
that hangs (even holding the GIL), crashes or floods is answered with a counted failure while the pool keeps
serving. Real worker processes; the tools are tests/envs/envs_user_tools.py."""

from __future__ import annotations

import time
from typing import Any

import pytest

from rlvr.envs.jobs import execute_tool, verify_answer
from rlvr.envs.tool_calls import ToolCall, ToolResult
from rlvr.rewards.pool import JobFailure, VerifierPool
from rlvr.rewards.scorer import RewardsSettings

TOOLS = ("lookup", "envs_user_tools:spin", "envs_user_tools:die", "envs_user_tools:flood", "envs_user_tools:crash")
ROW = {"table": {"item K3": "4821"}}


@pytest.fixture(scope="module")
def pool() -> Any:
    with VerifierPool(RewardsSettings(num_workers=2, timeout_s=5.0), hard_grace_s=1.0) as p:
        yield p


def _wait(pool: VerifierPool, ids: set[Any], timeout_s: float = 120.0) -> dict[Any, Any]:
    done: dict[Any, Any] = {}
    deadline = time.monotonic() + timeout_s
    while set(done) != ids and time.monotonic() < deadline:
        done.update(pool.poll_tools())
        time.sleep(0.01)
    assert set(done) == ids, f"jobs {ids - set(done)} never answered"
    return done


def _call(pool: VerifierPool, job_id: Any, name: str, timeout_s: float = 1.0, **arguments: Any) -> None:
    pool.run_tool(job_id, execute_tool, (TOOLS, 200, timeout_s, ToolCall(name, arguments), ROW), timeout_s)


def test_tool_and_verify_jobs_answer_by_id(pool: VerifierPool) -> None:
    _call(pool, "a", "lookup", key="item K3")
    _call(pool, "b", "lookup", key="item Z9")
    pool.run_tool("c", verify_answer, ("math", "\\boxed{4821}", {"ground_truth": "4821"}), 5.0)
    done = _wait(pool, {"a", "b", "c"})
    assert isinstance(done["a"], ToolResult) and done["a"].ok and done["a"].content == "4821"
    assert not done["b"].ok and done["b"].reason == "tool_error"
    assert done["c"] == 1.0


def test_misbehaving_tools_are_contained_and_counted(pool: VerifierPool) -> None:
    before = pool.metrics()
    _call(pool, "spin", "spin")  # holds the GIL: the thread timeout cannot answer, the pool's kill does
    _call(pool, "die", "die")  # os._exit in the worker
    # Only `spin` needs the 1 s limit. The others get room: under load a replacement worker may still be starting
    # (and the job's clock runs from dispatch), which must not turn a flood or a crash into a timeout.
    _call(pool, "flood", "flood", timeout_s=30.0)
    _call(pool, "crash", "crash", timeout_s=30.0)
    done = _wait(pool, {"spin", "die", "flood", "crash"})
    assert isinstance(done["spin"], JobFailure) and done["spin"].reason == "timeout"
    assert isinstance(done["die"], JobFailure) and done["die"].reason == "crash"
    assert done["flood"].ok and done["flood"].truncated and len(done["flood"].content) < 300
    assert not done["crash"].ok and done["crash"].reason == "crash"
    # the spinning worker's kill (and so its restart) may come after its timeout answer: wait for both restarts
    deadline = time.monotonic() + 60.0
    while pool.metrics()["reward/pool/restarts"] < before["reward/pool/restarts"] + 2 and time.monotonic() < deadline:
        pool.poll_tools()  # nothing else is pending; polling lets the pool notice and replace a killed worker
        time.sleep(0.05)
    after = pool.metrics()
    assert after["reward/pool/restarts"] >= before["reward/pool/restarts"] + 2
    assert after["reward/pool/job_timeouts"] >= 1 and after["reward/pool/job_crashes"] >= 1
    _call(pool, "again", "lookup", timeout_s=30.0, key="item K3")  # the replaced workers serve the next call
    assert _wait(pool, {"again"})["again"].content == "4821"


def test_the_python_tool_runs_its_sandbox_from_the_pool_workers(pool: VerifierPool) -> None:
    def python(job_id: str, code: str) -> None:
        call = ToolCall("python", {"code": code})
        pool.run_tool(job_id, execute_tool, (("python",), 2000, 2.0, call, {}), 22.0)

    python("print", "print(6*7)")
    python("loop", "while True: pass")
    python("flood", "print('x' * 10**8)")
    done = _wait(pool, {"print", "loop", "flood"})
    assert done["print"].ok and done["print"].content == "42"
    assert not done["loop"].ok and "killed (time limit)" in done["loop"].content
    assert not done["flood"].ok and "killed" in done["flood"].content and len(done["flood"].content) < 2200
