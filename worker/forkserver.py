"""A worker's fork server: the single-threaded process that forks its slots' stage processes.

A stage process must not be forked from the worker itself: the worker's threads (its slots,
its receives, its connection pools' locks) would be copied mid-step into it. So the worker
starts, once, a fresh interpreter that imports the stage modules (``PRELOAD``) and then does
nothing but fork, one request at a time, from its one thread; each stage process starts with
those imports made.

It is reached only through the socket pair the worker made when it started it: no address in
the file system, no abstract name, nothing another process can connect to, so that no
program — a scientist's, in its sandbox or not — can ask it for anything. A request is a
pickled ``(target, args)`` with two descriptors: the stage process's end of its connection to
the worker, and the write end of a pipe on which the server writes the process's exit code
(a signal's as a negative number, as ``subprocess`` says it) once it has reaped it, then
closes it; the server answers the new process's pid. The server ends when its worker closes
its end (or dies), and the stage processes it forked die with it (``worker.child``).
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

# the stage processes' imports, made once in the server (``pipeline.stages.load`` imports
# whatever more the settings name, in each stage process)
PRELOAD = ("worker.private", "pipeline.stages", "pipeline.modis.tilestage", "pipeline.reduction.stage",
           "pipeline.storage.clients", "worker.child")
MAX_REQUEST = 1024 * 1024  # a pickled request's bytes (a Settings is a few kB)
_PR_SET_PDEATHSIG = 1


class ForkServer:
    """The worker's side: the server's process and the worker's end of its socket pair."""

    def __init__(self) -> None:
        self._socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = ("import json, sys; sys.path[:] = json.loads(sys.argv[2]); "
                "from worker.forkserver import main; main(int(sys.argv[1]))")
        with theirs:
            self.process = subprocess.Popen(  # the worker's environment: a stage process needs its identity
                [sys.executable, "-c", code, str(theirs.fileno()), json.dumps(sys.path)],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        self._lock = threading.Lock()  # one request at a time: slots start stage processes from their threads

    def alive(self) -> bool:
        return self.process.poll() is None

    def spawn(self, target: Callable[..., None], args: tuple[Any, ...], conn: socket.socket) -> Child:
        """Fork a process that runs ``target(Connection(conn), *args)`` (``conn``: a copy
        of it goes to the process). OSError if the server is gone."""
        read_end, write_end = os.pipe()
        try:
            with self._lock:
                socket.send_fds(self._socket, [pickle.dumps((target, args))], [conn.fileno(), write_end])
                answer = self._socket.recv(64)
            if not answer:
                raise OSError("the fork server has ended")
        except OSError:
            os.close(read_end)
            raise
        finally:
            os.close(write_end)
        return Child(int(answer), read_end)

    def close(self) -> None:
        """End the server (and with it the stage processes it forked)."""
        self._socket.close()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Child:
    """A process the fork server forked, as its worker sees it: its pid, whether it is alive,
    and its exit code once it has ended (None before)."""

    def __init__(self, pid: int, status: int) -> None:
        self.pid = pid
        self._status: int | None = status  # the read end of its status pipe, until read
        self.exitcode: int | None = None

    def is_alive(self) -> bool:
        return not self._ended(0)

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds (None: for ever) for it to end."""
        self._ended(timeout)

    def _ended(self, timeout: float | None) -> bool:
        if self._status is None:
            return True
        # poll, not select: a worker's descriptors may number past select's 1,024
        waiting = select.poll()
        waiting.register(self._status, select.POLLIN)
        if not waiting.poll(None if timeout is None else timeout * 1000):
            return False
        said = os.read(self._status, 32)
        os.close(self._status)
        self._status = None
        # nothing said: the server died before it reaped the process, which it takes with it
        self.exitcode = int(said) if said else -signal.SIGKILL
        return True


_server: ForkServer | None = None
_starting = threading.Lock()


def spawn(target: Callable[..., None], args: tuple[Any, ...], conn: socket.socket) -> Child:
    """Fork a process that runs ``target(Connection(conn), *args)`` from this worker's fork
    server (started first if there is none; a new one if it has ended); ``conn`` is handed
    over (closed here)."""
    with conn:
        try:
            return _running().spawn(target, args, conn)
        except OSError:  # it ended between the look and the request
            return _running(replace=True).spawn(target, args, conn)


def _running(replace: bool = False) -> ForkServer:
    global _server
    with _starting:
        if _server is None or replace or not _server.alive():
            if _server is not None:
                _server.close()
            _server = ForkServer()
        return _server


# --- the server's own process --------------------------------------------------------------
def main(fd: int) -> None:
    """Serve the worker on the socket ``fd`` until it closes its end."""
    # told when the worker dies, to take its stage processes' groups with it (_end): were it
    # killed outright, a stage process would die of its own death signal before it could
    # kill what it started, and that would outlive the worker
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGHUP)
    for module in PRELOAD:
        importlib.import_module(module)  # worker.private first: the server is not dumpable
    # and the built-in stages every stage process loads (exactextract, zarr, h5py, pyarrow
    # among them: 0.35 to 0.45 s of CPU a process when each imported them for itself)
    from pipeline import stages
    from worker import child

    stages.load(child.BUILTIN_STAGE_MODULES)
    # pyarrow's first array imports pandas and pyarrow's shim for it (to tell pandas' objects
    # apart): made here, not in each stage process's first table (a zonal, point or gather
    # task's part: 0.2 to 0.5 s)
    import pyarrow

    pyarrow.array([])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C to the worker's terminal is the worker's
    control = socket.socket(fileno=fd)
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
    for heard in (signal.SIGCHLD, signal.SIGHUP):  # a handler, so that the wakeup fd hears it
        signal.signal(heard, lambda *_: None)
    children: dict[int, int] = {}  # pid -> the write end of its status pipe
    poller = select.poll()
    poller.register(control, select.POLLIN)
    poller.register(woken, select.POLLIN)
    while True:
        for ready, _ in poller.poll():
            if ready == woken:
                if signal.SIGHUP in os.read(woken, 512):  # the worker is gone
                    _end(children)
                _reap(children)
                continue
            try:
                request, fds, _, _ = socket.recv_fds(control, MAX_REQUEST, 2)
            except OSError:
                request, fds = b"", []
            if not request:  # the worker is gone
                _end(children)
            if len(fds) != 2:
                for extra in fds:
                    os.close(extra)
                control.send(b"")
                continue
            conn, status = fds
            pid = os.fork()
            if pid == 0:
                control.close()
                for held in (woken, wake, status, *children.values()):
                    os.close(held)
                _child(request, conn)
            os.close(conn)
            children[pid] = status
            control.send(str(pid).encode())
        _reap(children)


def _end(children: dict[int, int]) -> NoReturn:
    """The worker is gone: kill every stage process's group (each is its own group's
    leader), so that nothing a stage started outlives its worker, and exit."""
    for pid in children:
        for kill in (os.killpg, os.kill):  # the process itself too, were it not its group's leader yet
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass  # ended already
    os._exit(0)


def _reap(children: dict[int, int]) -> None:
    """Write the exit code of every child that has ended to its status pipe, and close it."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        write_end = children.pop(pid, None)
        if write_end is not None:
            os.write(write_end, str(os.waitstatus_to_exitcode(status)).encode())
            os.close(write_end)


def _child(request: bytes, conn: int) -> None:
    """A forked stage process: run the request's target, exit with its code (never returns)."""
    from multiprocessing.connection import Connection

    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    code = 1
    try:
        target, args = pickle.loads(request)
        target(Connection(conn), *args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    os._exit(code)
