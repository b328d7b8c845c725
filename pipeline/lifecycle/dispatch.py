"""How a QUEUED task gets its message, and keeps getting one until a worker takes it.

The tasks table is the only truth; a queue message is a hint, which may be lost (a send that
failed, a process that died before it sent, a receipt storage forgot), duplicated or
poisoned. So every move of a task into QUEUED writes, in the same entity-group transaction
as the task row, an entry in its partition's *dispatch index*: RK ``~dispatch~{due ms}-{task}``,
due when the task's message should long have been taken (the delay before it is visible,
plus two leases). The task row names its entry (``Dispatch``), and the claim deletes it in
the claim's own transaction: a task is QUEUED exactly while it has an entry.

:func:`send` is the one path by which a task message is sent. The reconciler,
:func:`redispatch_due` (part of the sweep: one key-range query per partition), sends the message
of every task still QUEUED under a due entry again and moves the entry later — twice as far
each time; the claim drops duplicates. A message that may just be waiting behind others is
not sent again: when the message at the front of its shard queue (a peek, one call per shard
and pass) was sent no later than it, give or take a lease, it has not been passed over, and
only its entry moves — up to MAX_DOUBLINGS times, after which it is sent again whatever the
queue holds. Without that look, a deep queue (a big job's release window on few workers)
had every waiting task sent again at each of its doublings: duplicates by the thousand,
each a receive, a read and a delete for nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode

from pipeline.lifecycle import partitions
from pipeline.lifecycle.attempts import Op, unindex
from pipeline.lifecycle.status import TaskStatus
from pipeline.lifecycle.tasks import MESSAGE_TASKS, TaskRef, get_task, if_match, now
from pipeline.storage import names
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)
SEND_THREADS = 8  # concurrent sends of one batch of messages
MAX_DOUBLINGS = 5  # the wait between resends grows to 2^5 × its first length, then stays


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def entry(clients: Clients, part: str, task: str, delay_s: float = 0.0, resends: int = 0) -> tuple[str, Op]:
    """The dispatch-index entry (in partition ``part``) of a task queued now whose message
    becomes visible after ``delay_s``: its row key and the operation that writes it."""
    wait = delay_s + 2 * clients.settings.lease_seconds * 2 ** min(resends, MAX_DOUBLINGS)
    key = names.dispatch_key(_ms(now() + timedelta(seconds=wait)), task)
    return key, ("upsert", {"PartitionKey": part, "RowKey": key, "Task": task}, {"mode": UpdateMode.REPLACE})


def remove_op(part: str, key: str) -> Op:
    return ("delete", {"PartitionKey": part, "RowKey": key})


def queued(clients: Clients, part: str, task: str, delay_s: float = 0.0) -> tuple[dict[str, Any], Op]:
    """What a move into QUEUED writes: the task row's fields, and its index entry's write."""
    key, write = entry(clients, part, task, delay_s)
    return {"status": TaskStatus.QUEUED, "queued_at": now(), "dispatch": key, "resends": 0}, write


def ref_of(row: Any) -> tuple[int, TaskRef]:
    """The shard and message of a task row."""
    return row.shard, row.ref


def send(clients: Clients, messages: Iterable[tuple[int, TaskRef]], delay_s: int = 0, per_message: int = 1) -> int:
    """Send each task message to its shard (visible after ``delay_s``), the attempts of one
    shard and partition up to ``per_message`` to a message (``TaskRef.encode_many``; a
    backup always alone); returns how many attempts' messages went. A send that fails is
    logged and left to the reconciler: each task's dispatch entry falls due and its message
    is sent again."""
    packed = pack(messages, per_message)

    def one(message: tuple[int, list[TaskRef]]) -> int:
        shard, refs = message
        try:
            clients.shard_queues[shard].send_message(TaskRef.body_of(refs), visibility_timeout=delay_s or None)
            return len(refs)
        except Exception as exc:
            log.warning("message of %s/%s not sent (the reconciler will resend it): %s", refs[0].job,
                        ",".join(r.task for r in refs), exc)
            return 0

    if len(packed) <= 1:
        return sum(map(one, packed))
    with ThreadPoolExecutor(min(SEND_THREADS, len(packed))) as pool:
        return sum(pool.map(one, packed))


def pack(messages: Iterable[tuple[int, TaskRef]], per_message: int) -> list[tuple[int, list[TaskRef]]]:
    """``messages`` as messages of up to ``per_message`` attempts (``tasks.MESSAGE_TASKS`` at
    most) of one shard and partition, in the order their first attempt came; a backup alone."""
    size = max(1, min(per_message, MESSAGE_TASKS))
    packed: list[tuple[int, list[TaskRef]]] = []
    filling: dict[tuple[int, str], list[TaskRef]] = {}
    for shard, ref in messages:
        if ref.backup or size == 1:
            packed.append((shard, [ref]))
            continue
        refs = filling.get((shard, ref.partition))
        if refs is None or len(refs) == size:
            refs = filling[(shard, ref.partition)] = []
            packed.append((shard, refs))
        refs.append(ref)
    return packed


def front(clients: Clients, shard: int) -> datetime | None:
    """When the message at the front of a shard queue was sent (None: no message is
    visible there, or the queue could not be read)."""
    try:
        peeked = clients.shard_queues[shard].peek_messages(max_messages=1)
    except Exception as exc:  # then resend, as if the queue had passed it over
        log.info("shard queue %s not peeked: %s", shard, exc)
        return None
    return peeked[0].inserted_on if peeked else None


def waiting(clients: Clients, resends: int, queued_at: datetime | None, first: datetime | None) -> bool:
    """Whether a due task's message may still be waiting behind the message at the front of
    its queue (sent at ``first``): that one was sent no later than it, give or take a lease
    (a release's sends go out over a while after the rows say QUEUED; clocks differ), and
    its entry has not yet moved MAX_DOUBLINGS times."""
    if first is None or queued_at is None or resends >= MAX_DOUBLINGS:
        return False
    return first <= queued_at + timedelta(seconds=clients.settings.lease_seconds)


def due(clients: Clients, parts: list[str], at: datetime) -> list[dict[str, Any]]:
    """The dispatch entries due before ``at`` in a job's partitions ``parts``."""
    return list(partitions.query(clients.tasks, parts, "RowKey ge @lo and RowKey lt @hi",
                                 {"lo": names.DISPATCH_PREFIX, "hi": f"{names.DISPATCH_PREFIX}{_ms(at):015d}"}))


def redispatch_due(clients: Clients, parts: list[str]) -> int:
    """The reconciler's pass over one job (its partitions ``parts``): send again the message
    of every task still QUEUED under a due entry, moving its entry later. Returns how many
    it resent."""
    resend: list[tuple[int, TaskRef]] = []
    fronts: dict[int, datetime | None] = {}
    for found in due(clients, parts, now()):
        part = found["PartitionKey"]
        try:
            row = get_task(clients.tasks, part, found["Task"])
        except ResourceNotFoundError:
            unindex(clients, part, found["RowKey"])
            continue
        if row.status is not TaskStatus.QUEUED or row.dispatch != found["RowKey"]:
            unindex(clients, part, found["RowKey"])  # left by a write older than the entries' rules
            continue
        if row.shard not in fronts:
            fronts[row.shard] = front(clients, row.shard)
        behind = waiting(clients, row.resends, row.queued_at, fronts[row.shard])
        resends = row.resends + 1
        key, write = entry(clients, part, row.task, resends=resends)
        change = row.stored_changes(dispatch=key, resends=resends)
        try:
            clients.tasks.submit_transaction([
                ("update", change, {"mode": UpdateMode.MERGE, **if_match(row.etag)}),
                remove_op(part, found["RowKey"]), write])
        except (TableTransactionError, HttpResponseError) as exc:
            log.info("task %s/%s moved on before its resend: %s", part, row.task, exc)
            continue  # claimed or cancelled meanwhile; or the next pass tries again
        if behind:
            log.info("message of %s/%s (attempt %s) not resent: older ones still wait in its queue", part,
                     row.task, row.attempt)
            continue
        resend.append(ref_of(row))
        log.warning("message of %s/%s (attempt %s) resent: not taken since %s", part, row.task,
                    row.attempt, row.queued_at)
    return send(clients, resend)
