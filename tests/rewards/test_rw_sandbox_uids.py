"""Per-sample uid pairs (rlvr/rewards/sandbox_uids.py): concurrent samples, in threads or processes, never share one."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rlvr.rewards import sandbox
from rlvr.rewards.sandbox import LocalSandboxExecutor, SandboxLimits
from rlvr.rewards.sandbox_uids import SAMPLE_UID_BASE, NoFreeUid, UidPool

ROOT = Path(__file__).resolve().parents[2]
HOLDER = (
    "import sys\nsys.path.insert(0, sys.argv[1])\nfrom rlvr.rewards.sandbox_uids import UidPool\n"
    "uids = UidPool(sys.argv[2], num_slots=int(sys.argv[3])).reserve()\nprint(uids.program, flush=True)\n"
    "sys.stdin.read()\n"
)


def _holder(lock_file: str, num_slots: int) -> tuple[subprocess.Popen, int]:
    """Another process (a second verifier worker) holding one reservation until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(ROOT), lock_file, str(num_slots)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    return proc, int(proc.stdout.readline())


def _stop(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)


def test_concurrent_reservations_are_disjoint(tmp_path):
    lock_file, num_slots = str(tmp_path / "slots.lock"), 16
    others = [_holder(lock_file, num_slots) for _ in range(2)]
    pool, barrier, got = UidPool(lock_file, num_slots=num_slots), threading.Barrier(12), []

    def reserve():
        barrier.wait()
        got.append(pool.reserve())

    threads = [threading.Thread(target=reserve) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        programs = [u.program for u in got] + [uid for _, uid in others]
        assert len(set(programs)) == 14  # 12 threads and 2 processes: all different
        uids = programs + [p + 1 for p in programs]  # with their judges
        assert len(set(uids)) == 28 and all(SAMPLE_UID_BASE <= u < SAMPLE_UID_BASE + 2 * num_slots for u in uids)
        assert all(u.judge == u.program + 1 for u in got)
    finally:
        for u in got:
            u.release()
        for proc, _ in others:
            _stop(proc)


def test_a_held_uid_is_not_handed_out_until_released(tmp_path):
    lock_file = str(tmp_path / "slots.lock")
    pool = UidPool(lock_file, num_slots=2)
    a, b = pool.reserve(), pool.reserve()
    assert a.program != b.program
    with pytest.raises(NoFreeUid):
        pool.reserve()
    a.release()
    c = pool.reserve()
    assert c.program == a.program
    b.release()
    c.release()
    proc, held = _holder(lock_file, 1)  # a live sample in another process
    try:
        with pytest.raises(NoFreeUid):
            UidPool(lock_file, num_slots=1).reserve()
    finally:
        _stop(proc)  # its process ends: the lock goes with it
    d = UidPool(lock_file, num_slots=1).reserve()
    assert d.program == held == SAMPLE_UID_BASE
    d.release()


@pytest.mark.skipif(os.geteuid() != 0, reason="per-sample uids are for root only")
def test_the_sandbox_runs_as_its_reserved_uid_and_never_shares_it(tmp_path, monkeypatch):
    lock_file = str(tmp_path / "slots.lock")
    monkeypatch.setattr(sandbox, "_UID_POOL", UidPool(lock_file, num_slots=1))
    ex = LocalSandboxExecutor(SandboxLimits(test_timeout_s=5.0))
    assert ex.run_capture("import os\nprint(os.getuid())").strip() == str(SAMPLE_UID_BASE)
    held = UidPool(lock_file, num_slots=1).reserve()  # a live sample holds the only pair
    try:
        assert ex.run("x = 1", ["assert x == 1"]) == [False]  # fails closed rather than share it
    finally:
        held.release()
    assert ex.run("x = 1", ["assert x == 1"]) == [True]  # the run above released nothing it did not hold
