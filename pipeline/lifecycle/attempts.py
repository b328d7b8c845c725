"""Attempt rows and the monitor's deadline index, kept in their task's partition of the
tasks table beside the task rows (``pipeline.lifecycle.partitions``).

In one partition, an attempt's bookkeeping goes into the same entity-group transaction as
the task row it belongs to: the claim writes the task row (RUNNING), the attempt row and
its index row at once, and the commit writes the task row, the writer's counter, the
attempt's end and the index row's removal at once. So no attempt is ever RUNNING without
an index row, none leaves one behind once its task has moved on, and a task costs two
writes where separate tables cost six.

- attempt rows: RK ``~attempt~{task}-{attempt}`` (worker, start, end, outcome, failure class);
- index rows: RK ``~deadline~{deadline ms}-{task}-{attempt}``, so "overdue in this job" is
  one key-range query per partition. The deadline is the earliest of the kill time, the heartbeat's
  expiry and the time from which a backup attempt would help (``speculate_at``; the monitor
  starts one only at a job's tail: ``pipeline.lifecycle.speculation``); a heartbeat moves
  the row.

A backup attempt (a second copy of a running attempt) has rows of its own, their keys
marked ``b`` (``names.BACKUP_MARK``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableClient, TableTransactionError, UpdateMode

from pipeline.failures import FailureClass, error_code
from pipeline.lifecycle import partitions
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.storage.rows import Row, stored

Op = tuple[Any, ...]  # one operation of an entity-group transaction


def _range(prefix: str, high: str | None = None) -> tuple[str, dict[str, str]]:
    return "RowKey ge @lo and RowKey lt @hi", {"lo": prefix, "hi": high or prefix + "\U0010ffff"}


# --- attempt rows -------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class AttemptRow(Row):
    """One attempt of a task: who ran it, when, and how it ended. Written in pieces (the
    claim, each heartbeat, the end), each a merge of the fields it knows."""

    part: str = field(metadata=stored("PartitionKey"))  # its task's
    key: str = field(metadata=stored("RowKey"))  # ``~attempt~{task}-{attempt}[b]``
    task: str
    attempt: int
    backup: bool = False  # a backup copy of the attempt, asked for by the monitor
    stage: str = ""  # kept on its copy in the failure index (``pipeline.lifecycle.rollups``)
    worker: str = ""
    started_at: datetime | None = None
    heartbeat: datetime | None = None  # its last
    ended_at: datetime | None = None
    outcome: str = ""  # RUNNING, then the status it ended the task in, or DISCARDED (a backup: REQUESTED
    # first, NOT_RUN if nobody ran it)
    runtime_s: float | None = None
    failure_class: str = ""
    error: str = ""
    revoked_by: str = ""  # "monitor" when the monitor took the task away from it
    discarded: bool = False  # revoked: its work thrown away
    discarded_at: datetime | None = None
    etag: str = field(default="", compare=False)

    @property
    def job(self) -> str:
        return names.job_of(self.part)

    def seconds(self) -> float | None:
        """How long it ran: its committed runtime, else from its start to its end."""
        if self.runtime_s is not None:
            return float(self.runtime_s)
        if self.started_at and self.ended_at:
            return (self.ended_at - self.started_at).total_seconds()
        return None


def attempt_row(part: str, task: str, attempt: int, backup: bool = False, **fields: Any) -> dict[str, Any]:
    """The attempt's keys (in its task's partition ``part``) and ``fields`` (by AttemptRow
    field name), as a merge writes them (``backup``: its backup's)."""
    return AttemptRow.as_stored(part=part, key=names.attempt_key(task, attempt, backup), task=task, attempt=attempt,
                                **({"backup": True} if backup else {}), **fields)


def attempt_op(part: str, task: str, attempt: int, backup: bool = False, **fields: Any) -> Op:
    """Merge ``fields`` into the attempt's (or its backup's) row, creating it if need be."""
    return ("upsert", attempt_row(part, task, attempt, backup, **fields), {"mode": UpdateMode.MERGE})


def list_attempts(tasks: TableClient, parts: list[str], *fields: str) -> list[AttemptRow]:
    """Every attempt of a job (in its partitions ``parts``), in task order (only ``fields``
    of each, if named)."""
    where, params = _range(names.ATTEMPT_PREFIX)
    select = [AttemptRow.stored_names()[f] for f in ("part", "key", "task", "attempt", *fields)] if fields else None
    return sorted((AttemptRow.from_entity(row) for row in partitions.query(tasks, parts, where, params, select=select)),
                  key=lambda row: row.key)


def record(clients: Clients, part: str, task: str, attempt: int, backup: bool = False, **fields: Any) -> None:
    """Merge ``fields`` into an attempt's row, on its own (when no task row changes with it)."""
    clients.tasks.upsert_entity(attempt_row(part, task, attempt, backup, **fields), mode=UpdateMode.MERGE)


def running_etag(clients: Clients, part: str, task: str, attempt: int, backup: bool = False) -> str | None:
    """The ETag of the attempt's (or its backup's) row if it says the attempt is running,
    else None."""
    try:
        found = clients.tasks.get_entity(part, names.attempt_key(task, attempt, backup), select=["Outcome"])
    except ResourceNotFoundError:
        return None
    return str(found.metadata["etag"]) if found.get("Outcome") == "RUNNING" else None


def is_running(clients: Clients, part: str, task: str, attempt: int, backup: bool = False) -> bool:
    """Whether the attempt's (or its backup's) row says it is running."""
    return running_etag(clients, part, task, attempt, backup) is not None


def gave_way(clients: Clients, part: str, task: str, attempt: int) -> bool:
    """Whether the attempt's worker, found slow, gave it up to its backup
    (``policy.Act.GIVE_WAY``, written by ``transitions.apply``): its row records that failure."""
    try:
        found = clients.tasks.get_entity(part, names.attempt_key(task, attempt), select=["FailureClass"])
    except ResourceNotFoundError:
        return False
    return found.get("FailureClass") == FailureClass.WORKER_SLOW.value


def is_missing(exc: TableTransactionError) -> bool:
    """Whether a transaction failed on a row that does not exist (an update or delete)."""
    return exc.status_code == 404 or error_code(exc) == "ResourceNotFound"


# --- the deadline index -------------------------------------------------------------------
def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


@dataclass(frozen=True, kw_only=True)
class Deadline(Row):
    """An attempt's entry in the monitor's deadline index: RK ``~deadline~{due ms}-{task}-{attempt}[b]``,
    due at the earliest of its three times."""

    part: str = field(metadata=stored("PartitionKey"))  # its task's
    key: str = field(metadata=stored("RowKey"))
    task: str
    attempt: int
    worker: str = ""
    kill_at: datetime
    heartbeat_until: datetime
    speculate_at: datetime | None = None  # from then a backup would help (None: never asked for)
    backup: bool = False  # the entry of a backup attempt
    etag: str = field(default="", compare=False)
    written: ClassVar[frozenset[str]] = frozenset({"worker"})

    @property
    def job(self) -> str:
        return names.job_of(self.part)


def index_op(clients: Clients, part: str, task: str, attempt: int, kill_at: datetime, worker: str,
             at: datetime, speculate_at: datetime | None = None, backup: bool = False) -> tuple[str, Op]:
    """The index row of ``worker``'s attempt (or its backup), due at the earliest of its kill
    time, its heartbeat's expiry from ``at`` and ``speculate_at``: its row key and the
    operation that writes it."""
    heartbeat_until = at + timedelta(seconds=clients.settings.lease_seconds)
    due = min(kill_at, heartbeat_until, *([speculate_at] if speculate_at else []))
    key = names.deadline_key(_ms(due), task, attempt, backup)
    row = Deadline(part=part, key=key, task=task, attempt=attempt, worker=worker, kill_at=kill_at,
                   heartbeat_until=heartbeat_until, speculate_at=speculate_at, backup=backup)
    return key, ("upsert", row.to_entity(), {"mode": UpdateMode.REPLACE})


def unindex_op(part: str, key: str) -> Op:
    return ("delete", {"PartitionKey": part, "RowKey": key})


def overdue(clients: Clients, parts: list[str], at: datetime) -> list[Deadline]:
    """The index rows due before ``at`` in a job's partitions ``parts``."""
    where, params = _range(names.DEADLINE_PREFIX, f"{names.DEADLINE_PREFIX}{_ms(at):015d}")
    return [Deadline.from_entity(row) for row in partitions.query(clients.tasks, parts, where, params)]


def held_by(clients: Clients, parts: list[str], workers: list[str]) -> list[Deadline]:
    """The index rows of attempts (and backups) ``workers`` run in a job's partitions
    ``parts``: one query each."""
    where, params = _range(names.DEADLINE_PREFIX)
    named = " or ".join(f"Worker eq @w{i}" for i in range(len(workers)))
    return [Deadline.from_entity(row) for row in partitions.query(
        clients.tasks, parts, f"{where} and ( {named} )",  # (the SDK finds a parameter between spaces)
        {**params, **{f"w{i}": w for i, w in enumerate(workers)}})]


def move(clients: Clients, part: str, task: str, attempt: int, kill_at: datetime, worker: str,
         previous: str, speculate_at: datetime | None = None, backup: bool = False) -> str:
    """Heartbeat: move the attempt's index row to its new deadline and note the beat on its
    attempt row, in one transaction. Returns the new row key. If ``previous`` is gone (a
    beat applied whose answer was lost moved it already), the row is written all the same
    and every other row of this attempt by ``worker`` is dropped."""
    at = datetime.now(UTC)
    key, write = index_op(clients, part, task, attempt, kill_at, worker, at, speculate_at, backup)
    beat = attempt_op(part, task, attempt, backup, heartbeat=at)
    ops = [write, beat] + ([unindex_op(part, previous)] if previous != key else [])
    try:
        clients.tasks.submit_transaction(ops)
    except TableTransactionError as exc:
        if not is_missing(exc):
            raise
        clients.tasks.submit_transaction([write, beat])
        clear_others(clients, part, task, attempt, worker, keep=key)
    return key


def clear_others(clients: Clients, part: str, task: str, attempt: int, worker: str, keep: str) -> None:
    """Drop every index row ``worker`` wrote for this attempt but ``keep``: a write applied
    but answered with an error leaves a row its worker does not know of, which would
    otherwise revoke the live attempt when it falls due."""
    where, params = _range(names.DEADLINE_PREFIX)
    rows = clients.tasks.query_entities(
        f"PartitionKey eq @pk and {where} and Task eq @task and Attempt eq @attempt and Worker eq @worker",
        parameters={"pk": part, **params, "task": task, "attempt": attempt, "worker": worker}, select=["RowKey"])
    for row in list(rows):
        if row["RowKey"] != keep:
            unindex(clients, part, row["RowKey"])


def unindex(clients: Clients, part: str, key: str) -> None:
    try:
        clients.tasks.delete_entity(part, key)
    except ResourceNotFoundError:
        pass


def clear_indexes(clients: Clients, parts: list[str]) -> int:
    """Remove every deadline and dispatch entry a job still has; for a job whose tasks have
    all ended, where any left is stale (an attempt whose claim's answer was lost and whose
    task was then cancelled, say), and would otherwise stay once the sweep stops looking at
    the job. Returns how many it removed."""
    left = [(row["PartitionKey"], row["RowKey"]) for prefix in (names.DEADLINE_PREFIX, names.DISPATCH_PREFIX)
            for row in partitions.query(clients.tasks, parts, *_range(prefix), select=["PartitionKey", "RowKey"])]
    for part, key in left:
        unindex(clients, part, key)
    return len(left)
