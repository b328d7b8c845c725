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

This module says when a backup is asked for. The moves — the ask, the backup's claim, its
end — are ``pipeline.lifecycle.transitions``'s, and what an end makes of the task is
``pipeline.lifecycle.policy.decide``'s, as for any attempt.
"""

from __future__ import annotations

from pipeline.lifecycle import rollups, transitions
from pipeline.lifecycle.attempts import Deadline
from pipeline.lifecycle.jobs import JobRow
from pipeline.lifecycle.rollups import RollupWriter
from pipeline.lifecycle.status import TaskStatus
from pipeline.lifecycle.tasks import now
from pipeline.storage.clients import Clients


def consider(clients: Clients, writer: RollupWriter, job: JobRow, due: list[Deadline]) -> int:
    """The monitor's step for the running attempts of ``job`` whose entries fell due only
    for a backup (``due``): at the job's tail, ask for a backup of each, the longest past
    its time first, while the job's backups stay within its share (moving ``writer``'s
    rollup); past the share, only look again at those asked for already. Returns how many
    it asked for."""
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
            asked += transitions.ask_backup(clients, writer, entry)
        else:
            transitions.ask_backup_again(clients, entry)
    return asked
