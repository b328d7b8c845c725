"""Speculation: a backup copy of a slow attempt at a job's tail, the first to commit winning.

At the end of a job most slots are idle while its last tasks run; a straggler there holds
the job up for its whole kill threshold, where a copy of it on an idle slot costs nothing
(MapReduce's backup tasks; LATE). So a running attempt carries, in its entry of the
monitor's deadline index, the time from which a backup would help: past a high quantile
of its history (``policy.speculate_after``). The entry falls due then, and the monitor,
which finds it in its one key-range query, asks for a backup if the job has reached its
tail (every tile task released, none QUEUED) and the job's backups stay within
``speculate_share`` of its tasks.

A backup never writes the task row. It holds the same fence as the attempt it copies,
the row's ETag since the claim: whichever of the two commits first moves the row on,
and the other finds the fence gone, discards its outputs (each attempt writes under its
own prefix, so nothing is overwritten) and is killed by its lease. A backup's failure
drops the backup only; the task stays with its attempt. While a backup runs, the monitor
leaves the attempt it copies alone (it would requeue the task and throw both away); once
the backup has ended or lapsed it revokes as before. A backup has its own attempt row
(``names.attempt_key(..., backup=True)``: REQUESTED, then RUNNING, then how it ended) and
deadline entry, written together, so the monitor always finds a backup that stopped
heartbeating and gives it up. A backup nobody takes within a lease is asked for again (its
message may be lost); one that is no longer wanted when its message arrives ends NOT_RUN.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode

from pipeline.failures import FailureClass, error_code
from pipeline.lifecycle import attempts, claims, dispatch, rollups, transitions
from pipeline.lifecycle.attempts import AttemptRow, Deadline
from pipeline.lifecycle.jobs import JobRow
from pipeline.lifecycle.status import TaskStatus
from pipeline.lifecycle.tasks import TaskRef, TerminalCounter, get_task, if_match, is_conflict, now
from pipeline.redact import redact
from pipeline.storage import names
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)
REQUESTED = "REQUESTED"  # a backup's outcome until a worker takes it
NOT_RUN = "NOT_RUN"  # a backup nobody ran: its attempt ended first, or only that attempt's worker took it


class NotHere(Exception):
    """The attempt a backup would copy runs on the worker that received the backup."""


def consider(clients: Clients, counter: TerminalCounter, job: JobRow, due: list[Deadline]) -> int:
    """The monitor's step for the running attempts of ``job`` whose entries fell due only
    for a backup (``due``): at the job's tail, ask for a backup of each, the longest past
    its time first, while the job's backups stay within its share. Returns how many it
    asked for."""
    share = clients.settings.speculate_share
    if not due or share <= 0 or not job.all_released:
        return 0
    rollup = rollups.read(clients.tasks, job.parts, tiles=False)
    if rollup.counts.get(TaskStatus.QUEUED.value, 0):
        return 0  # the job's own tasks wait for slots: none is idle
    allowed = max(1, int(share * job.total)) - rollup.backups
    asked = 0
    for entry in sorted(due, key=lambda e: e.speculate_at or now()):
        if asked < allowed:
            asked += _ask(clients, counter, entry)
        else:
            _ask_again(clients, entry)
    return asked


def _ask(clients: Clients, counter: TerminalCounter, entry: Deadline) -> int:
    """Ask for a backup of ``entry``'s attempt, if it still runs and has none: its attempt
    row (REQUESTED) created with the monitor's rollup moved, then its message sent. A
    message lost leaves the backup REQUESTED and the attempt as it was: nothing waits on
    a backup."""
    try:
        row = get_task(clients.tasks, entry.part, entry.task)
    except ResourceNotFoundError:
        return 0
    if row.status is not TaskStatus.RUNNING or row.attempt != entry.attempt or row.worker != entry.worker:
        return 0
    asked = AttemptRow(part=entry.part, key=names.attempt_key(entry.task, entry.attempt, True), task=entry.task,
                       attempt=entry.attempt, backup=True, stage=row.stage, outcome=REQUESTED)
    try:
        counter.write(clients.tasks, entry.part, [("create", asked.to_entity(), {})], rollups.Moves().backed_up())
    except TableTransactionError as exc:
        if exc.status_code == 409 or error_code(exc) == "EntityAlreadyExists":
            _ask_again(clients, entry)
            return 0  # asked for already
        raise
    dispatch.send(clients, [(row.shard, TaskRef.of(entry.part, entry.task, entry.attempt, backup=True))])
    log.info("backup of %s/%s attempt %s asked for", entry.job, entry.task, entry.attempt)
    return 1


def _ask_again(clients: Clients, entry: Deadline) -> None:
    """If a backup of ``entry``'s attempt was asked for and is still not taken a lease
    later, its message may be lost (the ask's answer was, and its message never sent): send
    it again, its row written (fenced) so that the next look waits another lease. A second
    message is harmless: the backup's claim is fenced on its row, and one worker takes it."""
    try:
        _resend_if_untaken(clients, entry)
    except Exception as exc:  # the next pass looks again; the asks of this one stand
        log.warning("backup of %s/%s attempt %s not looked at again: %s", entry.job, entry.task, entry.attempt,
                    redact(str(exc)))


def _resend_if_untaken(clients: Clients, entry: Deadline) -> None:
    """``_ask_again``'s look and resend; a storage error is the caller's."""
    key = names.attempt_key(entry.task, entry.attempt, True)
    try:
        found = clients.tasks.get_entity(entry.part, key, select=["Outcome", "Timestamp"])
        written = found.metadata.get("timestamp")
        if found.get("Outcome") != REQUESTED or written is None or now() - written < timedelta(
                seconds=clients.settings.lease_seconds):
            return
        row = get_task(clients.tasks, entry.part, entry.task)
        wanted = row.status is TaskStatus.RUNNING and row.attempt == entry.attempt and row.worker == entry.worker
        fields = {"outcome": REQUESTED} if wanted else {"outcome": NOT_RUN, "ended_at": now()}
        clients.tasks.update_entity(attempts.attempt_row(entry.part, entry.task, entry.attempt, True, **fields),
                                    mode=UpdateMode.MERGE, **if_match(str(found.metadata["etag"])))
    except (ResourceModifiedError, ResourceNotFoundError):
        return  # taken meanwhile, or its job deleted
    if not wanted:
        return
    dispatch.send(clients, [(row.shard, TaskRef.of(entry.part, entry.task, entry.attempt, backup=True))])
    log.info("backup of %s/%s attempt %s asked for again", entry.job, entry.task, entry.attempt)


def _not_run(clients: Clients, asked: AttemptRow) -> None:
    """Record that the backup ``asked`` for (its row read REQUESTED) will not run."""
    try:
        clients.tasks.update_entity(asked.stored_changes(outcome=NOT_RUN, ended_at=now()),
                                    mode=UpdateMode.MERGE, **if_match(asked.etag))
    except (ResourceModifiedError, ResourceNotFoundError):
        pass  # taken or ended meanwhile


def claim_backup(clients: Clients, ref: TaskRef, worker: str,
                 kill_time: Callable[[TaskRef, str, dict[str, str], int], datetime],
                 last_pass: bool = False) -> claims.Claim | None:
    """Take the backup ``ref`` names, if its attempt still runs and nobody took it: its
    attempt row moves REQUESTED → RUNNING (fenced on its ETag) with its deadline entry, in
    one transaction; the task row is not written, and its ETag is the fence the backup
    shares with the attempt it copies. None if the backup is no longer wanted (its row then
    says NOT_RUN, as it does when ``last_pass`` brings it to the attempt's own worker once
    more); NotHere if that attempt runs on ``worker``."""
    try:
        row = get_task(clients.tasks, ref.partition, ref.task)
        key = names.attempt_key(ref.task, ref.attempt, True)
        asked = AttemptRow.from_entity(clients.tasks.get_entity(ref.partition, key))
    except ResourceNotFoundError:
        return None
    if asked.outcome != REQUESTED:
        return None  # taken already, or ended
    wanted = row.status is TaskStatus.RUNNING and row.attempt == ref.attempt
    if wanted and row.worker == worker and not last_pass:
        raise NotHere(f"{ref.job}/{ref.task} attempt {ref.attempt} runs here")
    if not wanted or row.worker == worker:
        _not_run(clients, asked)
        return None
    params = row.parameters()
    kill_at = kill_time(ref, row.stage, params, row.timeouts)
    started = now()
    index, write = attempts.index_op(clients, ref.partition, ref.task, ref.attempt, kill_at, worker, started,
                                     backup=True)
    taken = attempts.attempt_row(ref.partition, ref.task, ref.attempt, True, worker=worker, started_at=started,
                                 heartbeat=started, outcome=TaskStatus.RUNNING.value)
    try:
        clients.tasks.submit_transaction([("update", taken, {"mode": UpdateMode.MERGE, **if_match(asked.etag)}),
                                          write])
    except TableTransactionError as exc:
        if is_conflict(exc):
            return None  # another worker took it first
        raise
    return claims.Claim(ref, row.etag, row.stage, params, started, row.last_failure, worker, kill_at, index)


def _end(clients: Clients, part: str, task: str, attempt: int, index: str, etag: str = "",
         **fields: str | datetime) -> None:
    """End a backup: its attempt row's outcome (if its ETag is still ``etag``, when given)
    and the removal of its deadline entry, in one transaction (the row alone if the entry
    is gone already; the entry alone if the row has moved on: the backup committed or was
    discarded meanwhile, and its row says so)."""
    row = attempts.attempt_row(part, task, attempt, True, ended_at=now(), **fields)
    ended = ("update", row, {"mode": UpdateMode.MERGE, **if_match(etag)}) if etag else (
        "upsert", row, {"mode": UpdateMode.MERGE})
    try:
        clients.tasks.submit_transaction([ended, attempts.unindex_op(part, index)])
        return
    except TableTransactionError as exc:
        if is_conflict(exc):  # the row moved on: the entry alone
            attempts.unindex(clients, part, index)
            return
        if not attempts.is_missing(exc):
            raise
    try:  # the entry gone already: the row alone
        clients.tasks.submit_transaction([ended])
    except TableTransactionError as exc:
        if not is_conflict(exc):
            raise


def abandon(clients: Clients, held: claims.Claim, failure: FailureClass, error: str) -> None:
    """A backup failed: record it and drop it. The task stays with the attempt it copied,
    which a failure of the backup (a crash of the machine it ran on, say) says nothing of."""
    _end(clients, held.ref.partition, held.ref.task, held.ref.attempt, held.index, outcome=TaskStatus.FAILED.value,
         failure_class=failure.value, error=redact(error)[: transitions.ERROR_CHARS])


def give_way(clients: Clients, held: claims.Claim, failure: FailureClass, error: str) -> bool:
    """A worker found slow gives up an attempt whose backup runs elsewhere: the attempt's
    row records it, and the task row and the attempt's deadline entry stay as they are, so
    the backup keeps its fence. The entry lapses with the heartbeat, and the monitor leaves
    the task to the backup while it runs, and revokes it as before once it has ended
    without committing. False (nothing done) if the attempt has no running backup."""
    part, task, attempt = held.ref.partition, held.ref.task, held.ref.attempt
    if held.ref.backup or not attempts.is_running(clients, part, task, attempt, backup=True):
        return False
    attempts.record(clients, part, task, attempt, ended_at=now(), outcome=TaskStatus.FAILED.value,
                    failure_class=failure.value, error=redact(error)[: transitions.ERROR_CHARS])
    return True


def lapse(clients: Clients, entry: Deadline, why: FailureClass, etag: str) -> None:
    """The monitor's move for a backup past its kill time or heartbeat, whose row it read
    RUNNING (``etag``): give it up (its worker, if alive, finds it no longer running and
    kills it). The attempt it copies is revoked by the rules as if it had had no backup."""
    _end(clients, entry.part, entry.task, entry.attempt, entry.key, etag, outcome=TaskStatus.TIMED_OUT.value,
         failure_class=why.value, revoked_by="monitor")
    log.warning("backup of %s/%s attempt %s given up: %s", entry.job, entry.task, entry.attempt, why.value)
