"""Run a scientist's program in a sandbox: no shell, its own process group and session,
resource limits, a minimal environment (no storage keys, no secrets), a private temporary
folder, stdout/stderr to files, and — with Linux Landlock — no write access anywhere but
its output and temporary folders. Its process count is bounded by RLIMIT_NPROC, or, for
root (which that limit does not bind: a container), by a ``pids`` cgroup of its own.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.reducers import Limits

GRACE_S = 5.0
PIDS_CGROUPS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))  # cgroup v1, v2
_libc = ctypes.CDLL(None, use_errno=True)
_SYS_LANDLOCK = (444, 445, 446)  # create_ruleset, add_rule, restrict_self (all architectures)
_PR_SET_NO_NEW_PRIVS = 38
_READ = (1 << 0) | (1 << 2) | (1 << 3)  # execute, read file, read dir
_WRITE = sum(1 << bit for bit in range(1, 13) if bit not in (2, 3)) | (1 << 13) | (1 << 14)  # + refer, truncate


@dataclass(frozen=True)
class Result:
    exit_code: int  # negative: killed by that signal
    why: str  # "" when it exited by itself; else what stopped it
    seconds: float


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 if it has none."""
    version = _libc.syscall(_SYS_LANDLOCK[0], None, 0, 1)
    return max(0, version)


def _landlock(writable: list[Path]) -> None:
    """Forbid writes everywhere but beneath ``writable`` (and /dev/null) for this process and
    everything it starts. Called in the child between fork and exec."""
    abi = landlock_abi()
    if abi == 0:
        return
    handled = _READ | (_WRITE if abi >= 3 else _WRITE & ~(1 << 14))
    if abi < 2:
        handled &= ~(1 << 13)
    attr = ctypes.c_uint64(handled)
    ruleset = _libc.syscall(_SYS_LANDLOCK[0], ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    def allow(path: str, access: int) -> None:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        try:
            rule = PathBeneath(access & handled, fd)
            if _libc.syscall(_SYS_LANDLOCK[1], ruleset, 1, ctypes.byref(rule), 0) < 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
        finally:
            os.close(fd)

    allow("/", _READ)
    allow("/dev/null", (1 << 1) | (1 << 2))
    for folder in writable:
        allow(str(folder), _READ | _WRITE)
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 or _libc.syscall(_SYS_LANDLOCK[2], ruleset, 0) < 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)


def _pids_group(limit: int) -> Path | None:
    """A fresh pids cgroup allowing ``limit`` processes, if this process may make one."""
    for base in PIDS_CGROUPS:
        if not (base / "cgroup.procs").exists() or not os.access(base, os.W_OK):
            continue
        group = base / f"bagpipe-{os.getpid()}-{time.monotonic_ns()}"
        try:
            group.mkdir()
            (group / "pids.max").write_text(str(limit))
            return group
        except OSError:
            if group.exists():
                group.rmdir()
    return None


def _user_processes() -> int:
    uid = os.getuid()
    return sum(1 for entry in Path("/proc").iterdir() if entry.name.isdigit() and _owner(entry) == uid)


def _owner(entry: Path) -> int:
    try:
        return entry.stat().st_uid
    except OSError:
        return -1


def _prepare(limits: Limits, writable: list[Path], group: Path | None, nproc: int) -> None:
    """In the child, before exec: its process limit, filesystem rules, resource limits —
    the address space last, as the parent's own may already be over it."""
    if group is not None:
        (group / "cgroup.procs").write_text(str(os.getpid()))
    else:
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    _landlock(writable)
    mb = 1024 * 1024
    for which, value in ((resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_FSIZE, limits.file_mb * mb),
                         (resource.RLIMIT_NOFILE, limits.open_files), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_AS, limits.memory_mb * mb)):
        resource.setrlimit(which, (value, value))


def run(argv: list[str], *, cwd: Path, writable: list[Path], stdout: Path, stderr: Path, limits: Limits,
        env: dict[str, str], timeout_s: float) -> Result:
    """Run ``argv`` to its end (or until ``timeout_s``, then SIGTERM, then SIGKILL its group)."""
    group = _pids_group(limits.processes) if os.geteuid() == 0 else None
    nproc = 0 if group else _user_processes() + limits.processes
    started = time.monotonic()
    try:
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            try:
                process = subprocess.Popen(  # an argv list, never a shell
                    argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True,
                    start_new_session=True, preexec_fn=lambda: _prepare(limits, writable, group, nproc),
                )
            except (OSError, subprocess.SubprocessError) as exc:
                return Result(127, f"could not start {argv[0]!r}: {exc}", 0.0)
            why = ""
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                why = f"ran past its timeout of {timeout_s:g} s"
                kill_group(process, GRACE_S)
            kill_group(process, 0)  # whatever it left running in its group goes with it
    finally:
        if group is not None:
            _empty(group)
    code = process.returncode
    if not why and code < 0:
        why = {signal.SIGXCPU: "used up its CPU time limit", signal.SIGXFSZ: "wrote past its file size limit",
               signal.SIGKILL: "was killed (CPU or memory limit)"}.get(-code, f"killed by {signal.Signals(-code).name}")
    return Result(code, why, time.monotonic() - started)


def kill_group(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the process's group and SIGKILL it after ``grace`` s (at once if 0); reap it."""
    for sig in ((signal.SIGTERM, signal.SIGKILL) if grace else (signal.SIGKILL,)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        if sig is signal.SIGTERM:
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
    process.wait()


def _empty(group: Path) -> None:
    """Kill whatever is left in a pids cgroup (even what left the process group), remove it."""
    for _ in range(50):
        pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    try:
        group.rmdir()
    except OSError:
        pass  # still draining; the kernel frees it when its last process is reaped
