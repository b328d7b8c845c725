"""Run attempts' stages in a child process of its own process group, so that a revoked
attempt can really be killed — the stage and everything it started — SIGTERM first, then
SIGKILL after a grace period.

Each worker slot keeps one such child warm and hands it attempt after attempt; a kill, a
failure or a long service replaces it. Children come from a ``forkserver``: a
single-threaded server that preloads the stage modules, so a worker's threads and
connection pools never leak into a stage.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import select
import signal
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from pipeline import stages
from pipeline.lifecycle.failures import FailureClass, classify
from pipeline.redact import protect_logging
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from worker import private

_PR_SET_PDEATHSIG = 1
_context = multiprocessing.get_context("forkserver")
# bagpipe.cli too: a child re-runs the main module (the CLI, for `bagpipe worker`), cheap
# once its imports are already in the server.
_context.set_forkserver_preload(["worker.private", "pipeline.stages", "pipeline.modis.tilestage",
                                 "pipeline.reduction.stage", "pipeline.storage.clients", "worker.child",
                                 "bagpipe.cli"])


@dataclass(frozen=True)
class Outcome:
    """How a stage ended: its outputs, or a failure class and message."""

    outputs: list[str] | None = None
    failure: FailureClass | None = None
    error: str = ""
    cached: bool = False  # the outputs already existed: nothing was computed
    no_data: bool = False  # none of the sources exist: nothing to make, not a failure


BUILTIN_STAGE_MODULES = "pipeline.modis.tilestage,pipeline.reduction.stage"
TASKS_PER_PROCESS = 200  # attempts a stage process runs before it is replaced


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (the fork server) dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the monitor still revokes the attempt, its output is never used


def _die_with_worker(conn: Connection) -> None:
    """SIGKILL this process group as soon as its worker is gone (no reader is left on the
    outcome pipe). The fork server alone would not see to it: every child it forks holds a
    copy of the server's liveness pipe, so the server outlives a killed worker for as long
    as that worker's stages run, and they would run to the end for nothing."""

    def watch() -> None:
        poller = select.poll()
        poller.register(conn.fileno(), 0)  # reports only POLLERR/POLLHUP (and POLLNVAL)
        while True:
            for _, event in poller.poll():
                if event & select.POLLNVAL:
                    return  # the pipe was closed: the stage process is ending
                if event & (select.POLLERR | select.POLLHUP):
                    os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="worker-watch", daemon=True).start()


def _unwind(signum: int, _frame: object) -> None:
    """SIGTERM (a revoked or cancelled attempt, a worker stopping) unwinds the stage, so that
    its ``finally`` blocks tidy up in the grace period — a cache marker of a tile it was
    making is removed, not left for a retry that may never come; SIGKILL follows the grace."""
    raise SystemExit(128 + signum)


def _serve(settings: Settings, conn: Connection, tasks: int) -> None:
    """The stage process: run the stages the worker sends, one at a time, up to ``tasks``
    of them; stop at the first that fails, so that a failure never leaves its state to the
    next attempt."""
    os.setpgid(0, 0)  # its own process group: killing it kills everything it started
    private.make_private()
    protect_logging()  # a stage's log lines reach the worker's log as they are
    _die_with_parent()
    _die_with_worker(conn)
    signal.signal(signal.SIGTERM, _unwind)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    clients: Clients | None = None
    for _ in range(tasks):
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        stage, context = request
        try:
            stages.load(f"{BUILTIN_STAGE_MODULES},{settings.stage_modules}")
            clients = clients or Clients(settings)
            ctx = stages.StageContext(clients=clients, **context)
            stages.STAGES[stage](ctx)
            outcome = Outcome(outputs=ctx.outputs, cached=ctx.cached, no_data=ctx.no_data)
        except BaseException as exc:
            conn.send(Outcome(failure=classify(exc), error=f"{type(exc).__name__}: {exc}"))
            return
        conn.send(outcome)


class StageProcess:
    """A slot's stage process, kept warm: it runs one attempt's stage after another in a
    process group of its own, with its storage clients and imports ready, so that a task
    does not pay for a fork and a fresh connection pool. A revoked attempt kills it with
    its whole group; the slot starts a new one for its next task. It serves at most
    ``tasks`` attempts, then is replaced (whatever a stage leaks does not accumulate)."""

    def __init__(self, settings: Settings, tasks: int = TASKS_PER_PROCESS) -> None:
        self._conn, child_end = _context.Pipe(duplex=True)
        self.process = _context.Process(target=_serve, args=(settings, child_end, tasks), daemon=False)
        self.process.start()
        child_end.close()
        self._left = tasks  # attempts it will still take: it ends after a failure or the last

    def start(self, stage: str, context: dict[str, Any]) -> None:
        """Run ``stage`` for one attempt (``context``: the StageContext's fields)."""
        self._left -= 1
        self._conn.send((stage, context))

    def usable(self) -> bool:
        """Whether it takes another attempt (alive, not failed, not at its end of service)."""
        return self._left > 0 and self.process.is_alive()

    def poll(self, timeout: float) -> Outcome | None:
        """The outcome if the stage ended within ``timeout`` seconds, else None."""
        if self._conn.poll(timeout):
            try:
                outcome: Outcome = self._conn.recv()
            except EOFError:
                return self._died()
            if outcome.failure is not None:
                self._left = 0
            return outcome
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
        if pid is None:
            return
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
        if self.process.pid is not None:
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
