"""Dependencies as counters: a reduction's row counts its unfinished tile tasks (``deps``,
set at planning), and each tile task that ends counts itself off in the transaction of its
own move (the planner puts them in one partition: ``pipeline.lifecycle.partitions``),
fenced on the reduction row's ETag; the end that
brings the count to zero moves the reduction to QUEUED, with its dispatch entry, in that
same transaction. Nothing is listed again as tile tasks end.

The moves are ``pipeline.lifecycle.transitions``'s: this module only builds the operations
a move adds for the reduction waiting on its task.
"""

from __future__ import annotations

from typing import Any

from azure.core.exceptions import ResourceNotFoundError

from pipeline.lifecycle import dispatch
from pipeline.lifecycle.attempts import Op
from pipeline.lifecycle.rollups import Moves
from pipeline.lifecycle.status import TaskStatus, transition
from pipeline.lifecycle.tasks import TaskRef, get_task, tile_of, update_op
from pipeline.storage import names
from pipeline.storage.clients import Clients

CONFLICTS = 50  # writes retried because another tile task of the same reduction ended at once


def waiting(params: dict[str, str], status: TaskStatus) -> str:
    """The row key of the reduction a tile task moving into ``status`` is to be counted off."""
    return names.task_key(int(params["reduction"])) if status.terminal and params.get("reduction") else ""


def counted_off(clients: Clients, part: str, key: str,
                 ended: int = 1) -> tuple[list[Op], Moves, tuple[int, TaskRef] | None, str]:
    """What counts ``ended`` tile tasks (of partition ``part``) off the PENDING reduction
    ``key`` of the same partition: the update of its
    count of unfinished tile tasks (fenced on the row's ETag, read now) and, if those were
    the last, its move to QUEUED with its dispatch entry; the moves of that for the rollup;
    the message to send once written; and the ETag it read ("" if nothing is to be counted)."""
    if not key:
        return [], Moves(), None, ""
    try:
        row = get_task(clients.tasks, part, key)
    except ResourceNotFoundError:
        return [], Moves(), None, ""
    if row.status is not TaskStatus.PENDING or row.deps is None:
        return [], Moves(), None, ""  # cancelled, or planned before reductions counted
    fields: dict[str, Any] = {"deps": row.deps - ended}
    ops: list[Op] = []
    moves, message = Moves(), None
    if fields["deps"] <= 0:
        queued, write = dispatch.queued(clients, part, key)
        fields |= queued
        ops.append(write)
        moves.move(row.stage, tile_of(row.params), row.status, transition(row.status, TaskStatus.QUEUED))
        message = (row.shard, row.ref)
    return [update_op(part, key, row.etag, **fields), *ops], moves, message, row.etag
