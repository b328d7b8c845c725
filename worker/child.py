"""Run attempts' stages in a child process of its own process group, so that a revoked
attempt can really be killed — the stage and everything it started — SIGTERM first, then
SIGKILL after a grace period.

Each worker slot keeps one such child warm and hands it attempt after attempt; a kill, a
failure or a long service replaces it. Children come from the worker's fork server
(``worker.forkserver``): a single-threaded process that has imported the stage modules, so a
worker's threads and connection pools never leak into a stage, reached only through a socket
pair the worker holds.
"""

from __future__ import annotations

import ctypes
import math
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from pipeline import stages
from pipeline.failures import FailureClass, classify
from pipeline.redact import protect_logging
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from worker import forkserver, private

_PR_SET_PDEATHSIG = 1
REDELIVER_S = 0.5  # SIGTERM is sent again to a stage process's main thread this often until taken
_sending = threading.Lock()  # one message at a time on the pipe to the worker
_unwound = threading.Event()  # a stage process has ended its stage, or is ending: SIGTERM has done its work


@dataclass(frozen=True)
class Outcome:
    """How a stage ended: its outputs, or a failure class and message."""

    outputs: list[str] | None = None
    failure: FailureClass | None = None
    error: str = ""
    cached: bool = False  # the outputs already existed: nothing was computed
    no_data: bool = False  # none of the sources exist: nothing to make, not a failure


@dataclass(frozen=True)
class Progress:
    """A running stage's share of its work done (``StageContext.progress``)."""

    done: float


PROGRESS_EVERY_S = 0.1  # a stage process sends its stage's progress at most this often


BUILTIN_STAGE_MODULES = ("pipeline.modis.tilestage,pipeline.reduction.stage,pipeline.modis.points,"
                         "pipeline.reduction.gather,pipeline.reduction.zonal,pipeline.reduction.cubes")
TASKS_PER_PROCESS = 200  # attempts a stage process runs before it is replaced


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (the fork server) dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the monitor still revokes the attempt, its output is never used


def _watch(conn: Connection) -> None:
    """Start the stage process's one helper thread, which watches for two things:

    - its worker gone (no reader is left on the outcome pipe): SIGKILL this process group
      at once, whether or not the fork server has noticed yet.
    - SIGTERM: it is sent again to the main thread every REDELIVER_S until the process has
      unwound (``_unwind``). Python runs a handler only in the main thread, once that thread
      wakes, and a signal caught by another thread (a stage's upload threads, a cache
      marker's toucher) does not wake it; and the SystemExit the handler raises can be lost
      when it lands inside library code that does not let it through. Either way the stage
      would run on to its SIGKILL, past the grace in which its ``finally`` blocks tidy up.
    """
    readable, writable = os.pipe()
    os.set_blocking(writable, False)
    signal.set_wakeup_fd(writable, warn_on_full_buffer=False)  # the number of each signal caught
    main = threading.main_thread().ident
    assert main is not None

    def watch() -> None:
        poller = select.poll()
        poller.register(conn.fileno(), 0)  # reports only POLLERR/POLLHUP (and POLLNVAL)
        poller.register(readable, select.POLLIN)
        again: float | None = None  # when to send SIGTERM to the main thread next
        while True:
            wait = None if again is None else max(0, math.ceil((again - time.monotonic()) * 1000))
            for fd, event in poller.poll(wait):
                if fd == readable:
                    if signal.SIGTERM in os.read(readable, 64) and again is None and not _unwound.is_set():
                        again = time.monotonic()
                elif event & select.POLLNVAL:
                    return  # the pipe was closed: the stage process is ending
                elif event & (select.POLLERR | select.POLLHUP):
                    os.killpg(0, signal.SIGKILL)
            if again is not None and _unwound.is_set():
                again = None  # taken
            elif again is not None and time.monotonic() >= again:
                signal.pthread_kill(main, signal.SIGTERM)
                again = time.monotonic() + REDELIVER_S

    threading.Thread(target=watch, name="worker-watch", daemon=True).start()


def _unwind(signum: int, _frame: object) -> None:
    """SIGTERM (a revoked or cancelled attempt, a worker stopping) unwinds the stage, so that
    its ``finally`` blocks tidy up in the grace period — a cache marker of a tile it was
    making is removed, not left for a retry that may never come; SIGKILL follows the grace.
    Sent again until it has taken (``_watch``), it does nothing once the process is
    unwinding: the stage has ended, or a SystemExit is on its way up (its ``finally``
    blocks running, and what they handle on the way: a retry's sleep in an ``except``)."""
    if _unwound.is_set() or _unwinding():
        return
    raise SystemExit(128 + signum)


def _unwinding() -> bool:
    """Whether a SystemExit is being handled, or is the context of the exception being
    handled (a ``finally`` block's error, handled within it)."""
    seen, depth = sys.exc_info()[1], 0
    while seen is not None and depth < 64:
        if isinstance(seen, SystemExit):
            return True
        seen, depth = seen.__context__, depth + 1
    return False


def _serve(conn: Connection, settings: Settings, tasks: int) -> None:
    """The stage process: run the stages the worker sends, one at a time, up to ``tasks``
    of them; stop at the first that fails, so that a failure never leaves its state to the
    next attempt."""
    os.setpgid(0, 0)  # its own process group: killing it kills everything it started
    private.make_private()
    protect_logging()  # a stage's log lines reach the worker's log as they are
    _die_with_parent()
    signal.signal(signal.SIGTERM, _unwind)
    _watch(conn)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        _serve_stages(settings, conn, tasks)
    finally:
        _unwound.set()  # nothing left for a SIGTERM sent again to stop


def _serve_stages(settings: Settings, conn: Connection, tasks: int) -> None:
    clients: Clients | None = None
    for _ in range(tasks):
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        stage, context = request
        reporter = _Reporter(conn)
        try:
            stages.load(f"{BUILTIN_STAGE_MODULES},{settings.stage_modules}")
            clients = clients or Clients(settings)
            ctx = stages.StageContext(clients=clients, reporter=reporter, **context)
            stages.STAGES[stage](ctx)
            outcome = Outcome(outputs=ctx.outputs, cached=ctx.cached, no_data=ctx.no_data)
        except BaseException as exc:
            _unwound.set()  # the stage has ended: its outcome is sent whole
            reporter.end(Outcome(failure=classify(exc), error=f"{type(exc).__name__}: {exc}"))
            return
        reporter.end(outcome)


class _Reporter:
    """Sends a stage's progress to its worker, from any of the stage's threads, at most every
    PROGRESS_EVERY_S (the worker looks five times a second), and nothing once the stage has
    ended: a thread it left behind cannot speak for the next attempt."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.sent = -PROGRESS_EVERY_S
        self.live = True

    def __call__(self, done: float) -> None:
        with _sending:
            if self.live and time.monotonic() - self.sent >= PROGRESS_EVERY_S:
                self.conn.send(Progress(done))
                self.sent = time.monotonic()

    def end(self, outcome: Outcome) -> None:
        """The stage's last word."""
        with _sending:
            self.live = False
            self.conn.send(outcome)


class StageProcess:
    """A slot's stage process, kept warm: it runs one attempt's stage after another in a
    process group of its own, with its storage clients and imports ready, so that a task
    does not pay for a fork and a fresh connection pool. A revoked attempt kills it with
    its whole group; the slot starts a new one for its next task. It serves at most
    ``tasks`` attempts, then is replaced (whatever a stage leaks does not accumulate)."""

    def __init__(self, settings: Settings, tasks: int = TASKS_PER_PROCESS) -> None:
        ours, theirs = socket.socketpair()
        self._conn = Connection(ours.detach())
        self.process = forkserver.spawn(_serve, (settings, tasks), theirs)
        self._left = tasks  # attempts it will still take: it ends after a failure or the last
        self._began = 0.0  # when the running stage started (monotonic)
        self._said: list[tuple[float, float]] = []  # its first and latest word: (s since it began, share done)

    def start(self, stage: str, context: dict[str, Any]) -> None:
        """Run ``stage`` for one attempt (``context``: the StageContext's fields)."""
        self._left -= 1
        self._began, self._said = time.monotonic(), []
        self._conn.send((stage, context))

    def projected_s(self) -> float | None:
        """The seconds the running stage will take in all, at the pace it has said since
        its first word (None until it has said it has done more): what it did before
        that word (reading its inputs, starting a program) does not count against it."""
        if len(self._said) < 2:
            return None
        (first_at, first), (last_at, last) = self._said
        if last <= first or last_at <= first_at:
            return None
        return last_at + (1 - last) * (last_at - first_at) / (last - first)

    def usable(self) -> bool:
        """Whether it takes another attempt (alive, not failed, not at its end of service)."""
        return self._left > 0 and self.process.is_alive()

    def poll(self, timeout: float) -> Outcome | None:
        """The outcome if the stage ended within ``timeout`` seconds, else None (its progress
        said meanwhile kept for ``projected_s``)."""
        deadline = time.monotonic() + timeout
        while self._conn.poll(max(0.0, deadline - time.monotonic())):
            try:
                said: Outcome | Progress = self._conn.recv()
            except EOFError:
                return self._died()
            if isinstance(said, Progress):
                self._said = [*self._said[:1], (time.monotonic() - self._began, said.done)]
                continue
            if said.failure is not None:
                self._left = 0
            return said
        if not self.process.is_alive():
            # it may have sent its outcome and exited between the wait above and this check
            return self.poll(0) if self._conn.poll(0) else self._died()
        return None

    def _died(self) -> Outcome:
        self._left = 0
        self.process.join(5)
        self._conn.close()
        code = self.process.exitcode
        if code is not None and code < 0:
            return Outcome(failure=FailureClass.USER_CODE,
                           error=f"stage process killed by signal {signal.Signals(-code).name}")
        return Outcome(failure=FailureClass.UNKNOWN, error=f"stage process exited with code {code}")

    def kill(self, grace: float) -> None:
        """SIGTERM the process group, then SIGKILL it if still there after ``grace`` s."""
        pid = self.process.pid
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _group_alive(pid):
                time.sleep(0.05)
            if not _group_alive(pid):
                break
        self._left = 0
        self.process.join(5)
        self._conn.close()

    def signal(self, sig: int) -> None:
        """Send ``sig`` to its process group (and nothing else: safe while another thread
        polls it)."""
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        """Let it end (the worker stops)."""
        if not self._conn.closed:
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._conn.close()
        self.process.join(5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie leader counts as gone once nothing else is in the group
    return not _only_zombies(pgid)


def _only_zombies(pgid: int) -> bool:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return False
    return True
