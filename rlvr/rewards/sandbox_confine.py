"""Confining one sandboxed process: rlimits, no capabilities, Landlock and a seccomp filter; stdlib only.

Loaded by sandbox_launcher.py (which runs as a script, so it execs this file rather than importing it) and used
between fork and exec of every program child and in every judge; `landlock_abi` is also imported by
sandbox.py to report what is in force.

Invariants of `drop_privileges` (each step fails loudly, so a child that is not confined never runs):
- new session, signal dispositions reset, OOM score raised to the maximum, rlimits set;
- where the caller holds CAP_SETPCAP: the capability bounding set emptied and SECBIT_NOROOT (+ lock) set, so
  uid 0 gets no capabilities on exec; ambient capabilities cleared; the uid switched when asked; then the
  effective, permitted and inheritable sets cleared and no_new_privs set;
- Landlock (when the kernel has it): read-only `read` paths, writable `write` paths, no TCP bind/connect
  (ABI >= 4), no abstract unix sockets or signals outside the domain (ABI >= 6);
- seccomp: the syscalls that reach kernel surface a program never needs (namespaces, mounts, ptrace, bpf,
  io_uring, keyrings, userfaultfd, perf events, module loading, cross-process memory access) fail with EPERM;
  clone3 fails with ENOSYS (glibc falls back to clone, whose namespace flags are refused); other
  architectures' syscall ABIs (x32, i386) kill the process.
"""

import ctypes
import os
import resource
import signal
import struct

PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT, PR_SET_SECCOMP = 38, 24, 28, 47, 22
PR_CAP_AMBIENT_CLEAR_ALL, SECCOMP_MODE_FILTER = 4, 2
# SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED
SECURE_BITS = 0x01 | 0x02 | 0x40 | 0x80
_libc = ctypes.CDLL(None, use_errno=True)


def _check(name: str, rc: int) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


# Landlock (linux/landlock.h): filesystem rights, TCP bind/connect, scopes (abstract unix sockets, signals)
LL_EXECUTE, LL_WRITE_FILE, LL_READ_FILE, LL_READ_DIR = 1, 2, 4, 8
LL_MAKE_CHAR, LL_MAKE_BLOCK, LL_TRUNCATE = 1 << 6, 1 << 11, 1 << 14
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none (or the LSM is off)."""
    version = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(0, version)


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock(abi: int, read: list[str], write: list[str]) -> None:
    """Restrict this process (and what it execs) to reading `read`, writing `write`, no TCP, no outside signals."""
    handled_fs = (1 << {1: 13, 2: 14, 3: 15, 4: 15}.get(abi, 16)) - 1
    attr = (ctypes.c_uint64 * 3)(handled_fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        _check("landlock_create_ruleset", -1)
    file_rights = LL_EXECUTE | LL_WRITE_FILE | LL_READ_FILE | (LL_TRUNCATE if abi >= 3 else 0)
    readonly = LL_EXECUTE | LL_READ_FILE | LL_READ_DIR
    writable = handled_fs & ~(LL_MAKE_CHAR | LL_MAKE_BLOCK | (1 << 15))
    for paths, rights in ((read, readonly), (write, writable)):
        for path in paths:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            allowed = rights if os.path.isdir(path) else rights & file_rights
            rule = _PathBeneath(allowed, fd)
            rc = _libc.syscall(
                SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(1), ctypes.byref(rule), ctypes.c_uint32(0)
            )
            os.close(fd)
            _check(f"landlock_add_rule {path}", 0 if rc == 0 else -1)
    rc = _libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    os.close(ruleset)
    _check("landlock_restrict_self", 0 if rc == 0 else -1)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_privileges(
    limits: dict, uid: int | None, cap_last: int, privileged: bool, landlock_rules: tuple[int, list[str], list[str]]
) -> None:
    """Runs in the forked child before exec: new session, rlimits, no capabilities, then exec (docstring)."""
    os.setsid()
    for sig in (signal.SIGINT, signal.SIGALRM, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)  # the launcher ignores these; the program gets the defaults
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")  # the program, not the launcher, is what an OOM kill should take
    except OSError:
        pass
    cpu = int(limits["cpu_s"])
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_CORE, (0, 0)),
        (resource.RLIMIT_AS, (limits["memory_bytes"],) * 2),
        (resource.RLIMIT_NOFILE, (64, 64)),
        (resource.RLIMIT_FSIZE, (limits["file_size_bytes"],) * 2),
        (resource.RLIMIT_NPROC, (limits["num_processes"],) * 2),
    ):
        resource.setrlimit(res, value)
    if privileged:  # CAP_SETPCAP: empty the bounding set and lock uid 0 out of capabilities on exec
        for cap in range(cap_last + 1):
            _check("capbset_drop", _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0))
        _check("securebits", _libc.prctl(PR_SET_SECUREBITS, SECURE_BITS, 0, 0, 0))
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3, all zero
    _check("capset", _libc.capset(ctypes.byref(header), data))
    _check("no_new_privs", _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
    if landlock_rules[0]:
        landlock(*landlock_rules)
    install_seccomp()


# seccomp (linux/seccomp.h, linux/filter.h), x86_64 syscall numbers
AUDIT_ARCH_X86_64, X32_BIT = 0xC000003E, 0x40000000
SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
EPERM, ENOSYS = 1, 38
SYS_CLONE, SYS_CLONE3, SYS_UNSHARE = 56, 435, 272
CLONE_NEW_ANY = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080
DENIED_SYSCALLS = {
    101: "ptrace",
    103: "syslog",
    135: "personality",
    139: "sysfs",
    153: "vhangup",
    155: "pivot_root",
    161: "chroot",
    163: "acct",
    165: "mount",
    166: "umount2",
    167: "swapon",
    168: "swapoff",
    175: "init_module",
    176: "delete_module",
    179: "quotactl",
    246: "kexec_load",
    248: "add_key",
    249: "request_key",
    250: "keyctl",
    272: "unshare",
    298: "perf_event_open",
    303: "name_to_handle_at",
    304: "open_by_handle_at",
    308: "setns",
    310: "process_vm_readv",
    311: "process_vm_writev",
    313: "finit_module",
    320: "kexec_file_load",
    321: "bpf",
    323: "userfaultfd",
    425: "io_uring_setup",
    426: "io_uring_enter",
    427: "io_uring_register",
    428: "open_tree",
    429: "move_mount",
    430: "fsopen",
    431: "fsconfig",
    432: "fsmount",
    433: "fspick",
    438: "pidfd_getfd",
    442: "mount_setattr",
    457: "statmount",
    458: "listmount",
}


def _bpf(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def seccomp_program() -> bytes:
    """The classic-BPF filter described in the module docstring (struct sock_filter[])."""
    ld_w_abs, jeq_k, jset_k, ret_k = 0x20, 0x15, 0x45, 0x06
    prog = [
        _bpf(ld_w_abs, 0, 0, 4),  # seccomp_data.arch
        _bpf(jeq_k, 1, 0, AUDIT_ARCH_X86_64),
        _bpf(ret_k, 0, 0, SECCOMP_RET_KILL_PROCESS),
        _bpf(ld_w_abs, 0, 0, 0),  # seccomp_data.nr
        _bpf(jset_k, 0, 1, X32_BIT),
        _bpf(ret_k, 0, 0, SECCOMP_RET_KILL_PROCESS),
    ]
    for nr in sorted(DENIED_SYSCALLS):
        prog += [_bpf(jeq_k, 0, 1, nr), _bpf(ret_k, 0, 0, SECCOMP_RET_ERRNO | EPERM)]
    prog += [
        _bpf(jeq_k, 0, 1, SYS_CLONE3),
        _bpf(ret_k, 0, 0, SECCOMP_RET_ERRNO | ENOSYS),
        _bpf(jeq_k, 0, 3, SYS_CLONE),
        _bpf(ld_w_abs, 0, 0, 16),  # seccomp_data.args[0], low 32 bits: the clone flags
        _bpf(jset_k, 0, 1, CLONE_NEW_ANY),
        _bpf(ret_k, 0, 0, SECCOMP_RET_ERRNO | EPERM),
        _bpf(ret_k, 0, 0, SECCOMP_RET_ALLOW),
    ]
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_seccomp() -> None:
    """Install `seccomp_program()` on this process (no_new_privs must already be set); x86_64 only."""
    if os.uname().machine != "x86_64":
        return  # the syscall numbers above are x86_64's; elsewhere the other layers stand alone
    code = seccomp_program()
    buf = ctypes.create_string_buffer(code, len(code))
    prog = _SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p))
    _check("seccomp", _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0))
