"""Run a scientist's program in a sandbox: never through a shell; a cell of its own
(``pipeline.reduction.jail``: PID, mount, network and IPC namespaces where the kernel gives
them, Landlock, seccomp, no capabilities) that dies with its attempt; resource limits; a
minimal environment (no storage keys, no secrets); a private temporary folder; stdout/stderr
to files. Its process count is bounded by RLIMIT_NPROC, or, for root (which that limit does
not bind: a container), by a ``pids`` cgroup of its own.

What holds depends on what the kernel gives, found once per process by the jail's probe
(:func:`mode`). With namespaces, the program sees only its cell. Without them it sees the
host's processes but reaches none (``jail``'s seccomp filter and Landlock scopes) and gets
no network. Without Landlock or seccomp no program runs at all: its attempt fails saying
why, and the worker's health row says so from its start.

A program whose installed reducer lists hosts reaches them, and nothing else, through the
sandbox's proxy (``pipeline.reduction.proxy``), whose listening socket is on the loopback
of the cell's own network namespace: only where there are namespaces.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.reduction import jail
from pipeline.reduction.proxy import Proxy
from pipeline.reduction.reducers import Limits

GRACE_S = 5.0
PIDS_CGROUPS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))  # cgroup v1, v2
JAIL = Path(jail.__file__).resolve()
# what any program may read besides its own folders: the interpreter and its libraries
PYTHON = tuple(sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}))
landlock_abi = jail.landlock_abi
HANDOVER_S = 10.0  # for the jail to hand over the proxy's listening socket


@dataclass(frozen=True)
class Mode:
    """What the kernel gives a program's cell: namespaces, a Landlock ABI, seccomp filters."""

    namespaces: bool
    landlock: int
    seccomp: bool

    @property
    def missing(self) -> str:
        """Why no program may run here ("" if one may)."""
        lacks = [what for what, has in (("Landlock", self.landlock > 0), ("seccomp filters", self.seccomp)) if not has]
        return f"this kernel gives no {' and no '.join(lacks)}, without which a program is not confined" \
            if lacks else ""

    def describe(self) -> str:
        """The mode in a few words: the worker's health row shows it."""
        if self.missing:
            return f"none: {self.missing}; reductions refused"
        cell = "namespaces" if self.namespaces else "no namespaces (no network for programs)"
        return f"{cell}, Landlock ABI {self.landlock}, seccomp"


@functools.cache
def mode(namespaces: bool = True) -> Mode:
    """The sandbox's mode here (probed once per process); ``namespaces``: False makes it the
    mode without them whatever the kernel gives (``BAGPIPE_SANDBOX=no-namespaces``)."""
    try:
        probed = subprocess.run([sys.executable, "-I", "-S", str(JAIL), "--probe"], capture_output=True, text=True,
                                timeout=30, check=True)
        found = json.loads(probed.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        found = {"namespaces": False, "landlock": 0, "seccomp": False}
    return Mode(namespaces=namespaces and bool(found["namespaces"]), landlock=int(found["landlock"]),
                seccomp=bool(found["seccomp"]))


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
        env: dict[str, str], timeout_s: float, readable: list[Path] | None = None, network: Sequence[str] = (),
        namespaces: bool = True) -> Result:
    """Run ``argv`` to its end (or until ``timeout_s``, then SIGTERM, then SIGKILL its cell).
    It may read the system's programs and libraries, Python's, ``cwd`` and ``readable``; write
    only in ``writable``; reach only the hosts ``network`` lists ("host:port", through the
    proxy; nothing if empty). ``namespaces``: False runs it as where the kernel has none."""
    here = mode(namespaces)
    if here.missing:
        return _refused(stderr, f"was not run: {here.missing}")
    if network and not here.namespaces:
        return _refused(stderr, "was not run: it asks for the network, which a program gets only in namespaces "
                                "of its own, and this worker has none")
    group = _pids_group(limits.processes) if os.geteuid() == 0 else None
    ours, theirs = socket.socketpair() if network else (None, None)
    config = {
        "argv": argv, "writable": [str(p) for p in writable],
        "readable": [*PYTHON, str(cwd), *(str(p) for p in readable or [])],
        "limits": dataclasses.asdict(limits), "namespaces": here.namespaces, "landlock": here.landlock,
        "network": bool(network), "channel": theirs.fileno() if theirs else None, "parent": os.getpid(),
        "grace_s": GRACE_S,
        "cgroup": str(group) if group else None, "nproc": 0 if group else _user_processes() + limits.processes,
    }
    started = time.monotonic()
    proxy: Proxy | None = None
    try:
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            try:
                process = subprocess.Popen(  # an argv list, never a shell
                    [sys.executable, "-I", "-S", str(JAIL), json.dumps(config)], cwd=cwd, env=env,
                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, close_fds=True, start_new_session=True,
                    pass_fds=(theirs.fileno(),) if theirs else (),
                )
            except (OSError, subprocess.SubprocessError) as exc:
                if ours is not None:
                    ours.close()
                return Result(127, f"could not start {argv[0]!r}: {exc}", 0.0)
            finally:
                if theirs is not None:
                    theirs.close()
            if ours is not None:
                proxy = _proxy_for(ours, network)
            why = ""
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                why = f"ran past its timeout of {timeout_s:g} s"
                kill_group(process, GRACE_S)
            kill_group(process, 0)  # whatever it left running in its group goes with it
    finally:
        if proxy is not None:
            proxy.close()
        if group is not None:
            _empty(group)
    code = process.returncode
    said = stderr.read_text(errors="replace") if code in (126, 127) else ""
    if not why and code == 127 and "could not start" in said:
        why = f"could not start {argv[0]!r}"
    if not why and code == 126 and said.startswith("jail: "):
        why = f"was not run: {said.splitlines()[-1].removeprefix('jail: ')}"
    if not why and code < 0:
        why = {signal.SIGXCPU: "used up its CPU time limit", signal.SIGXFSZ: "wrote past its file size limit",
               signal.SIGKILL: "was killed (CPU or memory limit)"}.get(signal.Signals(-code),
                                                                         f"killed by {signal.Signals(-code).name}")
    return Result(code, why, time.monotonic() - started)


def _refused(stderr: Path, why: str) -> Result:
    stderr.write_text(f"bagpipe: the program {why}\n")
    return Result(126, why, 0.0)


def _proxy_for(ours: socket.socket, hosts: Sequence[str]) -> Proxy | None:
    """The proxy on the listening socket the jail hands over on ``ours`` (None if it handed
    none over: it failed, and says why on the program's stderr)."""
    with ours:
        ours.settimeout(HANDOVER_S)
        try:
            _, fds, _, _ = socket.recv_fds(ours, 16, 1)
        except OSError:
            return None
    if not fds:
        return None
    return Proxy(socket.socket(fileno=fds[0]), hosts).start()


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
