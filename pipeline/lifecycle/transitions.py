"""Every change of a task's state, each a named operation and a conditional write.

Whoever moves a task — the planner queueing or settling it, a worker claiming it, the end of
an attempt (``pipeline.lifecycle.ends``, for its worker, the monitor and backups alike), a
canceller — calls one of these; no other module writes a task row's state. Each is one
entity-group transaction in the task's partition (``pipeline.lifecycle.partitions``),
fenced on the row's ETag, holding everything that must change with it: the attempt's row,
its entry in the monitor's deadline index (``pipeline.lifecycle.attempts``), its entry in
the dispatch index while it is QUEUED (``pipeline.lifecycle.dispatch``), a failed attempt's
entry in the failure index, the writer's rollup row (``pipeline.lifecycle.rollups``: what
the move changes in the job's counts per state, tile and stage, its runtimes and
failures), and, for a task ending, the count of each task waiting on it (a reduction): its
dependencies are a counter on its row, taken down in that very transaction and, at zero,
the waiting task QUEUED with its dispatch entry (nothing lists the tasks it waits for). The
state machine (``pipeline.lifecycle.status``) checks each move.

A backup copy of a running attempt (``pipeline.lifecycle.speculation`` says when one is
asked for) never writes the task row: it holds the same fence as the attempt it copies —
the row's ETag since the claim — so the first of the two to commit moves the row on. Its
own attempt row (REQUESTED, RUNNING, then how it ended) and deadline entry are written
together.

A write whose answer was lost, or which was refused, is settled by reading the row back
(``pipeline.lifecycle.fenced``): never by guessing, and never by retrying blindly.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode

from pipeline import planning
from pipeline.failures import error_code
from pipeline.lifecycle import attempts, dispatch, fenced, partitions, rollups, tasks
from pipeline.lifecycle.attempts import AttemptRow, Deadline, Op
from pipeline.lifecycle.policy import Act, Move
from pipeline.lifecycle.rollups import Moves, RollupWriter
from pipeline.lifecycle.status import TaskStatus, transition
from pipeline.lifecycle.tasks import TaskRef, TaskRow, if_match, is_conflict, now, tile_of, update_op
from pipeline.redact import redact
from pipeline.storage import names
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)
ERROR_CHARS = 2000  # an error message kept on a row is cut to this
GROUP_COMMITS = (tasks.BATCH - 1) // 3  # commits one transaction holds: a task row, its attempt, its entry
CONFLICTS = 50  # writes retried because another task a waiting one waits for ended at once
REQUESTED = "REQUESTED"  # a backup's outcome until a worker takes it
NOT_RUN = "NOT_RUN"  # a backup nobody ran: its attempt ended first, or only that attempt's worker took it
LOST_TO_BACKUP = "LOST_TO_BACKUP"  # an attempt whose backup committed first
CANCEL_TRIES = 5  # passes a cancel makes over a job's unfinished tasks before it leaves the rest to the sweep
KillTime = Callable[[TaskRef, str, dict[str, str], int], datetime]
SpeculateTime = Callable[[str, dict[str, str], datetime], datetime | None]


@dataclass
class Claim:
    """A hold on one attempt of a task: a worker's, or (``held_at``) the one the monitor
    finds behind a deadline entry."""

    ref: TaskRef
    etag: str  # the task row's ETag right after the claim: the fence of the attempt's end
    stage: str
    params: dict[str, str]
    started: datetime
    last_failure: str  # the failure class of the previous attempt, "" if none
    worker: str  # who holds it
    kill_at: datetime  # when the monitor revokes it
    index: str  # the row key of its entry in the monitor's deadline index (moved by heartbeats)
    speculate_at: datetime | None = None  # from when a backup copy would help (``pipeline.lifecycle.speculation``)
    timeouts: int = 0  # its task's earlier attempts revoked for time
    shard: int = 0  # the queue its task's messages go to


def _read_again(clients: Clients, part: str, rows: list[TaskRow]) -> list[TaskRow]:
    """The task ``rows`` of partition ``part`` (in sequence order) as they are now."""
    keys, first = {r.task for r in rows}, rows[0].seq
    return [r for r in tasks.list_tasks(clients.tasks, [part], first, rows[-1].seq - first + 1) if r.task in keys]


def _chunks(rows: list[TaskRow], size: int) -> Iterator[tuple[str, list[TaskRow]]]:
    """``rows`` by partition (in sequence order within each), ``size`` at most at a time."""
    return partitions.chunks(rows, lambda row: row.part, size)


# --- PENDING -> QUEUED -------------------------------------------------------------------
def queue(clients: Clients, rows: list[TaskRow]) -> list[TaskRow]:
    """Move the PENDING ``rows`` (read just before) of one job to QUEUED, with their
    dispatch entries, 49 to a transaction in each partition (with the releaser's rollup); a
    row that moved meanwhile is read again. Returns every row of ``rows`` that is QUEUED
    now: the ones whose messages to send."""
    found: list[TaskRow] = []
    for part, chunk in _chunks(rows, tasks.BATCH // 2 - 1):
        while True:
            ops: list[Op] = []
            moves = Moves()
            for row in chunk:
                if row.status is TaskStatus.PENDING:
                    fields, write = dispatch.queued(clients, part, row.task)
                    transition(row.status, TaskStatus.QUEUED)
                    ops += [update_op(part, row.task, row.etag, **fields), write]
                    moves.move(row.stage, tile_of(row.params), TaskStatus.PENDING, TaskStatus.QUEUED)
            try:
                if ops:
                    rollups.MOVER.write(clients.tasks, part, ops, moves)
            except TableTransactionError:  # a row moved meanwhile (cancelled, another releaser)
                chunk = _read_again(clients, part, chunk)
                continue
            found += [dataclasses.replace(r, status=TaskStatus.QUEUED) if r.status is TaskStatus.PENDING else r
                      for r in chunk if r.status in (TaskStatus.PENDING, TaskStatus.QUEUED)]
            break
    return found


# --- PENDING -> CACHED: made already, settled at planning --------------------------------
def settle(clients: Clients, rows: list[TaskRow], outputs: dict[str, list[str]], tries: int = 5) -> int:
    """Move the PENDING tile tasks among ``rows`` (read just before) whose every output the
    cache holds already (``outputs``, by row key: named as the stage names them) straight to
    CACHED, as a worker's commit of a CACHED task would leave them but with no message, no
    claim and no attempt: their outputs on the row, the releaser's rollup moved (counts per
    state, tile and stage; no runtime, nothing ran), and each waiting reduction's count
    taken down by as many — released at zero. One transaction per chunk of a partition,
    fenced on every row it writes; a chunk whose rows moved meanwhile is read again, and
    after ``tries`` left to the ordinary way. Returns how many it settled."""
    todo = [r for r in rows if r.task in outputs and r.status is TaskStatus.PENDING]
    settled = 0
    for part, chunk in _chunks(todo, (tasks.BATCH - 1) // 3):  # a write each, two for each reduction counted off
        for _ in range(tries):
            live = [r for r in chunk if r.status is TaskStatus.PENDING]
            ended, moves, ops = now(), Moves(), list[Op]()
            waiting: dict[str, int] = {}
            for row in live:
                ops.append(update_op(part, row.task, row.etag, ended_at=ended, settled_at=ended,
                                     status=transition(row.status, TaskStatus.CACHED),
                                     outputs=json.dumps(outputs[row.task])))
                moves.move(row.stage, tile_of(row.params), TaskStatus.PENDING, TaskStatus.CACHED)
                for key in _waiting(row.parameters(), TaskStatus.CACHED):
                    waiting[key] = waiting.get(key, 0) + 1
            messages: list[tuple[int, TaskRef]] = []
            for key, count in waiting.items():
                counted, more, sent, _ = _counted_off(clients, part, [key], count)
                ops, moves, messages = ops + counted, moves.merged(more), messages + sent
            try:
                if ops:
                    rollups.MOVER.write(clients.tasks, part, ops, moves)
            except TableTransactionError:  # a row moved meanwhile (queued, cancelled, another planner)
                chunk = _read_again(clients, part, chunk)
                continue
            dispatch.send(clients, messages)  # a message lost: the reconciler resends (its dispatch entry)
            settled += len(live)
            break
    return settled


# --- QUEUED -> RUNNING: the claim ----------------------------------------------------------
def claim(clients: Clients, ref: TaskRef, worker: str, kill_time: KillTime, writer: RollupWriter | None = None,
          speculate_time: SpeculateTime | None = None, hint: TaskRow | None = None) -> Claim | None:
    """Move the task to RUNNING for the attempt its row names, if the message may still run
    it: the row is QUEUED and the message is not from a later attempt. None otherwise (the
    message is stale or a duplicate, and is deleted). ``kill_time`` says when the monitor is
    to revoke the attempt, from its stage, parameters and how many earlier attempts were
    revoked for time; ``speculate_time`` from when a backup copy of it would help (its
    start given). One transaction (:func:`_claim_ops`) makes the move, and moves the rollup
    of ``writer`` (the claiming slot's; this process's own if None). ``hint``: the row read
    a moment ago (``worker.readahead``), tried in place of a read while it is claimable;
    should its ETag be stale, the row is read and the claim made again. A claim refused
    because its own first try had applied (the storage client retried it after losing the
    answer) is recognised on the row read back by its mark, and holds."""
    part = ref.partition
    row = hint if hint is not None and hint.status is TaskStatus.QUEUED and ref.attempt <= hint.attempt else None
    if row is None:
        try:
            row = tasks.get_task(clients.tasks, part, ref.task)
        except ResourceNotFoundError:
            return None
        if row.status is not TaskStatus.QUEUED or ref.attempt > row.attempt:
            return None
    mark, moves, writer = fenced.mark(), Moves(), writer or rollups.MOVER
    ops, held = _claim_ops(clients, ref, row, worker, kill_time, speculate_time, moves, mark)
    while True:
        written = fenced.write(functools.partial(writer.write, clients.tasks, part, ops, moves),
                               functools.partial(tasks.get_task, clients.tasks, part, ref.task), mark)
        if written.applied:
            answer = written.answer
            return dataclasses.replace(held, etag=answer[0]["etag"] if answer is not None else written.row.etag)
        if written.row.etag != row.etag:  # the row moved since it was read
            return claim(clients, ref, worker, kill_time, writer, speculate_time) if row is hint else None
        if len(ops) == 4 and isinstance(written.error, TableTransactionError) and attempts.is_missing(written.error):
            ops = ops[:3]  # its dispatch entry older than the rules: claim without it
            continue
        raise written.error or RuntimeError(f"claim of {ref} neither applied nor refused")


def claim_many(clients: Clients, wanted: list[tuple[TaskRef, TaskRow]], worker: str, kill_time: KillTime,
               writer: RollupWriter, speculate_time: SpeculateTime | None = None) -> list[Claim | None] | None:
    """:func:`claim` of several attempts of one partition at once, each ``ref`` with its row
    read a moment ago (``worker.readahead``) and QUEUED for it (``tasks.MESSAGE_TASKS`` at
    most): one transaction moves them all, with ``writer``'s rollup. Returns their claims,
    in order; None if the transaction did not apply — a row moved since it was read, or an
    entry older than the rules — so that nothing was claimed and each is claimed on its own.
    A transaction refused or unanswered is settled on its first row read back: all of it
    applied, or none. Applied with its answer lost, each row is read back, and a claim holds
    only on a row still RUNNING under the group's mark (None for one cancelled meanwhile)."""
    part, moves, mark = wanted[0][0].partition, Moves(), fenced.mark()
    built = [_claim_ops(clients, ref, row, worker, kill_time, speculate_time, moves, mark) for ref, row in wanted]
    ops = [op for each in built for op in each[0]]
    written = fenced.write(lambda: writer.write(clients.tasks, part, ops, moves),
                           lambda: tasks.get_task(clients.tasks, part, wanted[0][0].task), mark)
    if not written.applied:
        return None
    if written.answer is None:
        back = [written.row, *(tasks.get_task(clients.tasks, part, held.ref.task) for _, held in built[1:])]
        return [dataclasses.replace(held, etag=row.etag)
                if row.last_write == mark and row.status is TaskStatus.RUNNING else None
                for row, (_, held) in zip(back, built, strict=True)]
    claimed: list[Claim | None] = []
    at = 0
    for each_ops, held in built:  # each claim's first write is its task row's
        claimed.append(dataclasses.replace(held, etag=written.answer[at]["etag"]))
        at += len(each_ops)
    return claimed


def _claim_ops(clients: Clients, ref: TaskRef, row: TaskRow, worker: str, kill_time: KillTime,
               speculate_time: SpeculateTime | None, moves: Moves, mark: str) -> tuple[list[Op], Claim]:
    """What a claim of ``ref`` on its QUEUED ``row`` writes (its moves added to ``moves``,
    ``mark`` on the row) and the claim it makes (its ETag still to come). One transaction
    writes the task row, the attempt's row and its deadline entry, and removes its dispatch
    entry: no attempt is ever RUNNING without a deadline, none QUEUED without a dispatch
    entry."""
    part = ref.partition
    # An older message may stand in for the current attempt: the row is the truth.
    current = dataclasses.replace(ref, attempt=row.attempt)
    params = row.parameters()
    kill_at = kill_time(current, row.stage, params, row.timeouts)
    started = now()
    speculate_at = speculate_time(row.stage, params, started) if speculate_time else None
    index, index_write = attempts.index_op(clients, part, ref.task, current.attempt, kill_at, worker, started,
                                           speculate_at)
    ops = [update_op(part, ref.task, row.etag, worker=worker, started_at=started, dispatch="", last_write=mark,
                     status=transition(row.status, TaskStatus.RUNNING)),
           attempts.attempt_op(part, ref.task, current.attempt, worker=worker, started_at=started,
                               heartbeat=started, outcome=TaskStatus.RUNNING.value),
           index_write]
    if row.dispatch:
        ops.append(dispatch.remove_op(part, row.dispatch))
    moves.move(row.stage, params.get("tile", ""), TaskStatus.QUEUED, TaskStatus.RUNNING)
    held = Claim(current, "", row.stage, params, started, row.last_failure, worker, kill_at, index, speculate_at,
                 row.timeouts, row.shard)
    return ops, held


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


def held_at(clients: Clients, entry: Deadline) -> tuple[Claim, bool]:
    """The attempt whose deadline ``entry`` fell due, as its claim would say (from its task
    row, read now), and whether the row still names it running on the entry's worker (a
    row gone with its job names nothing)."""
    ref = TaskRef.of(entry.part, entry.task, entry.attempt, entry.backup)
    try:
        row = tasks.get_task(clients.tasks, entry.part, entry.task)
    except ResourceNotFoundError:
        return Claim(ref, "", "", {}, entry.kill_at, "", entry.worker, entry.kill_at, entry.key), False
    held = Claim(ref, row.etag, row.stage, row.parameters(), row.started_at or entry.kill_at, row.last_failure,
                 entry.worker, entry.kill_at, entry.key, entry.speculate_at, row.timeouts, row.shard)
    running = row.status is TaskStatus.RUNNING and row.attempt == entry.attempt and (
        entry.backup or row.worker == entry.worker)  # else another worker claimed it after the indexed one died
    return held, running


# --- backups: asked for, claimed ---------------------------------------------------------
class NotHere(Exception):
    """The attempt a backup would copy runs on the worker that received the backup."""


def ask_backup(clients: Clients, writer: RollupWriter, entry: Deadline) -> bool:
    """Ask for a backup of ``entry``'s attempt, if it still runs and has none: its attempt
    row (REQUESTED) created with ``writer``'s rollup moved, then its message sent. A message
    lost leaves the backup REQUESTED and the attempt as it was: nothing waits on a backup,
    and one not taken within a lease is asked for again (:func:`ask_backup_again`). True
    if it asked."""
    try:
        row = tasks.get_task(clients.tasks, entry.part, entry.task)
    except ResourceNotFoundError:
        return False
    if row.status is not TaskStatus.RUNNING or row.attempt != entry.attempt or row.worker != entry.worker:
        return False
    asked = AttemptRow(part=entry.part, key=names.attempt_key(entry.task, entry.attempt, True), task=entry.task,
                       attempt=entry.attempt, backup=True, stage=row.stage, outcome=REQUESTED)
    try:
        writer.write(clients.tasks, entry.part, [("create", asked.to_entity(), {})], Moves().backed_up())
    except TableTransactionError as exc:
        if exc.status_code == 409 or error_code(exc) == "EntityAlreadyExists":
            ask_backup_again(clients, entry)
            return False  # asked for already
        raise
    dispatch.send(clients, [(row.shard, TaskRef.of(entry.part, entry.task, entry.attempt, backup=True))])
    log.info("backup of %s/%s attempt %s asked for", entry.job, entry.task, entry.attempt)
    return True


def ask_backup_again(clients: Clients, entry: Deadline) -> None:
    """If a backup of ``entry``'s attempt was asked for and is still not taken a lease
    later, its message may be lost (the ask's answer was, and its message never sent): send
    it again, its row written (fenced) so that the next look waits another lease; one no
    longer wanted ends NOT_RUN. A second message is harmless: the backup's claim is fenced
    on its row, and one worker takes it."""
    try:
        _resend_if_untaken(clients, entry)
    except Exception as exc:  # the next pass looks again; the asks of this one stand
        log.warning("backup of %s/%s attempt %s not looked at again: %s", entry.job, entry.task, entry.attempt,
                    redact(str(exc)))


def _resend_if_untaken(clients: Clients, entry: Deadline) -> None:
    """``ask_backup_again``'s look and resend; a storage error is the caller's."""
    key = names.attempt_key(entry.task, entry.attempt, True)
    try:
        found = clients.tasks.get_entity(entry.part, key, select=["Outcome", "Timestamp"])
        written = found.metadata.get("timestamp")
        if found.get("Outcome") != REQUESTED or written is None or now() - written < timedelta(
                seconds=clients.settings.lease_seconds):
            return
        row = tasks.get_task(clients.tasks, entry.part, entry.task)
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


def claim_backup(clients: Clients, ref: TaskRef, worker: str, kill_time: KillTime,
                 last_pass: bool = False) -> Claim | None:
    """Take the backup ``ref`` names, if its attempt still runs and nobody took it: its
    attempt row moves REQUESTED → RUNNING (fenced on its ETag) with its deadline entry, in
    one transaction; the task row is not written, and its ETag is the fence the backup
    shares with the attempt it copies. None if the backup is no longer wanted (its row then
    says NOT_RUN, as it does when ``last_pass`` brings it to the attempt's own worker once
    more); NotHere if that attempt runs on ``worker``."""
    try:
        row = tasks.get_task(clients.tasks, ref.partition, ref.task)
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
    return Claim(ref, row.etag, row.stage, params, started, row.last_failure, worker, kill_at, index,
                 timeouts=row.timeouts, shard=row.shard)


def _not_run(clients: Clients, asked: AttemptRow) -> None:
    """Record that the backup ``asked`` for (its row read REQUESTED) will not run."""
    try:
        clients.tasks.update_entity(asked.stored_changes(outcome=NOT_RUN, ended_at=now()),
                                    mode=UpdateMode.MERGE, **if_match(asked.etag))
    except (ResourceModifiedError, ResourceNotFoundError):
        pass  # taken or ended meanwhile


# --- an attempt's end: the moves ``pipeline.lifecycle.ends`` decides ----------------------
def apply(clients: Clients, writer: RollupWriter, held: Claim, move: Move) -> bool:
    """Make ``move``, the end of the attempt ``held``, moving ``writer``'s rollup: a commit
    or a failure in one transaction fenced on the claim (refused when the attempt no longer
    holds the task: then recorded DISCARDED by its worker), or the one record a move without
    a task write needs. Returns whether it applied."""
    ref, act = held.ref, move.act
    part, task = ref.partition, ref.task
    if act is Act.COMMIT or act is Act.FAIL:
        return _ended(clients, writer, held, move)
    if act is Act.GIVE_WAY:  # the row and the deadline entry stay: the copy keeps the fence, the entry lapses
        attempts.record(clients, part, task, ref.attempt, ended_at=now(), outcome=move.ended_as,
                        failure_class=_failure(move), error=_error(move))
    elif act is Act.ABANDON:
        _end_backup(clients, part, task, ref.attempt, held.index, outcome=move.ended_as, failure_class=_failure(move),
                    error=_error(move))
    elif act is Act.LAPSE:
        etag = attempts.running_etag(clients, part, task, ref.attempt, backup=True)  # it may have committed since
        if etag is None:
            attempts.unindex(clients, part, held.index)
        else:
            _end_backup(clients, part, task, ref.attempt, held.index, etag, outcome=move.ended_as,
                        failure_class=_failure(move), revoked_by=move.revoked_by)
            log.warning("backup of %s given up: %s", ref, _failure(move))
    elif act is Act.DISCARD:
        attempts.record(clients, part, task, ref.attempt, ref.backup, discarded=True, discarded_at=now(),
                        **({"outcome": "DISCARDED"} if ref.backup else {}))
        attempts.unindex(clients, part, held.index)
    elif act is Act.DROP:
        attempts.unindex(clients, part, held.index)
    return True


def apply_together(clients: Clients, writer: RollupWriter, ended: list[tuple[Claim, Move]]) -> list[bool | Exception]:
    """:func:`apply` of several commits of one partition at once (none a backup's, none a
    task's counted off a waiting one; at most ``GROUP_COMMITS``): one transaction, each
    row fenced on its claim's ETag, with ``writer``'s rollup. A transaction refused (a row
    moved: revoked, cancelled) or unanswered is settled on its first row read back — all of
    it applied, or none — and if none, each is applied on its own, which tells which hold:
    each one's answer, or the error its own write raised."""
    part, mark, moves, ops = ended[0][0].ref.partition, fenced.mark(), Moves(), list[Op]()
    for held, move in ended:
        change, ended_as = _commit_ops(held, move, moves)
        ops += [update_op(part, held.ref.task, held.etag, **change, last_write=mark), ended_as,
                attempts.unindex_op(part, held.index)]
    written = fenced.write(lambda: writer.write(clients.tasks, part, ops, moves),
                           lambda: tasks.get_task(clients.tasks, part, ended[0][0].ref.task), mark)
    if written.applied:
        return [True] * len(ended)
    return [_alone(clients, writer, held, move) for held, move in ended]


def joins_others(held: Claim, move: Move) -> bool:
    """Whether an attempt's end may share a transaction with others (``apply_together``):
    a commit, not a backup's, not one that counts its task off a waiting reduction."""
    return move.act is Act.COMMIT and not held.ref.backup and not _waiting(held.params, move.status)


def _alone(clients: Clients, writer: RollupWriter, held: Claim, move: Move) -> bool | Exception:
    try:
        return apply(clients, writer, held, move)
    except Exception as exc:  # its own: the others of its group are settled all the same
        return exc


def _status(move: Move) -> TaskStatus:
    """Where a commit or a failure takes the task."""
    if move.status is None:
        raise ValueError(f"a {move.act.value} that names no status")
    return move.status


def _failure(move: Move) -> str:
    return move.failure.value if move.failure else ""


def _error(move: Move) -> str:
    return redact(move.error)[:ERROR_CHARS]


def _ended(clients: Clients, writer: RollupWriter, held: Claim, move: Move) -> bool:
    """A commit or a failure: the task row moved on, fenced on the claim, with the
    attempt's end, its deadline entry's removal, a failure's index entry, ``writer``'s
    rollup and the waiting reduction counted off, in one transaction; a requeue's next
    message sent when the move says so (the worker hands its own back otherwise). Refused,
    the attempt is recorded DISCARDED by its own worker (the monitor's refused move only
    removes its stale entry)."""
    ref, moves = held.ref, Moves()
    part, task = ref.partition, ref.task
    if move.act is Act.COMMIT:
        change, ended_as = _commit_ops(held, move, moves)
        ops = [ended_as]
        if ref.backup:  # the attempt it copies lost: its row ends with this commit, whatever its worker does
            ops.append(attempts.attempt_op(part, task, ref.attempt, ended_at=change["ended_at"],
                                           outcome=LOST_TO_BACKUP))
    else:
        change, ops = _fail_ops(clients, held, move, moves)
    status = TaskStatus(change["status"])
    if _fenced(clients, writer, part, task, held.etag, change, ops, held.index, moves, _waiting(held.params, status)):
        if move.send:
            dispatch.send(clients, [(held.shard, TaskRef.of(part, task, ref.attempt + 1))])
        return True
    if not move.send:
        _discarded(clients, held, change["ended_at"], _failure(move))
    return False


def _discarded(clients: Clients, held: Claim, ended: datetime, failure: str) -> None:
    """Record that a worker's end of its attempt was refused (revoked, cancelled, beaten by
    its copy meanwhile): DISCARDED, unless its row says how it ended already (the monitor's
    revocation, the backup that won), which then stays."""
    ref = held.ref
    part, task = ref.partition, ref.task
    fields: dict[str, Any] = {"discarded": True, "discarded_at": ended}
    try:
        found = clients.tasks.get_entity(part, names.attempt_key(task, ref.attempt, ref.backup), select=["Outcome"])
        running = found.get("Outcome") in (None, TaskStatus.RUNNING.value)
    except ResourceNotFoundError:
        running = True
    if running:
        fields |= {"outcome": "DISCARDED", "ended_at": ended, **({"failure_class": failure} if failure else {})}
    attempts.record(clients, part, task, ref.attempt, ref.backup, **fields)


def _commit_ops(held: Claim, move: Move, moves: Moves) -> tuple[dict[str, Any], Op]:
    """A commit's change of the task row and its write of the attempt's end; its moves added
    to ``moves``."""
    ended, status = now(), _status(move)
    runtime = (ended - held.started).total_seconds()
    part, task, attempt, backup = held.ref.partition, held.ref.task, held.ref.attempt, held.ref.backup
    change = {"status": transition(TaskStatus.RUNNING, status), "ended_at": ended, "runtime_s": runtime,
              "outputs": json.dumps(list(move.outputs)), **({"worker": held.worker} if backup else {})}
    ended_as = attempts.attempt_op(part, task, attempt, backup, ended_at=ended, outcome=status.value,
                                   runtime_s=runtime)
    moves.move(held.stage, tile_of(held.params), TaskStatus.RUNNING, status).ran(held.stage, runtime)
    return change, ended_as


def _fail_ops(clients: Clients, held: Claim, move: Move, moves: Moves) -> tuple[dict[str, Any], list[Op]]:
    """A failure's change of the task row (QUEUED with the next attempt number and its
    dispatch entry, or DEAD), its write of the attempt's end and its failure index entry;
    its moves added to ``moves``."""
    ref, after, failure = held.ref, _status(move), _failure(move)
    part, task = ref.partition, ref.task
    ended, error = now(), _error(move)
    change: dict[str, Any] = {"status": after, "last_failure": failure, "last_error": error, "ended_at": ended}
    ops: list[Op] = []
    if after is TaskStatus.QUEUED:
        fields, write = dispatch.queued(clients, part, task, move.delay_s)
        change |= fields | {"attempt": ref.attempt + 1}
        ops.append(write)
    if move.revoked_by:
        change["worker"] = ""
    if move.timed_out:
        change["timeouts"] = held.timeouts + 1
    ended_as: dict[str, Any] = {"outcome": move.ended_as, "failure_class": failure}
    if move.revoked_by:
        ended_as["revoked_by"] = move.revoked_by
    if not move.keep_end:  # (one given up to its backup keeps the end its worker recorded)
        ended_as |= {"ended_at": ended, "error": error}
    ops.append(attempts.attempt_op(part, task, ref.attempt, **ended_as))
    ops.append(rollups.failure_op(part, task, ref.attempt, held.stage, failure, error, held.started, ended,
                                  revoked_by=move.revoked_by))
    moves.move(held.stage, tile_of(held.params), TaskStatus.RUNNING, after).failed(failure, move.kill)
    return change, ops


def _fenced(clients: Clients, writer: RollupWriter, part: str, task: str, etag: str, change: dict[str, Any],
            ops: list[Op], index: str, moves: Moves, waiting: tuple[str, ...] = (), tries: int = 5) -> bool:
    """Apply ``change`` to the task row if its ETag is still ``etag``, with ``ops`` and the
    removal of the deadline entry ``index`` in the same transaction, ``writer``'s rollup
    moved by ``moves``, and (a task ending) the count of each task ``waiting`` for it taken
    down by one — released at zero. True if applied, False if the row had moved
    on. A write refused or unanswered is settled on the row read back (``fenced``): the row
    untouched, the refusal was another row's (the reduction's count moved: counted off
    again; the deadline entry gone: written without it) or the write never came, and it is
    made again. The deadline entry goes either way."""
    mark = fenced.mark()
    change = change | {"last_write": mark}
    with_index, attempt, conflicts = True, 0, 0
    while attempt < tries:
        counted, more, sent, version = _counted_off(clients, part, waiting)
        batch = [update_op(part, task, etag, **change), *ops, *counted,
                 *([attempts.unindex_op(part, index)] if with_index else [])]
        written = fenced.write(functools.partial(writer.write, clients.tasks, part, batch, moves.merged(more)),
                               functools.partial(tasks.get_task, clients.tasks, part, task), mark)
        if not written.applied and written.row.etag == etag:  # untouched: see why, and write again
            if written.unanswered:
                time.sleep(min(2**attempt, 10))
            again = version and conflicts < CONFLICTS
            if again and _counted_off(clients, part, waiting)[3] != version:
                conflicts += 1  # another task a waiting one waits for ended meanwhile: count off again
                time.sleep(random.uniform(0, 0.05))
                continue
            with_index, attempt = False, attempt + 1
            continue  # the deadline entry (may be what failed) on its own
        if written.applied and sent:
            dispatch.send(clients, sent)  # lost, it is resent by the reconciler (its dispatch entry)
        if not written.applied or not with_index:
            attempts.unindex(clients, part, index)
        return written.applied
    raise RuntimeError(f"task {part}/{task} could not be written after {tries} tries")


def _end_backup(clients: Clients, part: str, task: str, attempt: int, index: str, etag: str = "",
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


# --- anything unfinished -> CANCELLED ----------------------------------------------------
def cancel(clients: Clients, parts: list[str], writer: RollupWriter, tries: int = CANCEL_TRIES) -> bool:
    """Move every unfinished task of the job (in its partitions ``parts``) to CANCELLED (a
    queued one with its dispatch entry), in transactions of up to a hundred writes in each
    partition; a running attempt finds its fence gone and discards its work. A transaction
    refused (a row moved meanwhile: a claim, a commit) is made again row by row on the rows
    read again, so that one row moving cancels the others all the same; a row refused
    ``tries`` passes running (storage refusing, a row that moves again and again) is left
    to the sweep's next pass, which goes on with the job's cancellation, rather than holding
    the canceller (the API's call, the sweep's pass) for ever. Returns whether every task
    has ended."""
    for _ in range(tries):
        pending = [r for r in tasks.list_tasks(clients.tasks, parts) if not r.status.terminal]
        if not pending:
            return True
        for part, rows in _chunks(pending, (tasks.BATCH - 1) // 2):  # two writes each, the rollup's makes 99
            if not _cancelled(clients, writer, part, rows) and len(rows) > 1:
                for row in _read_again(clients, part, rows):  # each alone: the ones that moved are refused
                    if not row.status.terminal:
                        _cancelled(clients, writer, part, [row])
    if any(not r.status.terminal for r in tasks.list_tasks(clients.tasks, parts)):
        log.warning("cancel of %s refused %d times: the sweep goes on with it", parts[0], tries)
        return False
    return True


def _cancelled(clients: Clients, writer: RollupWriter, part: str, rows: list[TaskRow]) -> bool:
    """Cancel ``rows`` (of partition ``part``, unfinished when read) in one transaction;
    False if a row had moved meanwhile (nothing then applied)."""
    ops: list[Op] = []
    moves = Moves()
    for row in rows:
        ops.append(update_op(part, row.task, row.etag, ended_at=now(), dispatch="",
                             status=transition(row.status, TaskStatus.CANCELLED)))
        if row.dispatch:
            ops.append(dispatch.remove_op(part, row.dispatch))
        moves.move(row.stage, tile_of(row.params), row.status, TaskStatus.CANCELLED)
    try:
        writer.write(clients.tasks, part, ops, moves)
    except TableTransactionError:
        return False
    return True


# --- dependencies: a waiting task's count of unfinished tasks it waits for ----------------
def _waiting(params: dict[str, str], status: TaskStatus | None) -> tuple[str, ...]:
    """The row keys of the tasks a task moving into ``status`` is to be counted off (those
    its plan says it feeds: ``planning.TaskPlan.feeds``); none unless the move ends it."""
    if status is None or not status.terminal:
        return ()
    return tuple(names.task_key(seq) for seq in planning.feeds_of(params))


def _counted_off(clients: Clients, part: str, keys: Sequence[str],
                 ended: int = 1) -> tuple[list[Op], Moves, list[tuple[int, TaskRef]], str]:
    """What counts ``ended`` tasks (of partition ``part``; the planner puts a waiting task
    with those it waits for) off each PENDING task of ``keys`` that waits for them: the
    update of its count of unfinished dependencies (fenced on the row's ETag, read now)
    and, if those were the last, its move to QUEUED with its dispatch entry; the moves of
    that for the rollup; the messages to send once written; and the ETags it read, as one
    version ("" if nothing is to be counted: a waiting task cancelled, or gone)."""
    ops: list[Op] = []
    moves, messages, versions = Moves(), list[tuple[int, TaskRef]](), list[str]()
    for key in keys:
        try:
            row = tasks.get_task(clients.tasks, part, key)
        except ResourceNotFoundError:
            continue
        if row.status is not TaskStatus.PENDING or row.deps is None:
            continue  # cancelled, settled, or planned before dependencies counted
        fields: dict[str, Any] = {"deps": row.deps - ended}
        if fields["deps"] <= 0:
            queued, write = dispatch.queued(clients, part, key)
            fields |= queued
            ops.append(write)
            moves.move(row.stage, tile_of(row.params), row.status, transition(row.status, TaskStatus.QUEUED))
            messages.append((row.shard, row.ref))
        ops.insert(0, update_op(part, key, row.etag, **fields))
        versions.append(row.etag)
    return ops, moves, messages, ",".join(versions)
