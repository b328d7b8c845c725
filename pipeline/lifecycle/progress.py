"""A task ended: what follows for its job. One module for whoever sees it end — an
attempt's end (``pipeline.lifecycle.ends``, for its worker or the monitor), the sweep's
periodic pass.

The transition that ended the task has already counted it off its job (its terminal
rollup) and released a reduction waiting on it (its dependency counter). What is left is
the job's: top up its window of released tasks, release its gathers once every other task
has ended (``planner.release_gathers``), and, once every task is terminal, announce the
completion (one ``done`` message; the finisher it wakes sends the one email, under its
lease). Announcing is idempotent and so is topping up: the worker, the monitor and the
sweep may all do it for the same task, and a process that dies before it does leaves it to
the sweep's next pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from pipeline.lifecycle import completion, jobs, planner, rollups, tasks, transitions
from pipeline.lifecycle.jobs import JobRow
from pipeline.lifecycle.status import JobState
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)
JOB_CHECK_S = 1.0  # a worker looks at a job at most this often, until its end is near
NEAR_END = 16  # a job of all released with no more than this many tasks unended (last seen): every end is looked at
FORGET_JOBS_AFTER = 1000  # jobs whose last look a worker remembers
TOP_UP_SHARE = 0.25  # after a task's end, the window is topped up once this share of it has drained


def task_ended(clients: Clients, job: str, row: JobRow | None = None,
               counts: Counter[str] | None = None) -> bool:
    """One of ``job``'s tasks ended: announce the job done if that was its last, else top up
    its window. ``row`` and ``counts`` (the job row and its ``tasks.state_counts``) spare the
    reads when the caller has just made them. Returns whether it announced."""
    return _follow(clients, job, row, counts)[0]


def _follow(clients: Clients, job: str, row: JobRow | None, counts: Counter[str] | None,
            released: bool = False) -> tuple[bool, bool, int]:
    """``task_ended``, whether every tile task is released once it is done (``released``:
    the caller knows they all were, though ``row`` was read before the last were), and how
    many of the job's tasks were not ended."""
    row = row if row is not None else jobs.get(clients, job)
    if counts is None:
        counts = tasks.state_counts(clients.tasks, row.parts)
    done = sum(tasks.terminal_of(counts).values())
    if completion.all_terminal(clients, row, done):
        jobs.announce_done(clients, job)
        return True, True, 0
    planner.release_gathers(clients, row, done)
    if released or row.all_released:
        return False, True, row.total - done
    count = planner.release(clients, job, min_room=TOP_UP_SHARE, row=row, counts=counts)
    return False, row.released + count >= row.tiles, row.total - done


def follow_up(clients: Clients, writer: rollups.RollupWriter, job: str, row: JobRow) -> bool:
    """The sweep's pass over one unfinished, planned job: top up the window of a running job,
    go on with a cancellation, and announce a completion nobody made (a worker that died
    between its commit and its announcement, a finisher that died). ``writer`` counts the
    tasks a cancellation ends. Returns whether it announced."""
    if row.state is JobState.RUNNING:
        planner.release(clients, job)
        if row.gathers:  # released by the last task's ender, unless it died first
            planner.release_gathers(clients, row, sum(tasks.terminal_counts(clients.tasks, row.parts).values()))
    elif row.state is JobState.CANCELLING:
        transitions.cancel(clients, row.parts, writer)
    if completion.due(clients, jobs.get(clients, job)):
        jobs.announce_done(clients, job)
        return True
    return False


class Watch:
    """A worker's follow-up of the tasks it ends, at a small, bounded cost per task.

    While a job still has tile tasks to release, none of its tasks can be its last, and the
    window needs a look only now and then (it is topped up a quarter at a time): the worker
    reads the job row and counters at most every ``JOB_CHECK_S`` then, and so while many of
    its tasks are still to end. Once it has seen all released (or released the last itself)
    and no more than ``NEAR_END`` tasks unended, it reads the counters after every task, with
    the row it last read (which has all that needs), so the job's last task is announced at
    once. An end it did not look at (too soon after its last look) may still have been the
    job's last, ended meanwhile by others: :meth:`catch_up`, called from the worker's loop,
    looks at it once ``JOB_CHECK_S`` has passed."""

    def __init__(self, clients: Clients) -> None:
        self.clients = clients
        self._lock = threading.Lock()
        # per job: when this worker last looked, the row it read, whether all were released, and
        # whether its end was near
        self._looked: dict[str, tuple[float, JobRow | None, bool, bool]] = {}
        self._skipped: set[str] = set()  # jobs with a task end not looked at yet

    def task_ended(self, job: str) -> None:
        with self._lock:
            looked_at, known, released, near = self._looked.get(job, (-JOB_CHECK_S, None, False, False))
            if not (released and near) and time.monotonic() - looked_at < JOB_CHECK_S:
                self._skipped.add(job)
                return
            self._skipped.discard(job)
            self._looked[job] = (time.monotonic(), known, released, near)
        row = known if released and known is not None else jobs.get(self.clients, job)
        announced, released, unended = _follow(self.clients, job, row, None, released)
        with self._lock:
            if announced:
                self._looked.pop(job, None)
                return
            self._looked[job] = (time.monotonic(), row, released, unended <= NEAR_END)
            if len(self._looked) > FORGET_JOBS_AFTER:  # jobs finished by other workers
                oldest = sorted(self._looked, key=lambda j: self._looked[j][0])
                for gone in oldest[: len(oldest) // 2]:
                    del self._looked[gone]

    def catch_up(self) -> None:
        """Look at each job with a task end not looked at, once ``JOB_CHECK_S`` has passed
        since its last look: without it, a job whose last tasks all ended that soon after
        their workers' looks would wait for the sweep to be announced (a lease later)."""
        with self._lock:
            due = [job for job in self._skipped
                   if time.monotonic() - self._looked.get(job, (-JOB_CHECK_S, None, False, False))[0] >= JOB_CHECK_S]
        for job in due:
            try:
                self.task_ended(job)
            except Exception as exc:  # the next call tries again; the sweep announces in the end
                log.info("look at job %s put off again: %s", job, exc)
