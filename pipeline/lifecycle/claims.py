"""The claim: a task's move from QUEUED to RUNNING for one attempt, alone or with others of
its partition in one transaction, and what a held attempt does until it ends — its
heartbeat, the look whether it is still held, its discard once revoked. Part of the task's
transitions (``pipeline.lifecycle.transitions`` holds the others): each is one
entity-group transaction in the task's partition, fenced on the row's ETag, and a write
whose answer was lost is settled by reading the row back.
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableTransactionError

from pipeline.lifecycle import attempts, dispatch, tasks
from pipeline.lifecycle.attempts import Op
from pipeline.lifecycle.rollups import Moves
from pipeline.lifecycle.status import TaskStatus, transition
from pipeline.lifecycle.tasks import TaskRef, TaskRow, TerminalCounter, is_conflict, now, update_op
from pipeline.storage.clients import Clients


@dataclass
class Claim:
    """A worker's hold on one attempt of a task."""

    ref: TaskRef
    etag: str  # the task row's ETag right after the claim: the commit's fence
    stage: str
    params: dict[str, str]
    started: datetime
    last_failure: str  # the failure class of the previous attempt, "" if none
    worker: str  # who holds it
    kill_at: datetime  # when the monitor revokes it
    index: str  # the row key of its entry in the monitor's deadline index (moved by heartbeats)
    speculate_at: datetime | None = None  # from when a backup copy would help (``pipeline.lifecycle.speculation``)


def claim(clients: Clients, ref: TaskRef, worker: str,
          kill_time: Callable[[TaskRef, str, dict[str, str], int], datetime],
          counter: TerminalCounter | None = None,
          speculate_time: Callable[[str, dict[str, str], datetime], datetime | None] | None = None,
          hint: TaskRow | None = None) -> Claim | None:
    """Move the task to RUNNING for the attempt its row names, if the message may still run
    it: the row is QUEUED and the message is not from a later attempt. None otherwise (the
    message is stale or a duplicate, and is deleted). ``kill_time`` says when the monitor is
    to revoke the attempt, from its stage, parameters and how many earlier attempts were
    revoked for time; ``speculate_time`` from when a backup copy of it would help (its
    start given). One transaction (:func:`_claim_ops`) makes the move, and moves the rollup of ``counter``
    (the claiming slot's; this process's own if None). ``hint``: the row read a moment ago
    (``worker.readahead``), tried in place of a read while it is claimable; should its ETag
    be stale, the row is read and the claim made again. A claim refused because its own
    first try had applied (the storage client retried it after losing the answer) is
    recognised on the row read back, and holds."""
    part = ref.partition
    row = hint if hint is not None and hint.status is TaskStatus.QUEUED and ref.attempt <= hint.attempt else None
    if row is None:
        try:
            row = tasks.get_task(clients.tasks, part, ref.task)
        except ResourceNotFoundError:
            return None
        if row.status is not TaskStatus.QUEUED or ref.attempt > row.attempt:
            return None
    moves = Moves()
    ops, held, mark = _claim_ops(clients, ref, row, worker, kill_time, speculate_time, moves)
    counter = counter or tasks.MOVER
    try:
        etag = counter.write(clients.tasks, part, ops, moves)[0]["etag"]
    except TableTransactionError as exc:
        if is_conflict(exc):
            now_row = tasks.read_back(clients.tasks, part, ref.task)
            if now_row.last_write != mark and row is hint:  # changed since it was read ahead: read it now
                return claim(clients, ref, worker, kill_time, counter, speculate_time)
            if now_row.last_write != mark:
                return None  # another worker claimed it first
            etag = now_row.etag  # applied, its answer lost: the client's retry of it was refused
        elif attempts.is_missing(exc) and len(ops) == 4:  # an entry older than the rules: claim without it
            etag = counter.write(clients.tasks, part, ops[:3], moves)[0]["etag"]
        else:
            raise
    return dataclasses.replace(held, etag=etag)


def claim_many(clients: Clients, wanted: list[tuple[TaskRef, TaskRow]], worker: str,
               kill_time: Callable[[TaskRef, str, dict[str, str], int], datetime], counter: TerminalCounter,
               speculate_time: Callable[[str, dict[str, str], datetime], datetime | None] | None = None,
               ) -> list[Claim | None] | None:
    """:func:`claim` of several attempts of one partition at once, each ``ref`` with its row
    read a moment ago (``worker.readahead``) and QUEUED for it (``tasks.MESSAGE_TASKS`` at
    most): one transaction moves them all, with ``counter``'s rollup. Returns their claims,
    in order; None if the transaction did not apply — a row moved since it was read, or an
    entry older than the rules — so that nothing was claimed and each is claimed on its own.
    A transaction refused or unanswered is settled on the first row read back: all of it
    applied, or none. Applied with its answer lost, each row is read back, and a claim holds
    only on a row still RUNNING under its own mark (None for one cancelled meanwhile)."""
    part, moves = wanted[0][0].partition, Moves()
    built = [_claim_ops(clients, ref, row, worker, kill_time, speculate_time, moves) for ref, row in wanted]
    ops = [op for each in built for op in each[0]]
    try:
        answers = counter.write(clients.tasks, part, ops, moves)
    except Exception:
        first = tasks.read_back(clients.tasks, part, wanted[0][0].task)
        if first.last_write != built[0][2]:
            return None
        back = [first, *(tasks.read_back(clients.tasks, part, held.ref.task) for _, held, _ in built[1:])]
        return [dataclasses.replace(held, etag=row.etag)
                if row.last_write == mark and row.status is TaskStatus.RUNNING else None
                for row, (_, held, mark) in zip(back, built, strict=True)]
    firsts = itertools.accumulate((len(each[0]) for each in built[:-1]), initial=0)  # each claim's task row write
    return [dataclasses.replace(held, etag=answers[at]["etag"]) for at, (_, held, _) in zip(firsts, built, strict=True)]


def _claim_ops(clients: Clients, ref: TaskRef, row: TaskRow, worker: str,
               kill_time: Callable[[TaskRef, str, dict[str, str], int], datetime],
               speculate_time: Callable[[str, dict[str, str], datetime], datetime | None] | None,
               moves: Moves) -> tuple[list[Op], Claim, str]:
    """What a claim of ``ref`` on its QUEUED ``row`` writes (its moves added to ``moves``), the
    claim it makes (its ETag still to come) and the mark that recognises it read back. One
    transaction writes the task row, the attempt's row and its deadline entry, and removes
    its dispatch entry: no attempt is ever RUNNING without a deadline, none QUEUED without
    a dispatch entry."""
    part = ref.partition
    # An older message may stand in for the current attempt: the row is the truth.
    current = dataclasses.replace(ref, attempt=row.attempt)
    params = row.parameters()
    kill_at = kill_time(current, row.stage, params, row.timeouts)
    started = now()
    speculate_at = speculate_time(row.stage, params, started) if speculate_time else None
    index, index_write = attempts.index_op(clients, part, ref.task, current.attempt, kill_at, worker, started,
                                           speculate_at)
    mark = uuid.uuid4().hex  # to recognise this claim when read back
    ops = [update_op(part, ref.task, row.etag, worker=worker, started_at=started, dispatch="", last_write=mark,
                     status=transition(row.status, TaskStatus.RUNNING)),
           attempts.attempt_op(part, ref.task, current.attempt, worker=worker, started_at=started,
                               heartbeat=started, outcome=TaskStatus.RUNNING.value),
           index_write]
    if row.dispatch:
        ops.append(dispatch.remove_op(part, row.dispatch))
    moves.move(row.stage, params.get("tile", ""), TaskStatus.QUEUED, TaskStatus.RUNNING)
    held = Claim(current, "", row.stage, params, started, row.last_failure, worker, kill_at, index, speculate_at)
    return ops, held, mark


def still_held(clients: Clients, held: Claim) -> bool:
    """True while the task row still names this attempt as running (nobody revoked or
    cancelled it, nor did its backup or the attempt it backs up commit) and, for a backup,
    while the monitor has not given it up."""
    part, task = held.ref.partition, held.ref.task
    return tasks.get_task(clients.tasks, part, task).etag == held.etag and (
        not held.ref.backup or attempts.is_running(clients, part, task, held.ref.attempt, backup=True))


def heartbeat(clients: Clients, held: Claim) -> None:
    """Move the attempt's deadline entry on (its heartbeat is now)."""
    held.index = attempts.move(clients, held.ref.partition, held.ref.task, held.ref.attempt, held.kill_at, held.worker,
                               previous=held.index, speculate_at=held.speculate_at, backup=held.ref.backup)


def discard(clients: Clients, held: Claim) -> None:
    """Record that a revoked attempt's work was thrown away; it leaves the deadline index.
    (A backup's row says so in its outcome too: nobody else ends it.)"""
    attempts.record(clients, held.ref.partition, held.ref.task, held.ref.attempt, held.ref.backup, discarded=True,
                    discarded_at=now(), **({"outcome": "DISCARDED"} if held.ref.backup else {}))
    attempts.unindex(clients, held.ref.partition, held.index)
