"""Task rows: creation, the queue message that names an attempt, claim, heartbeat and the
fenced commit.

The tasks table is the source of truth (PK = job id, RK = zero-padded sequence). Every
change of a task row is a conditional update on its ETag, and every move into a terminal
state is written in one entity-group transaction with the writer's own counter row
(:class:`TerminalCounter`), so "how many tasks are terminal" is exact and cheap.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceModifiedError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.data.tables import TableClient, TableTransactionError, UpdateMode

from pipeline import attempts, names
from pipeline.clients import Clients
from pipeline.request import TaskSpec
from pipeline.status import TERMINAL, TaskStatus, after_failure, transition

BATCH = 100  # entities per entity-group transaction (the service's limit)
ERROR_CHARS = 2000  # an error message kept on a row is cut to this


def now() -> datetime:
    return datetime.now(UTC)


def if_match(etag: str) -> dict[str, Any]:
    return {"etag": etag, "match_condition": MatchConditions.IfNotModified}


def is_conflict(exc: Exception) -> bool:
    """Whether a conditional write failed because the row had changed (HTTP 412)."""
    return getattr(exc, "status_code", None) == 412


# --- messages: references, never data --------------------------------------------------
def message_bytes(content: bytes | str) -> bytes:
    """The body of a received message (base64 on the wire); ValueError if it is not."""
    if isinstance(content, bytes):
        return content
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("message body is not base64") from None


@dataclass(frozen=True)
class TaskRef:
    """What a task queue message says: which attempt of which task to run."""

    job: str
    task: str
    attempt: int

    def encode(self) -> bytes:
        return json.dumps({"job": self.job, "task": self.task, "attempt": self.attempt}).encode()

    @classmethod
    def decode(cls, content: bytes | str) -> TaskRef:
        """Parse a message body; ValueError for anything that is not a task reference."""
        try:
            body = json.loads(message_bytes(content))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(body, dict) or set(body) != {"job", "task", "attempt"}:
            raise ValueError("a task message is {job, task, attempt}")
        job, task, attempt = body["job"], body["task"], body["attempt"]
        if not (isinstance(job, str) and isinstance(task, str) and type(attempt) is int):
            raise ValueError("job and task are strings, attempt an integer")
        if not (names.JOB_KEY.fullmatch(job) and len(task) == names.TASK_KEY_WIDTH
                and task.isascii() and task.isdigit()):
            raise ValueError("malformed job or task key")
        if not 1 <= attempt <= 1000:
            raise ValueError("attempt out of range")
        return cls(job, task, attempt)


# --- creation ----------------------------------------------------------------------------
def task_entity(job: str, seq: int, spec: TaskSpec, shards: int) -> dict[str, Any]:
    return {
        "PartitionKey": job,
        "RowKey": names.task_key(seq),
        "Seq": seq,
        "Shard": seq % shards,
        "Stage": spec.stage,
        "Params": json.dumps(spec.params()),
        "Status": TaskStatus.PENDING.value,
        "Attempt": 1,
    }


def create_batch(tasks: TableClient, entities: list[dict[str, Any]]) -> int:
    """Create up to BATCH task rows of one job, atomically when none exists yet; rows that
    already exist (a plan message processed twice, a planner that died) are left as they
    are. Returns how many rows this call created."""
    try:
        tasks.submit_transaction([("create", e) for e in entities])
        return len(entities)
    except TableTransactionError as exc:
        if exc.error_code != "EntityAlreadyExists":
            raise
    created = 0
    for entity in entities:
        try:
            tasks.create_entity(entity)
            created += 1
        except ResourceExistsError:
            pass
    return created


# --- terminal counters -------------------------------------------------------------------
class TerminalCounter:
    """One writer's count of the tasks it moved into a terminal state, per job.

    Each writer (a worker slot, a canceller) owns its own row, so the rows never contend;
    their sum is the job's terminal count. The row is updated in the same transaction as
    the task rows it counts.
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._etags: dict[str, tuple[str | None, dict[str, int]]] = {}
        self._lock = threading.Lock()

    def _load(self, tasks: TableClient, job: str) -> tuple[str | None, dict[str, int]]:
        try:
            row = tasks.get_entity(job, names.counter_key(self.owner))
        except ResourceNotFoundError:
            return None, {}
        return row.metadata["etag"], {s.value: int(row.get(s.value, 0)) for s in TERMINAL}

    def write(self, tasks: TableClient, job: str, changes: list[tuple[str, dict[str, Any], dict[str, Any]]],
              added: dict[str, int]) -> list[dict[str, Any]]:
        """Submit task-row ``changes`` with this writer's counter raised by ``added``, in one
        transaction. Raises TableTransactionError if any task row changed meanwhile."""
        with self._lock:
            if job not in self._etags:
                self._etags[job] = self._load(tasks, job)
            etag, counts = self._etags[job]
            new_counts = dict(counts)
            for status, n in added.items():
                new_counts[status] = new_counts.get(status, 0) + n
            row = {"PartitionKey": job, "RowKey": names.counter_key(self.owner), **new_counts}
            op = ("create", row) if etag is None else (
                "update", row, {"mode": UpdateMode.REPLACE, **if_match(etag)}
            )
            try:
                result = tasks.submit_transaction([*changes, op])
            except Exception:
                del self._etags[job]  # reload next time: the counter may be what failed, or
                raise  # the transaction may have been applied before the connection broke
            self._etags[job] = (result[-1]["etag"], new_counts)
            return list(result[:-1])


def terminal_counts(tasks: TableClient, job: str) -> dict[str, int]:
    """How many of a job's tasks are in each terminal state (sum of the counter rows)."""
    low, high = names.COUNTER_PREFIX, names.COUNTER_PREFIX + "\U0010ffff"
    rows = tasks.query_entities(
        "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
        parameters={"pk": job, "lo": low, "hi": high},
    )
    totals = {s.value: 0 for s in TERMINAL}
    for row in rows:
        for status in totals:
            totals[status] += int(row.get(status, 0))
    return totals


def list_tasks(tasks: TableClient, job: str, first: int = 0, count: int | None = None) -> list[dict[str, Any]]:
    """Task rows of a job in sequence order, from ``first`` (``count`` of them, or all)."""
    high = names.task_key(first + count) if count is not None else names.TASK_KEYS_END
    rows = tasks.query_entities(
        "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
        parameters={"pk": job, "lo": names.task_key(first), "hi": high},
    )
    return list(rows)


# --- one attempt: claim, heartbeat, commit, fail ------------------------------------------
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


def claim(clients: Clients, ref: TaskRef, worker: str,
          kill_time: Callable[[TaskRef, str, dict[str, str], int], datetime]) -> Claim | None:
    """Move the task to RUNNING for the attempt its row names, if the message may still run
    it: the row is QUEUED and the message is not from a later attempt. None otherwise (the
    message is stale or a duplicate, and is deleted). ``kill_time`` says when the monitor is
    to revoke the attempt, from its stage, parameters and how many earlier attempts were
    revoked for time. The task row, the attempt's row and its index entry are written in
    one transaction: no attempt is ever RUNNING without an index entry."""
    try:
        row = clients.tasks.get_entity(ref.job, ref.task)
    except ResourceNotFoundError:
        return None
    if row["Status"] != TaskStatus.QUEUED.value or ref.attempt > row["Attempt"]:
        return None
    # An older message may stand in for the current attempt: the row is the truth.
    current = TaskRef(ref.job, ref.task, row["Attempt"])
    params = json.loads(row["Params"])
    kill_at = kill_time(current, row["Stage"], params, int(row.get("Timeouts", 0)))
    started = now()
    change = {
        "PartitionKey": ref.job,
        "RowKey": ref.task,
        "Status": transition(row["Status"], TaskStatus.RUNNING).value,
        "Worker": worker,
        "StartedAt": started,
    }
    index, index_write = attempts.index_op(clients, ref.job, ref.task, current.attempt, kill_at, worker, started)
    try:
        result = clients.tasks.submit_transaction([
            ("update", change, {"mode": UpdateMode.MERGE, **if_match(row.metadata["etag"])}),
            attempts.attempt_op(ref.job, ref.task, current.attempt, Worker=worker, StartedAt=started,
                                Heartbeat=started, Outcome=TaskStatus.RUNNING.value),
            index_write,
        ])
    except TableTransactionError as exc:
        if is_conflict(exc) or exc.error_code == "UpdateConditionNotSatisfied":
            return None  # another worker claimed it first
        raise
    return Claim(current, result[0]["etag"], row["Stage"], params, started, row.get("LastFailure") or "", worker,
                 kill_at, index)


def still_held(clients: Clients, held: Claim) -> bool:
    """True while the task row still names this attempt as running (nobody revoked or
    cancelled it)."""
    row = clients.tasks.get_entity(held.ref.job, held.ref.task)
    return bool(row.metadata["etag"] == held.etag)


def _end_attempt(clients: Clients, held: Claim, **fields: Any) -> None:
    attempts.record(clients, held.ref.job, held.ref.task, held.ref.attempt, EndedAt=now(), **fields)


def discard(clients: Clients, held: Claim) -> None:
    """Record that a revoked attempt's work was thrown away; it leaves the index."""
    attempts.record(clients, held.ref.job, held.ref.task, held.ref.attempt, Discarded=True, DiscardedAt=now())
    attempts.unindex(clients, held.ref.job, held.index)


def _fenced_write(clients: Clients, counter: TerminalCounter, held: Claim, change: dict[str, Any],
                  terminal: TaskStatus | None, ended: dict[str, Any], tries: int = 5) -> bool:
    """Apply ``change`` to the task row if it still names this attempt as running, with the
    attempt's end (``ended``), its removal from the index and the writer's counter (when
    ``terminal``) in the same transaction. True if applied, False if the attempt had been
    revoked. A write whose answer was lost (a connection cut, storage restarting) is settled
    by reading the row back, never by guessing. The attempt leaves the index either way."""
    change = change | {"LastWrite": uuid.uuid4().hex}  # to recognise this write when read back
    job = held.ref.job
    ops = [("update", change, {"mode": UpdateMode.MERGE, **if_match(held.etag)}),
           attempts.attempt_op(job, held.ref.task, held.ref.attempt, **ended),
           attempts.unindex_op(job, held.index)]
    for attempt in range(tries):
        try:
            if terminal is not None:
                counter.write(clients.tasks, job, ops, {terminal.value: 1})
            else:
                clients.tasks.submit_transaction(ops)
            applied = True
        except (TableTransactionError, ResourceModifiedError):
            applied = None  # the task row, the counter or the index entry had moved on: see which
        except (ServiceRequestError, ServiceResponseError):
            applied = None  # no answer: it may or may not have been applied
            time.sleep(min(2**attempt, 10))
        except HttpResponseError as exc:
            if (exc.status_code or 0) < 500:
                raise
            applied = None
            time.sleep(min(2**attempt, 10))
        if applied is None:
            row = _read_back(clients, held)
            if row.metadata["etag"] == held.etag:
                ops = ops[:2]  # untouched: write again, the index entry (may be what failed) on its own
                continue
            applied = row.get("LastWrite") == change["LastWrite"]  # applied, or revoked meanwhile
        if not applied or len(ops) == 2:
            attempts.unindex(clients, job, held.index)
        return applied
    raise RuntimeError(f"task {held.ref} could not be written after {tries} tries")


def _read_back(clients: Clients, held: Claim) -> Any:
    for attempt in range(10):
        try:
            return clients.tasks.get_entity(held.ref.job, held.ref.task)
        except (ServiceRequestError, ServiceResponseError):
            time.sleep(min(2**attempt, 10))
    return clients.tasks.get_entity(held.ref.job, held.ref.task)


def commit(clients: Clients, counter: TerminalCounter, held: Claim, status: TaskStatus,
           outputs: list[str]) -> bool:
    """Publish the attempt's outputs on the task row, fenced on the claim's ETag: True if
    this attempt committed, False if it had been revoked (its outputs are then never named)."""
    ended = now()
    runtime = (ended - held.started).total_seconds()
    change = {
        "PartitionKey": held.ref.job,
        "RowKey": held.ref.task,
        "Status": transition(TaskStatus.RUNNING, status).value,
        "EndedAt": ended,
        "RuntimeS": runtime,
        "Outputs": json.dumps(outputs),
    }
    if _fenced_write(clients, counter, held, change, status,
                     {"EndedAt": ended, "Outcome": status.value, "RuntimeS": runtime}):
        return True
    _end_attempt(clients, held, Outcome="DISCARDED")
    return False


def fail(clients: Clients, counter: TerminalCounter, held: Claim, failure: str, error: str,
         max_attempts: int, failed_as: TaskStatus = TaskStatus.FAILED) -> TaskStatus | None:
    """Record a failed attempt and move the task on: QUEUED with the next attempt number
    while the budget lasts, else DEAD. None if the attempt had been revoked meanwhile."""
    after = after_failure(TaskStatus.RUNNING, failed_as, held.ref.attempt, max_attempts)
    ended = now()
    change: dict[str, Any] = {
        "PartitionKey": held.ref.job,
        "RowKey": held.ref.task,
        "Status": after.value,
        "LastFailure": failure,
        "LastError": error[:ERROR_CHARS],
        "EndedAt": ended,
    }
    if after is TaskStatus.QUEUED:
        change["Attempt"] = held.ref.attempt + 1
    ended_as = {"EndedAt": ended, "Outcome": failed_as.value, "FailureClass": failure, "Error": error[:ERROR_CHARS]}
    if not _fenced_write(clients, counter, held, change, after if after is TaskStatus.DEAD else None, ended_as):
        _end_attempt(clients, held, Outcome="DISCARDED", FailureClass=failure)
        return None
    return after
