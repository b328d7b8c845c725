"""Task rows and their messages: the queue message that names an attempt, the rows'
creation and reading, and the job's counts summed from its rollups.

The tasks table is the source of truth (PK = the job's partition the task is in, RK =
zero-padded sequence: ``pipeline.lifecycle.partitions``). Every change of a task's state is
a conditional update on its ETag, made by one of the named operations of
``pipeline.lifecycle.transitions``, and every move is written in one entity-group
transaction with its writer's own rollup row (``rollups.RollupWriter``), so "how many tasks
are in each state" is exact and cheap.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError
from azure.data.tables import TableClient, TableEntity, TableTransactionError, UpdateMode

from pipeline import planning
from pipeline.failures import error_code
from pipeline.lifecycle import partitions, rollups
from pipeline.lifecycle.status import MADE, TERMINAL, TaskStatus
from pipeline.planning import TaskPlan
from pipeline.storage import names
from pipeline.storage.rows import Row, stored

BATCH = 100  # entities per entity-group transaction (the service's limit)
MESSAGE_TASKS = 24  # the most attempts one task message names: their claims (4 writes each) fit a transaction


def now() -> datetime:
    return datetime.now(UTC)


def if_match(etag: str) -> dict[str, Any]:
    return {"etag": etag, "match_condition": MatchConditions.IfNotModified}


def update_op(part: str, task: str, etag: str, **fields: Any) -> tuple[Any, ...]:
    """A merge of ``fields`` (by TaskRow field name) into the task row ``task`` of partition
    ``part``, fenced on ``etag``: one operation of an entity-group transaction."""
    return ("update", {"PartitionKey": part, "RowKey": task, **TaskRow.as_stored(**fields)},
            {"mode": UpdateMode.MERGE, **if_match(etag)})


def tile_of(params: str | dict[str, str]) -> str:
    """The target tile a task's parameters (stored or parsed) name ("" for none)."""
    return str((json.loads(params) if isinstance(params, str) else params).get("tile", ""))


def etag_of(row: TableEntity) -> str:
    """The ETag a row was read with: the condition of the next write to it."""
    etag = row.metadata["etag"]
    if etag is None:
        raise ValueError(f"row {row.get('RowKey')} was not read from storage: it has no ETag")
    return etag


def is_conflict(exc: Exception) -> bool:
    """Whether a conditional write failed because the row had changed (HTTP 412; in a
    transaction, the failed operation's ``UpdateConditionNotSatisfied``)."""
    return getattr(exc, "status_code", None) == 412 or error_code(exc) == "UpdateConditionNotSatisfied"


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
    """What a task queue message says: which attempt of which task to run (``backup``: a
    second copy of that attempt, which the monitor asks for at a job's tail while the first
    still runs; the first of the two to commit ends the task), and the job's partition its
    rows are in (``part``; "" for the job's first, named as the job)."""

    job: str
    task: str
    attempt: int
    backup: bool = False
    part: str = ""

    @classmethod
    def of(cls, part: str, task: str, attempt: int, backup: bool = False) -> TaskRef:
        """The message of an attempt of the task ``task`` of partition ``part``."""
        job = names.job_of(part)
        return cls(job, task, attempt, backup, "" if part == job else part)

    @property
    def partition(self) -> str:
        """The PartitionKey of the task's rows."""
        return self.part or self.job

    def encode(self) -> bytes:
        body: dict[str, str | int | bool] = {"job": self.job, "task": self.task, "attempt": self.attempt}
        return json.dumps(body | ({"backup": True} if self.backup else {}) | ({"part": self.part} if self.part
                                                                             else {})).encode()

    @staticmethod
    def body_of(refs: list[TaskRef]) -> bytes:
        """The body of one message naming the attempts ``refs``: an attempt's own
        (:meth:`encode`) if it is alone, else theirs together (:meth:`encode_many`)."""
        return refs[0].encode() if len(refs) == 1 else TaskRef.encode_many(refs)

    @staticmethod
    def encode_many(refs: list[TaskRef]) -> bytes:
        """One message naming the attempts ``refs`` (2 to MESSAGE_TASKS of one partition,
        none a backup): ``{job, tasks: [[task, attempt], ...][, part]}``. A worker claims
        them together, and a task costs a share of a send, a receive and a delete."""
        first = refs[0]
        if not 2 <= len(refs) <= MESSAGE_TASKS or any(r.backup or r.partition != first.partition for r in refs):
            raise ValueError(f"a message names 2 to {MESSAGE_TASKS} attempts of one partition, no backup")
        body: dict[str, Any] = {"job": first.job, "tasks": [[r.task, r.attempt] for r in refs]}
        return json.dumps(body | ({"part": first.part} if first.part else {})).encode()

    @classmethod
    def decode(cls, content: bytes | str) -> TaskRef:
        """Parse a message body naming one attempt; ValueError for anything that is not a
        task reference."""
        return cls._checked(_body(content))

    @classmethod
    def decode_all(cls, content: bytes | str) -> list[TaskRef]:
        """The attempts a message names: one, or several (:meth:`encode_many`); ValueError
        for anything else, or for a list with any entry amiss."""
        body = _body(content)
        if not (isinstance(body, dict) and "tasks" in body):
            return [cls._checked(body)]
        if set(body) - {"part"} != {"job", "tasks"}:
            raise ValueError("a message of several tasks is {job, tasks[, part]}")
        listed = body["tasks"]
        if not (isinstance(listed, list) and 2 <= len(listed) <= MESSAGE_TASKS
                and all(isinstance(pair, list) and len(pair) == 2 for pair in listed)):
            raise ValueError(f"tasks is a list of 2 to {MESSAGE_TASKS} [task, attempt] pairs")
        part = {"part": body["part"]} if "part" in body else {}
        refs = [cls._checked({"job": body["job"], "task": task, "attempt": attempt} | part) for task, attempt in listed]
        if len({r.task for r in refs}) != len(refs):
            raise ValueError("a message names a task twice")
        return refs

    @classmethod
    def _checked(cls, body: Any) -> TaskRef:
        if not isinstance(body, dict) or set(body) - {"backup", "part"} != {"job", "task", "attempt"}:
            raise ValueError("a task message is {job, task, attempt[, backup][, part]}")
        job, task, attempt = body["job"], body["task"], body["attempt"]
        backup, part = body.get("backup", False), body.get("part", "")
        if not (isinstance(job, str) and isinstance(task, str) and type(attempt) is int and type(backup) is bool
                and isinstance(part, str)):
            raise ValueError("job, task and part are strings, attempt an integer, backup a boolean")
        if not (names.JOB_KEY.fullmatch(job) and len(task) == names.TASK_KEY_WIDTH
                and task.isascii() and task.isdigit()):
            raise ValueError("malformed job or task key")
        if part and (part == job or not names.is_partition_of(part, job)):
            raise ValueError("part is not one of the job's partitions")
        if not 1 <= attempt <= 1000:
            raise ValueError("attempt out of range")
        return cls(job, task, attempt, backup, part)


def _body(content: bytes | str) -> Any:
    try:
        return json.loads(message_bytes(content))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None


# --- the row --------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class TaskRow(Row):
    """A task's row (PK = its job's partition, RK = zero-padded sequence), with the ETag it
    was read with. Its state changes only through ``pipeline.lifecycle.transitions``."""

    part: str = field(metadata=stored("PartitionKey"))
    task: str = field(metadata=stored("RowKey"))
    seq: int
    shard: int  # the queue its messages go to
    stage: str
    params: str  # the stage's parameters, as JSON
    status: TaskStatus = TaskStatus.PENDING
    attempt: int = 1  # the attempt the row names: the running one, or the next
    deps: int | None = None  # a reduction: its tile tasks not yet ended (released at zero)
    dispatch: str = ""  # while QUEUED: its entry in the dispatch index
    queued_at: datetime | None = None
    resends: int = 0  # messages the reconciler sent again for this attempt
    worker: str = ""  # who runs the attempt
    started_at: datetime | None = None
    ended_at: datetime | None = None
    settled_at: datetime | None = None  # settled at planning: its outputs were made already
    runtime_s: float | None = None  # the committed attempt's
    outputs: str = ""  # the committed attempt's output names, as a JSON list
    last_failure: str = ""  # the failure class of the last failed attempt
    last_error: str = ""
    timeouts: int = 0  # attempts revoked for time: the next kill threshold grows with them
    last_write: str = ""  # a fenced write's mark, to recognise it when read back
    etag: str = field(default="", compare=False)
    written: ClassVar[frozenset[str]] = frozenset({"status", "attempt"})  # a new row says both

    @property
    def job(self) -> str:
        return names.job_of(self.part)

    @property
    def ref(self) -> TaskRef:
        """The message that names the attempt this row names."""
        return TaskRef.of(self.part, self.task, self.attempt)

    def parameters(self) -> dict[str, str]:
        found: dict[str, str] = json.loads(self.params)
        return found

    def output_names(self) -> list[str]:
        found: list[str] = json.loads(self.outputs or "[]")
        return found

    def places(self) -> list[tuple[dict[str, str], TaskStatus, list[str]]]:
        """The row as a task of each of its places alone would be (``planning.places``): its
        parameters, its status and the outputs it made there (none unless it ended well). A
        place of a task that ended well, whose catalog had none of the MODIS tiles it
        covers, ended NO_DATA there; a task of one place: itself."""
        params, made = self.parameters(), self.output_names() if self.status in MADE else []
        several = "," in params.get("tile", "")
        found = []
        for place in planning.places(params):
            status = self.status
            if several and status in MADE and place.get("granules") == "{}":
                status = TaskStatus.NO_DATA
            found.append((place, status, planning.outputs_of(made, place.get("tile", ""), several)))
        return found


# --- creation ----------------------------------------------------------------------------
def task_entity(part: str, seq: int, plan: TaskPlan, shards: int) -> dict[str, Any]:
    """The new row of task ``seq`` of a job, planned as ``plan``, in partition ``part``."""
    return TaskRow(part=part, task=names.task_key(seq), seq=seq, shard=seq % shards, stage=plan.stage,
                   params=json.dumps(plan.stored_params()), deps=plan.waits_for or None).to_entity()


def create_batch(tasks: TableClient, entities: list[dict[str, Any]]) -> int:
    """Create up to BATCH task rows of one partition, atomically when none exists yet; rows that
    already exist (a plan message processed twice, a planner that died) are left as they
    are. Returns how many rows this call created."""
    try:
        tasks.submit_transaction([("create", e) for e in entities])
        return len(entities)
    except TableTransactionError as exc:
        if error_code(exc) != "EntityAlreadyExists":
            raise
    created = 0
    for entity in entities:
        try:
            tasks.create_entity(entity)
            created += 1
        except ResourceExistsError:
            pass
    return created


def state_counts(tasks: TableClient, parts: list[str]) -> Counter[str]:
    """How many of a job's tasks (in its partitions ``parts``) are in each counted state —
    QUEUED, RUNNING and the terminal ones (``rollups.UNCOUNTED`` are not) — summed over the
    counter rows."""
    totals: Counter[str] = Counter()
    for row in rollups.rows(tasks, parts):
        for status in TaskStatus:
            totals[status.value] += int(row.get(status.value, 0))
    return totals


def terminal_of(counts: Counter[str]) -> dict[str, int]:
    """Of a job's ``state_counts``, those of the terminal states."""
    return {s.value: counts[s.value] for s in TERMINAL}


def terminal_counts(tasks: TableClient, parts: list[str]) -> dict[str, int]:
    """How many of a job's tasks are in each terminal state (sum of the counter rows)."""
    return terminal_of(state_counts(tasks, parts))


def in_flight(counts: Counter[str]) -> int:
    """Of a job's ``state_counts``, how many tasks hold a place in its window: those QUEUED
    (a message names them) or RUNNING. A task settled at planning never held one."""
    return counts[TaskStatus.QUEUED.value] + counts[TaskStatus.RUNNING.value]


def get_task(tasks: TableClient, part: str, task: str) -> TaskRow:
    """The row of task ``task`` in partition ``part``; ResourceNotFoundError if there is none."""
    return TaskRow.from_entity(tasks.get_entity(part, task))


def list_tasks(tasks: TableClient, parts: list[str], first: int = 0, count: int | None = None) -> list[TaskRow]:
    """Task rows of a job (in its partitions ``parts``) in sequence order, from ``first``
    (``count`` of them, or all): a key range in each partition."""
    high = names.task_key(first + count) if count is not None else names.TASK_KEYS_END
    rows = partitions.query(tasks, parts, "RowKey ge @lo and RowKey lt @hi", {"lo": names.task_key(first), "hi": high})
    return sorted((TaskRow.from_entity(row) for row in rows), key=lambda row: row.seq)


def ranges_of(text: str) -> list[tuple[int, int]]:
    """A waiting task's dependencies as its params write them: ``first,count`` ranges of
    sequence numbers, ``;``-separated."""
    return [(int(first), int(count)) for first, count in (r.split(",") for r in text.split(";") if r)]


def list_ranges(tasks: TableClient, part: str, ranges: list[tuple[int, int]]) -> list[TaskRow]:
    """The task rows of partition ``part`` in the sequence ``ranges`` ((first, count) each): a
    key range each, in sequence order."""
    found = [row for first, count in ranges for row in list_tasks(tasks, [part], first, count)]
    return sorted(found, key=lambda row: row.seq)
