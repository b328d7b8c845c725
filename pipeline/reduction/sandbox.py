"""Run a scientist's program in a sandbox: never through a shell; a cell of its own
(``pipeline.reduction.jail``: PID, mount and network namespaces, Landlock, no capabilities) that dies
with its attempt; resource limits; a minimal environment (no storage keys, no secrets); a
private temporary folder; stdout/stderr to files. Its process count is bounded by
RLIMIT_NPROC, or, for root (which that limit does not bind: a container), by a ``pids``
cgroup of its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline.reduction import jail
from pipeline.reduction.reducers import Limits

GRACE_S = 5.0
PIDS_CGROUPS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))  # cgroup v1, v2
JAIL = Path(jail.__file__).resolve()
# what any program may read besides its own folders: the interpreter and its libraries
PYTHON = tuple(sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}))
landlock_abi = jail.landlock_abi


@dataclass(frozen=True)
class Result:
    exit_code: int  # negative: killed by that signal
    why: str  # "" when it exited by itself; else what stopped it
    seconds: float


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


def run(argv: list[str], *, cwd: Path, writable: list[Path], stdout: Path, stderr: Path, limits: Limits,
        env: dict[str, str], timeout_s: float, readable: list[Path] | None = None, network: bool = False) -> Result:
    """Run ``argv`` to its end (or until ``timeout_s``, then SIGTERM, then SIGKILL its cell).
    It may read the system's folders, Python's, ``cwd`` and ``readable``; write only in
    ``writable``; reach the network only if ``network``."""
    group = _pids_group(limits.processes) if os.geteuid() == 0 else None
    config = {
        "argv": argv, "writable": [str(p) for p in writable],
        "readable": [*PYTHON, str(cwd), *(str(p) for p in readable or [])],
        "limits": dataclasses.asdict(limits), "network": network, "parent": os.getpid(),
        "cgroup": str(group) if group else None, "nproc": 0 if group else _user_processes() + limits.processes,
    }
    started = time.monotonic()
    try:
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            try:
                process = subprocess.Popen(  # an argv list, never a shell
                    [sys.executable, "-I", "-S", str(JAIL), json.dumps(config)], cwd=cwd, env=env,
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True, start_new_session=True,
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
    if not why and code == 127 and "could not start" in stderr.read_text(errors="replace"):
        why = f"could not start {argv[0]!r}"
    if not why and code < 0:
        why = {signal.SIGXCPU: "used up its CPU time limit", signal.SIGXFSZ: "wrote past its file size limit",
               signal.SIGKILL: "was killed (CPU or memory limit)"}.get(signal.Signals(-code),
                                                                         f"killed by {signal.Signals(-code).name}")
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
