"""The monitor: revoke attempts that run past their kill threshold or stop heartbeating,
and those of workers found slow. Each is an attempt's end like any other
(``pipeline.lifecycle.ends``): requeued within its retry budget, or DEAD; a backup past its
deadline given up; an attempt whose backup runs left to it.

Running attempts are indexed by deadline in their task's partition (``pipeline.lifecycle.attempts``),
so one pass is a key-range query for "before now" per partition of each active job: no scan. A worker's
claim writes its attempt's entry, every heartbeat moves it, and its commit removes it;
the deadline is the earliest of the kill time, the heartbeat's expiry and the time from
which a backup copy would help. An entry due for that last reason only goes to
``pipeline.lifecycle.speculation``, which may start a backup at the job's tail; an attempt
whose backup runs is left to it until the backup ends.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from pipeline.lifecycle import attempts, ends, jobs, speculation
from pipeline.lifecycle.attempts import Deadline
from pipeline.lifecycle.jobs import JobRow
from pipeline.lifecycle.policy import Act, Ending, Outcome
from pipeline.lifecycle.rollups import RollupWriter
from pipeline.lifecycle.tasks import now
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)
_writer = RollupWriter(f"monitor-{uuid.uuid4().hex[:12]}")


@dataclass
class SweepReport:
    revoked: list[dict[str, Any]] = field(default_factory=list)
    stale: int = 0
    backups: int = 0  # backups asked for


def revoke_overdue(clients: Clients, row: JobRow, report: SweepReport) -> list[Deadline]:
    """End every attempt of the job (its ``row``) whose deadline has passed (one key-range
    query per partition): revoked, or left to its running backup; a backup given up.
    Returns the entries of the running attempts that fell due only for a backup
    (``speculation.consider`` decides)."""
    at = now()
    due: list[Deadline] = []
    for entry in attempts.overdue(clients, row.parts, at):
        if at < entry.kill_at and at < entry.heartbeat_until:
            due.append(entry)  # due only for a backup
            continue
        _end(clients, entry, Ending.OVERDUE if at >= entry.kill_at else Ending.SILENT, report)
    return due


def revoke_slow(clients: Clients, workers: list[str], report: SweepReport) -> None:
    """Take from ``workers``, just found slow, the attempts they run (one query per partition
    of each active job), each a ``worker_slow`` failure requeued at once for a healthy worker: a slow
    machine's worker hears that it is slow at its next report, and gives up what it holds
    only then, at its machine's pace. An attempt whose backup runs is left to its worker,
    which gives way to the backup; a backup a slow worker runs is left to it too (the task
    stays with its attempt either way)."""
    if not workers:
        return
    for job in jobs.active_jobs(clients):
        try:
            parts = jobs.get(clients, job).parts
        except jobs.JobNotFound:
            continue
        for entry in attempts.held_by(clients, parts, workers):
            _end(clients, entry, Ending.SLOW, report)


def _end(clients: Clients, entry: Deadline, ending: Ending, report: SweepReport) -> None:
    """End the attempt whose deadline ``entry`` the monitor read, and report it."""
    ended = ends.end(clients, _writer, entry, Outcome.of(ending))
    move = ended.move
    if move.act is Act.FAIL and ended.applied:
        report.revoked.append({"job": entry.job, "task": entry.task, "attempt": entry.attempt,
                               "why": move.failure.value if move.failure else "", "then": str(ended.status)})
        log.warning("revoked %s/%s attempt %s (%s): task now %s", entry.job, entry.task, entry.attempt,
                    move.failure, ended.status)
    elif move.act in (Act.FAIL, Act.LAPSE, Act.DROP):
        report.stale += 1


def speculate(clients: Clients, row: JobRow, due: list[Deadline], report: SweepReport) -> None:
    """Ask for backups of the attempts of the job (its ``row``) that fell due for one."""
    report.backups += speculation.consider(clients, _writer, row, due)
