"""Every change of a task's state, each a named operation and a conditional write.

Whoever moves a task — the planner releasing it, a worker committing or failing it, the
monitor revoking it, a canceller — calls one of these, or, to claim it, one of
``pipeline.lifecycle.claims``; no other module writes a task row's state. Each is one
entity-group transaction in the task's partition (``pipeline.lifecycle.partitions``), fenced
on the row's ETag, holding everything that must
change with it: the attempt's row, its entry in the monitor's deadline index
(``pipeline.lifecycle.attempts``), its entry in the dispatch index while it is QUEUED
(``pipeline.lifecycle.dispatch``), a failed attempt's entry in the failure index, the
writer's rollup row (``pipeline.lifecycle.rollups``: what the move changes in the job's
counts per state, tile and stage, its runtimes and failures), and a tile task's end counted
off the reduction waiting on it (``pipeline.lifecycle.dependencies``). The state machine
(``pipeline.lifecycle.status``) checks each move.

A write whose answer was lost (a connection cut, storage restarting) is settled by reading
the row back — never by guessing, and never by retrying blindly into a 412 that would make
an applied write look like a lost race.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

from azure.core.exceptions import (
    HttpResponseError,
    ResourceModifiedError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.data.tables import TableTransactionError

from pipeline.failures import FailureClass
from pipeline.lifecycle import attempts, dependencies, dispatch, partitions, rollups, tasks
from pipeline.lifecycle.attempts import Op
from pipeline.lifecycle.claims import Claim
from pipeline.lifecycle.rollups import Moves
from pipeline.lifecycle.status import TaskStatus, after_failure, transition
from pipeline.lifecycle.tasks import TaskRef, TaskRow, TerminalCounter, now, tile_of, update_op
from pipeline.redact import redact
from pipeline.storage.clients import Clients

ERROR_CHARS = 2000  # an error message kept on a row is cut to this
# the most characters of output names a task row holds (a string property is 64 KiB of UTF-16)
OUTPUTS_CHARS = 30_000
GROUP_COMMITS = (tasks.BATCH - 1) // 3  # commits one transaction holds: a task row, its attempt, its entry


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
                    tasks.MOVER.write(clients.tasks, part, ops, moves)
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
                for key in dependencies.waiting(row.parameters(), TaskStatus.CACHED):
                    waiting[key] = waiting.get(key, 0) + 1
            messages: list[tuple[int, TaskRef]] = []
            for key, count in waiting.items():
                counted, more, sent, _ = dependencies.counted_off(clients, part, [key], count)
                ops, moves, messages = ops + counted, moves.merged(more), messages + sent
            try:
                if ops:
                    tasks.MOVER.write(clients.tasks, part, ops, moves)
            except TableTransactionError:  # a row moved meanwhile (queued, cancelled, another planner)
                chunk = _read_again(clients, part, chunk)
                continue
            dispatch.send(clients, messages)  # a message lost: the reconciler resends (its dispatch entry)
            settled += len(live)
            break
    return settled


# --- RUNNING -> terminal, or back to QUEUED: fenced on the attempt ----------------------------
def _fenced(clients: Clients, part: str, task: str, etag: str, change: dict[str, Any], ops: list[Op],
            index: str, counter: TerminalCounter, moves: Moves, waiting: tuple[str, ...] = (),
            tries: int = 5) -> bool:
    """Apply ``change`` to the task row if its ETag is still ``etag``, with ``ops`` and the
    removal of the deadline entry ``index`` in the same transaction, the writer's rollup
    (``counter``) moved by ``moves``, and (a task ending) the count of each task ``waiting``
    for it taken down by one — released at zero. True if applied, False if the
    row had moved on. A write whose answer was lost is settled by reading the row back. The
    deadline entry goes either way."""
    change = change | {"last_write": uuid.uuid4().hex}  # to recognise this write when read back
    with_index, attempt, conflicts = True, 0, 0
    while attempt < tries:
        counted, more, sent, version = dependencies.counted_off(clients, part, waiting)
        batch = [update_op(part, task, etag, **change), *ops, *counted,
                 *([attempts.unindex_op(part, index)] if with_index else [])]
        try:
            counter.write(clients.tasks, part, batch, moves.merged(more))
            applied: bool | None = True
        except (TableTransactionError, ResourceModifiedError):
            applied = None  # the task row, the counter or the deadline entry had moved on: see which
        except (ServiceRequestError, ServiceResponseError):
            applied = None  # no answer: it may or may not have been applied
            time.sleep(min(2**attempt, 10))
        except HttpResponseError as exc:
            if (exc.status_code or 0) < 500:
                raise
            applied = None
            time.sleep(min(2**attempt, 10))
        if applied is None:
            row = tasks.read_back(clients.tasks, part, task)
            if row.etag == etag:
                again = version and conflicts < dependencies.CONFLICTS
                if again and dependencies.counted_off(clients, part, waiting)[3] != version:
                    conflicts += 1  # another task a waiting one waits for ended meanwhile: count off again
                    time.sleep(random.uniform(0, 0.05))
                    continue
                with_index, attempt = False, attempt + 1
                continue  # untouched: write again, the deadline entry (may be what failed) on its own
            applied = row.last_write == change["last_write"]  # applied, or moved on meanwhile
        if applied and sent:
            dispatch.send(clients, sent)  # lost, it is resent by the reconciler (its dispatch entry)
        if not applied or not with_index:
            attempts.unindex(clients, part, index)
        return bool(applied)
    raise RuntimeError(f"task {part}/{task} could not be written after {tries} tries")


def commit(clients: Clients, counter: TerminalCounter, held: Claim, status: TaskStatus,
           outputs: list[str]) -> bool:
    """Publish the attempt's outputs on the task row, fenced on the claim's ETag: True if
    this attempt committed, False if it had been revoked (its outputs are then never named).
    An attempt and its backup hold the same fence: the first of them to commit wins."""
    moves = Moves()
    change, ended_as = _commit_ops(held, status, outputs, moves)
    part, task = held.ref.partition, held.ref.task
    if _fenced(clients, part, task, held.etag, change, [ended_as], held.index, counter, moves,
               dependencies.waiting(held.params, status)):
        return True
    attempts.record(clients, part, task, held.ref.attempt, held.ref.backup, ended_at=change["ended_at"],
                    outcome="DISCARDED")
    return False


def commit_many(clients: Clients, counter: TerminalCounter,
                ended: list[tuple[Claim, TaskStatus, list[str]]]) -> list[bool | Exception]:
    """:func:`commit` of several attempts of one partition at once (none a backup, none a
    tile task counted off a reduction; at most ``GROUP_COMMITS``): one transaction, each row
    fenced on its claim's ETag, with ``counter``'s rollup. A transaction refused (a row moved:
    revoked, cancelled) or unanswered is settled on the first row read back — all of it
    applied, or none — and if none, each is committed on its own, which tells which hold:
    each one's answer, or the error its own commit raised."""
    part, mark, moves, ops = ended[0][0].ref.partition, uuid.uuid4().hex, Moves(), list[Op]()
    for held, status, outputs in ended:
        change, ended_as = _commit_ops(held, status, outputs, moves)
        ops += [update_op(part, held.ref.task, held.etag, **change, last_write=mark), ended_as,
                attempts.unindex_op(part, held.index)]
    try:
        counter.write(clients.tasks, part, ops, moves)
    except Exception:
        if tasks.read_back(clients.tasks, part, ended[0][0].ref.task).last_write != mark:
            return [_alone(clients, counter, *each) for each in ended]
    return [True] * len(ended)


def _alone(clients: Clients, counter: TerminalCounter, held: Claim, status: TaskStatus,
           outputs: list[str]) -> bool | Exception:
    try:
        return commit(clients, counter, held, status, outputs)
    except Exception as exc:  # its own: the others of its group are settled all the same
        return exc


def _commit_ops(held: Claim, status: TaskStatus, outputs: list[str], moves: Moves) -> tuple[dict[str, Any], Op]:
    """A commit's change of the task row and its write of the attempt's end; its moves added
    to ``moves``."""
    ended = now()
    runtime = (ended - held.started).total_seconds()
    part, task, attempt, backup = held.ref.partition, held.ref.task, held.ref.attempt, held.ref.backup
    change = {"status": transition(TaskStatus.RUNNING, status), "ended_at": ended, "runtime_s": runtime,
              "outputs": json.dumps(outputs), **({"worker": held.worker} if backup else {})}
    ended_as = attempts.attempt_op(part, task, attempt, backup, ended_at=ended, outcome=status.value,
                                   runtime_s=runtime)
    moves.move(held.stage, tile_of(held.params), TaskStatus.RUNNING, status).ran(held.stage, runtime)
    return change, ended_as


def _ended(clients: Clients, row_attempt: int, failed_as: TaskStatus, budget: int, failure: FailureClass,
           error: str, delay_s: float, part: str, task: str) -> tuple[TaskStatus, dict[str, Any], list[Op]]:
    """A failed attempt's end: where it leaves the task, the row's fields, and (if QUEUED
    again) its dispatch entry's write."""
    after = after_failure(TaskStatus.RUNNING, failed_as, row_attempt, budget)
    change: dict[str, Any] = {"status": after, "last_failure": failure.value,
                              "last_error": redact(error)[:ERROR_CHARS], "ended_at": now()}
    ops: list[Op] = []
    if after is TaskStatus.QUEUED:
        fields, write = dispatch.queued(clients, part, task, delay_s)
        change |= fields | {"attempt": row_attempt + 1}
        ops.append(write)
    return after, change, ops


def fail(clients: Clients, counter: TerminalCounter, held: Claim, failure: FailureClass, error: str,
         budget: int, delay_s: float = 0.0) -> TaskStatus | None:
    """Record a failed attempt and move the task on: QUEUED with the next attempt number
    (its message due after ``delay_s``: the caller sends it, by handing back its own) while
    ``budget`` attempts are not spent, else DEAD. None if the attempt had been revoked."""
    part, task, attempt = held.ref.partition, held.ref.task, held.ref.attempt
    after, change, ops = _ended(clients, attempt, TaskStatus.FAILED, budget, failure, error, delay_s, part, task)
    ended_as = attempts.attempt_op(part, task, attempt, ended_at=change["ended_at"], outcome=TaskStatus.FAILED.value,
                                   failure_class=failure.value, error=change["last_error"])
    indexed = rollups.failure_op(part, task, attempt, held.stage, failure.value, change["last_error"], held.started,
                                 change["ended_at"])
    moves = Moves().move(held.stage, tile_of(held.params), TaskStatus.RUNNING, after).failed(failure.value)
    if _fenced(clients, part, task, held.etag, change, [ended_as, indexed, *ops], held.index, counter, moves,
               dependencies.waiting(held.params, after)):
        return after
    attempts.record(clients, part, task, attempt, ended_at=change["ended_at"], outcome="DISCARDED",
                    failure_class=failure.value)
    return None


def revoke(clients: Clients, counter: TerminalCounter, row: TaskRow, ref: TaskRef, index: str, why: FailureClass,
           budget: int, worker: str = "", by: str = "monitor", gave_way: bool = False) -> TaskStatus | None:
    """The monitor's move: take the task (its ``row``, just read) away from its running
    attempt (``worker``'s, if given) whose deadline entry ``index`` fell due; next attempt
    QUEUED (its message sent) or DEAD when ``budget`` is spent. None if that attempt is no
    longer the running one (the entry is then only removed). A worker whose attempt runs
    past its kill time makes the same move itself (``by`` "worker"), without waiting for
    the monitor's next pass. An attempt taken from a worker found slow (``why`` WORKER_SLOW)
    is recorded as the failure it was, not as a timeout: the task's later attempts keep
    their limit, and the monitor killed nothing for time; one that its slow worker had
    already given up to a backup that then ended without committing (``gave_way``) keeps the
    end its worker recorded."""
    if row.status is not TaskStatus.RUNNING or row.attempt != ref.attempt or (
            worker and row.worker != worker):  # another worker claimed it after the indexed one died
        attempts.unindex(clients, row.part, index)
        return None
    slow = why is FailureClass.WORKER_SLOW  # its machine's fault: it ran out of no time
    failed_as = TaskStatus.FAILED if slow else TaskStatus.TIMED_OUT
    after, change, ops = _ended(clients, ref.attempt, failed_as, budget, why,
                                f"revoked by the {by}: {why.value}", 0.0, row.part, ref.task)
    change["worker"] = ""
    if why is FailureClass.EXECUTION_TIMEOUT:
        change["timeouts"] = row.timeouts + 1
    ended_as = attempts.attempt_op(row.part, ref.task, ref.attempt, outcome=failed_as.value, failure_class=why.value,
                                   revoked_by=by, **({} if gave_way else {"ended_at": change["ended_at"]}))
    indexed = rollups.failure_op(row.part, ref.task, ref.attempt, row.stage, why.value, change["last_error"],
                                 row.started_at, change["ended_at"], revoked_by=by)
    moves = Moves().move(row.stage, tile_of(row.params), TaskStatus.RUNNING, after).failed(why.value, not slow)
    if not _fenced(clients, row.part, ref.task, row.etag, change, [ended_as, indexed, *ops], index,
                   counter, moves, dependencies.waiting(row.parameters(), after)):
        return None  # it committed or failed meanwhile
    if after is TaskStatus.QUEUED:
        dispatch.send(clients, [(row.shard, TaskRef.of(row.part, ref.task, ref.attempt + 1))])
    return after


# --- anything unfinished -> CANCELLED ----------------------------------------------------
def cancel(clients: Clients, parts: list[str], counter: TerminalCounter) -> None:
    """Move every unfinished task of the job (in its partitions ``parts``) to CANCELLED (a
    queued one with its dispatch entry), in transactions of up to a hundred writes in each
    partition; a running attempt finds its fence gone and discards its work."""
    while True:
        pending = [r for r in tasks.list_tasks(clients.tasks, parts) if not r.status.terminal]
        if not pending:
            return
        for part, rows in _chunks(pending, (tasks.BATCH - 1) // 2):  # two writes each, the counter's makes 99
            chunk: list[Op] = []
            moves = Moves()
            for row in rows:
                chunk.append(update_op(part, row.task, row.etag, ended_at=now(), dispatch="",
                                       status=transition(row.status, TaskStatus.CANCELLED)))
                if row.dispatch:
                    chunk.append(dispatch.remove_op(part, row.dispatch))
                moves.move(row.stage, tile_of(row.params), row.status, TaskStatus.CANCELLED)
            _cancelled(clients, counter, part, chunk, moves)


def _cancelled(clients: Clients, counter: TerminalCounter, part: str, ops: list[Op], moves: Moves) -> None:
    try:
        counter.write(clients.tasks, part, ops, moves)
    except TableTransactionError:
        pass  # a row moved meanwhile; the next pass reads it again
