"""The monitor: revoke attempts that run past their kill threshold or stop heartbeating,
and requeue their tasks, within the retry budget (the thresholds and budgets are
``pipeline.lifecycle.policy``'s, which the worker reads too).

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

from azure.core.exceptions import ResourceNotFoundError

from pipeline.failures import FailureClass
from pipeline.lifecycle import attempts, jobs, policy, progress, speculation, transitions
from pipeline.lifecycle.attempts import Deadline
from pipeline.lifecycle.jobs import JobRow
from pipeline.lifecycle.status import TaskStatus
from pipeline.lifecycle.tasks import TaskRef, TerminalCounter, get_task, now
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)
_counter = TerminalCounter(f"monitor-{uuid.uuid4().hex[:12]}")


@dataclass
class SweepReport:
    revoked: list[dict[str, Any]] = field(default_factory=list)
    stale: int = 0
    backups: int = 0  # backups asked for


def revoke_overdue(clients: Clients, row: JobRow, report: SweepReport) -> list[Deadline]:
    """Revoke every attempt of the job (its ``row``) whose deadline has passed (one
    key-range query per partition) and give up the backups among them. Returns the entries
    of the running attempts that fell due only for a backup (``speculation.consider``
    decides)."""
    at = now()
    due: list[Deadline] = []
    for entry in attempts.overdue(clients, row.parts, at):
        if at < entry.kill_at and at < entry.heartbeat_until:
            due.append(entry)  # due only for a backup
            continue
        why = FailureClass.EXECUTION_TIMEOUT if at >= entry.kill_at else FailureClass.HEARTBEAT_LOST
        if entry.backup:
            etag = attempts.running_etag(clients, entry.part, entry.task, entry.attempt, backup=True)
            if etag is not None:
                speculation.lapse(clients, entry, why, etag)
            else:
                attempts.unindex(clients, entry.part, entry.key)
            report.stale += 1
            continue
        if _backup_runs(clients, entry):
            continue  # the first of the two to commit ends the task
        gave_way = clients.settings.speculate_share > 0 and attempts.gave_way(clients, entry.part, entry.task,
                                                                              entry.attempt)
        if gave_way:
            why = FailureClass.WORKER_SLOW  # its backup ended without committing: not the task's time
        _revoke(clients, entry, why, report, gave_way)
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
            if entry.backup or _backup_runs(clients, entry):
                continue
            _revoke(clients, entry, FailureClass.WORKER_SLOW, report)


def _backup_runs(clients: Clients, entry: Deadline) -> bool:
    """Whether a backup of the attempt whose deadline ``entry`` this is runs (with
    speculation on): the first of the two to commit ends the task."""
    return clients.settings.speculate_share > 0 and attempts.is_running(clients, entry.part, entry.task, entry.attempt,
                                                                        backup=True)


def _revoke(clients: Clients, entry: Deadline, why: FailureClass, report: SweepReport, gave_way: bool = False) -> None:
    """Take the task from the attempt whose deadline ``entry`` the monitor read (the move is
    ``transitions.revoke``'s, fenced on the task row read here)."""
    ref = TaskRef.of(entry.part, entry.task, entry.attempt)
    try:
        task = get_task(clients.tasks, entry.part, ref.task)
    except ResourceNotFoundError:  # its job was deleted
        attempts.unindex(clients, entry.part, entry.key)
        report.stale += 1
        return
    budget = policy.limits_for(clients.settings, task.stage).budget(why)
    outcome = transitions.revoke(clients, _counter, task, ref, entry.key, why, budget, entry.worker,
                                 gave_way=gave_way)
    if outcome is None:
        report.stale += 1
        return
    report.revoked.append({"job": ref.job, "task": ref.task, "attempt": ref.attempt,
                           "why": why.value, "then": outcome.value})
    log.warning("revoked %s (%s): task now %s", ref, why.value, outcome.value)
    if outcome is TaskStatus.DEAD:
        progress.task_ended(clients, ref.job)


def speculate(clients: Clients, row: JobRow, due: list[Deadline], report: SweepReport) -> None:
    """Ask for backups of the attempts of the job (its ``row``) that fell due for one."""
    report.backups += speculation.consider(clients, _counter, row, due)
