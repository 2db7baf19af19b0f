"""Per-sample uids for the root sandbox modes: a pair (program, judge) that no other live sample on the host holds.

A uid pair is a slot of one lock file: slot i is uids `base + 2i` (the program) and `base + 2i + 1` (its judge),
reserved by an open-file-description lock on byte i (F_OFD_SETLK). Such a lock conflicts with every other open
of the file, in this process (another thread's sample) or any other (another verifier worker), and goes away
when its descriptor is closed, also when the process dies, so a crashed worker never leaks a slot. The file lives
in a directory only root may enter (/run/rlvr-sandbox-uids, else a 0700 directory in the system temp dir), so a
sandboxed program cannot take or drop locks; one file means nothing accumulates however many samples run.

Invariant: between `reserve()` and `release()` of a `UidPool`, no other reservation from any pool on the same lock
file returns the same slot.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import stat
import struct
import tempfile

_F_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", 37)  # Linux 3.15+
SAMPLE_UID_BASE = 1 << 20  # unused by real accounts, far above 65534 (nobody)
NUM_SLOTS = 1 << 23  # uids 2^20 .. 2^20 + 2^24


class NoFreeUid(OSError):
    """Every slot that was tried is held by a live sample."""


class SampleUids:
    """One reserved pair: `program` runs the program, `judge` (= program + 1) the judges; `release()` frees both."""

    def __init__(self, program: int, fd: int) -> None:
        self.program, self.judge, self._fd = program, program + 1, fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # drops the lock
            self._fd = -1


def _private_dir(path: str) -> bool:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    st = os.lstat(path)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and st.st_mode & 0o077 == 0


def default_lock_file() -> str:
    """The host's lock file: in /run/rlvr-sandbox-uids, else in a 0700 directory of the system temp dir."""
    for d in ("/run/rlvr-sandbox-uids", os.path.join(tempfile.gettempdir(), f"rlvr-sandbox-uids-{os.geteuid()}")):
        if _private_dir(d):
            return os.path.join(d, "slots.lock")
    raise OSError("no private directory for the sandbox uid lock (/run or the temp dir, owned by us, mode 0700)")


class UidPool:
    """Reserves uid pairs from `num_slots` slots of `lock_file` (module docstring)."""

    def __init__(
        self,
        lock_file: str | None = None,
        base: int = SAMPLE_UID_BASE,
        num_slots: int = NUM_SLOTS,
        max_tries: int = 256,
    ) -> None:
        self.lock_file, self.base, self.num_slots, self.max_tries = lock_file, base, num_slots, max_tries

    def reserve(self) -> SampleUids:
        """A pair no other live sample holds; raises `NoFreeUid` after `max_tries` held slots (or all of them)."""
        path = self.lock_file or default_lock_file()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            start = secrets.randbelow(self.num_slots)  # random: concurrent reservers rarely try the same slot
            for i in range(min(self.num_slots, self.max_tries)):
                slot = (start + i) % self.num_slots
                lock = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, slot, 1, 0)  # struct flock, l_pid 0
                try:
                    fcntl.fcntl(fd, _F_OFD_SETLK, lock)
                except (BlockingIOError, PermissionError):  # EAGAIN / EACCES: held by another sample
                    continue
                return SampleUids(self.base + 2 * slot, fd)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        raise NoFreeUid(f"no free sandbox uid after {min(self.num_slots, self.max_tries)} tries ({path})")
