"""Dependencies as counters: a task that waits (a reduction) counts its unfinished
dependencies on its row (``deps``, set at planning), and each task that ends counts itself
off every task it feeds (``planning.TaskPlan.feeds``) in the transaction of its own move
(the planner puts them in one partition: ``pipeline.lifecycle.partitions``), fenced on the
waiting row's ETag; the end that brings a count to zero moves that task to QUEUED, with its
dispatch entry, in that same transaction. Nothing is listed again as tasks end.

The moves are ``pipeline.lifecycle.transitions``'s: this module only builds the operations
a move adds for the reduction waiting on its task.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from azure.core.exceptions import ResourceNotFoundError

from pipeline import planning
from pipeline.lifecycle import dispatch
from pipeline.lifecycle.attempts import Op
from pipeline.lifecycle.rollups import Moves
from pipeline.lifecycle.status import TaskStatus, transition
from pipeline.lifecycle.tasks import TaskRef, get_task, tile_of, update_op
from pipeline.storage import names
from pipeline.storage.clients import Clients

CONFLICTS = 50  # writes retried because another tile task of the same reduction ended at once


def waiting(params: dict[str, str], status: TaskStatus) -> tuple[str, ...]:
    """The row keys of the tasks a task moving into ``status`` is to be counted off (those
    its plan says it feeds: ``planning.TaskPlan.feeds``); none unless the move ends it."""
    return tuple(names.task_key(seq) for seq in planning.feeds_of(params)) if status.terminal else ()


def counted_off(clients: Clients, part: str, keys: Sequence[str],
                ended: int = 1) -> tuple[list[Op], Moves, list[tuple[int, TaskRef]], str]:
    """What counts ``ended`` tasks (of partition ``part``) off each PENDING task of ``keys``
    (of the same partition) that waits for them: the update of its count of unfinished
    dependencies (fenced on the row's ETag, read now) and, if those were the last, its move
    to QUEUED with its dispatch entry; the moves of that for the rollup; the messages to
    send once written; and the ETags it read, as one version ("" if nothing is to be
    counted: a waiting task cancelled, or gone)."""
    ops: list[Op] = []
    moves, messages, versions = Moves(), list[tuple[int, TaskRef]](), list[str]()
    for key in keys:
        try:
            row = get_task(clients.tasks, part, key)
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
