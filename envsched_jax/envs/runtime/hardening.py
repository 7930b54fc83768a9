"""Process hardening inside the jails (standard library only): a seccomp filter and prctl flags.

The supervisor (:mod:`worker`) calls :func:`harden` once, after it dropped root and before it
reads a request; every episode and check process inherits the result (fork keeps the filter, and
no process can remove a seccomp filter once installed).

- ``PR_SET_NO_NEW_PRIVS``: no set-uid binary (there are some under ``/usr``) can raise privileges;
  also required for an unprivileged process to install a filter.
- ``PR_SET_DUMPABLE = 0`` for the supervisor only: a non-dumpable process cannot be traced, and
  its ``/proc/PID/mem`` and ``/proc/PID/fd/*`` cannot be opened, by processes of the same uid.
  Environment code runs under the supervisor's uid, so without this it could write into the
  supervisor's memory or reopen its protocol descriptors.
- A seccomp filter (x86-64 only; elsewhere :func:`harden` reports ``seccomp: false``) that makes
  these system calls fail with ``EPERM``: ``unshare`` and ``setns`` (no new namespaces: in
  particular no user namespace, whatever the jail), ``clone`` with any ``CLONE_NEW*`` flag,
  ``ptrace`` and ``process_vm_readv/writev``, the keyring calls (``add_key``, ``request_key``,
  ``keyctl``: a uid's keyring would outlive an episode), System V IPC and POSIX message queues
  (``shmget``, ``semget``, ``msgget``, ``mq_open``: objects that would outlive an episode),
  ``bpf``, ``perf_event_open``, ``userfaultfd``. ``clone3`` fails with ``ENOSYS`` (its flags
  live in memory a filter cannot read; the C library then falls back to ``clone``). Calls of
  the x32 ABI and of any other architecture are refused with ``ENOSYS``.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

PR_SET_DUMPABLE = 4
PR_SET_SECCOMP = 22
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
CLONE_NEW_FLAGS = 0x7E020080  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET | NEWTIME

EPERM = 1
ENOSYS = 38
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000

# x86-64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl)
X86_64_DENIED = {
    "shmget": 29, "semget": 64, "msgget": 68, "ptrace": 101, "mq_open": 240,
    "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
    "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321,
    "userfaultfd": 323,
}
X86_64_CLONE = 56
X86_64_CLONE3 = 435

# classic BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16


def filter_program() -> list[tuple[int, int, int, int]]:
    """The x86-64 filter as (code, jt, jf, k) instructions (see the module docstring)."""
    denied = sorted(X86_64_DENIED.values())
    # layout: 0 arch load, 1 arch test, 2 nr load, 3 x32 test, 4.. deny tests, then clone3,
    # clone, allow, clone-flags block, EPERM, ENOSYS
    n_deny = len(denied)
    i_clone3 = 4 + n_deny
    i_clone = i_clone3 + 1
    i_allow = i_clone + 1
    i_flags = i_allow + 1          # load arg0, test flags, allow
    i_eperm = i_flags + 3
    i_enosys = i_eperm + 1

    def rel(src: int, dst: int) -> int:
        return dst - src - 1

    prog = [(_LD_W_ABS, 0, 0, _OFF_ARCH),
            (_JEQ_K, 0, rel(1, i_enosys), AUDIT_ARCH_X86_64),
            (_LD_W_ABS, 0, 0, _OFF_NR),
            (_JGE_K, rel(3, i_enosys), 0, X32_SYSCALL_BIT)]
    for k, nr in enumerate(denied):
        at = 4 + k
        prog.append((_JEQ_K, rel(at, i_eperm), 0, nr))
    prog.append((_JEQ_K, rel(i_clone3, i_enosys), 0, X86_64_CLONE3))
    prog.append((_JEQ_K, rel(i_clone, i_flags), 0, X86_64_CLONE))
    prog.append((_RET_K, 0, 0, RET_ALLOW))
    prog.append((_LD_W_ABS, 0, 0, _OFF_ARG0))
    prog.append((_JSET_K, rel(i_flags + 1, i_eperm), 0, CLONE_NEW_FLAGS))
    prog.append((_RET_K, 0, 0, RET_ALLOW))
    prog.append((_RET_K, 0, 0, RET_ERRNO | EPERM))
    prog.append((_RET_K, 0, 0, RET_ERRNO | ENOSYS))
    assert len(prog) == i_enosys + 1
    return prog


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _prctl(libc, option: int, arg2, arg3=0, arg4=0, arg5=0) -> None:
    if libc.prctl(option, arg2, arg3, arg4, arg5) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}) failed: {os.strerror(err)}")


_libc = None


def _load_libc():
    """The C library, loaded once (forked children reuse it: loading costs about a
    millisecond, paid per episode otherwise)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                                ctypes.c_ulong]
    return _libc


def set_dumpable(flag: bool) -> None:
    _prctl(_load_libc(), PR_SET_DUMPABLE, int(flag))


def harden() -> dict:
    """Apply no-new-privileges, non-dumpable and (on x86-64) the seccomp filter to this process
    and its future children; returns what was applied."""
    libc = _load_libc()
    _prctl(libc, PR_SET_NO_NEW_PRIVS, 1)
    _prctl(libc, PR_SET_DUMPABLE, 0)
    applied = {"no_new_privs": True, "dumpable": False, "seccomp": False}
    if platform.machine() in ("x86_64", "AMD64"):
        prog = filter_program()
        raw = b"".join(struct.pack("=HBBI", *ins) for ins in prog)
        buf = ctypes.create_string_buffer(raw, len(raw))
        fprog = _SockFprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
        _prctl(libc, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog))
        applied["seccomp"] = True
    return applied
