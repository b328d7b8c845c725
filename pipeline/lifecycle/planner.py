"""The planner: expand a job into task rows, settle those whose outputs the cache holds
already, and release the others to the shard queues through a bounded window.

Planning is idempotent: rows are created in entity-group transactions from a cursor kept on
the job row, so a plan message processed twice (or a planner that died midway) makes no
duplicate. Release is safe to call from anywhere at any time (the planner, a worker that
just finished a task, the sweep): every task it moves to QUEUED gets its dispatch entry in
the same write, so a message it fails to send, or a releaser that dies before it sends, is
made good by the reconciler; it advances the cursor after its sends, so a releaser that
dies resends at worst (duplicates, which workers drop). Settling is as safe to repeat: it
moves only PENDING rows, each chunk in one transaction with its counts.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime, timedelta

from azure.core.exceptions import AzureError

from pipeline import planning, stages
from pipeline.lifecycle import completion, dispatch, jobs, partitions, rollups, tasks, transitions
from pipeline.lifecycle.rollups import RollupWriter
from pipeline.lifecycle.status import JobState, TaskStatus
from pipeline.planning import RequestError
from pipeline.storage import names
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)
NO_RELEASER = datetime(1970, 1, 1, tzinfo=UTC)  # a lease that has long expired
RELEASE_CHUNK = 64  # tasks sent per move of the cursor: bounds the work done under one lease
RELEASE_LEASE_S = 15.0  # a releaser's hold on the cursor, renewed at each move
SETTLE_PAGE = 1000  # task rows looked at together for outputs the cache holds already
SEARCH_LEASE = timedelta(minutes=15)  # the longest a planner's catalog searches may take before the sweep plans again


def plan(clients: Clients, job: str) -> None:
    """Create the job's task rows (resuming where a previous run stopped), then start it."""
    row = jobs.get(clients, job)
    if row.state is not JobState.ACCEPTED:
        if row.state is JobState.RUNNING:  # planned already (a message handled twice, a planner died)
            _start(clients, row)
        return
    settings, application = clients.settings, planning.application()
    try:
        specs = application.plan(settings, row.request, row.program, search=False,
                                 limit=max(settings.max_tasks, row.total))
    except RequestError as exc:  # it fitted the deployment when submitted, not any more
        log.warning("job %s cannot be planned: %s", job, exc.message)
        jobs.refuse(clients, row, f"the request cannot be planned: {exc.field}: {exc.message}")
        return
    planned = row.planned
    if planned < len(specs):  # its inputs: the catalog searched (again, if a planner died here)
        try:  # however long the search, the sweep does not take the job for one whose plan was lost
            row = jobs.update(clients, row, planning_until=tasks.now() + SEARCH_LEASE)
        except Exception as exc:
            if not tasks.is_conflict(exc):
                raise
            return plan(clients, job)  # moved meanwhile (cancelled, another planner): look again
        try:
            specs = application.plan(settings, row.request, row.program, search=True,
                                     limit=max(settings.max_tasks, row.total))
        except RequestError as exc:  # its inputs cannot be found (a catalog without its collection)
            log.warning("job %s cannot be planned: %s", job, exc.message)
            jobs.refuse(clients, row, f"the request cannot be planned: {exc.field}: {exc.message}")
            return
        clients.tasks.upsert_entity(rollups.plan_row(job, specs))  # its tiles and totals, for its status
    while planned < len(specs):
        end = min(planned + tasks.BATCH * row.buckets, len(specs))
        made = (tasks.task_entity(names.partition(job, partitions.bucket_of(seq, specs[seq], row.buckets)), seq,
                                  specs[seq], settings.shards) for seq in range(planned, end))
        for _, batch in partitions.chunks(made, lambda entity: entity["PartitionKey"], tasks.BATCH):
            tasks.create_batch(clients.tasks, batch)  # a transaction per partition, a hundred rows at most
        planned = end
        try:
            row = jobs.update(clients, row, planned=planned)
        except Exception as exc:
            if not tasks.is_conflict(exc):
                raise
            row = jobs.get(clients, job)  # cancelled meanwhile, or another planner
            if row.state is not JobState.ACCEPTED:
                break
            planned = max(planned, row.planned)
    if row.state is JobState.ACCEPTED:
        # before the job runs, so that no release (the sweep's, a worker's) can queue a task
        # the cache has made already; a planner that dies here settles again, what is PENDING
        settle(clients, row)
        try:
            row = jobs.update(clients, row, state=JobState.RUNNING, started_at=tasks.now())
        except Exception as exc:
            if not tasks.is_conflict(exc):
                raise
            row = jobs.get(clients, job)
    if row.state is JobState.RUNNING:
        log.info("job %s planned: %d tasks", job, len(specs))
        _start(clients, row)
    else:  # cancelled while it was being planned: nothing it planned may run
        transitions.cancel(clients, row.parts, RollupWriter(f"planner-{job}"))
        jobs.announce_done(clients, job)


def _start(clients: Clients, row: jobs.JobRow) -> None:
    """Start a planned job (its tasks made already settled): announce it done if nothing is
    left to run (every task settled, now or by a planner that died here), else release a
    window of the others (a release cannot end a task: the check is not needed after it),
    or its gathers if only they are left."""
    done = sum(tasks.terminal_counts(clients.tasks, row.parts).values())
    if completion.all_terminal(clients, row, done):
        jobs.announce_done(clients, row.job)
    elif not release_gathers(clients, row, done):
        release(clients, row.job, counts=None)


def release_gathers(clients: Clients, row: jobs.JobRow, done: int) -> int:
    """Release the job's gathers (``planning.TaskPlan.after_all``: its last ``row.gathers``
    tasks) once every other task has ended: ``done``, its count of terminal tasks, reaches
    the count of the others. A job-level barrier kept by the counters the job has already,
    so that a gather, which joins what tasks of every partition made, waits for no counter
    of its own in their partitions. Whoever sees the job then (the worker that ended its
    last task, the sweep's pass, the planner of a job settled whole) calls it: the move
    PENDING → QUEUED is fenced on each row, so a gather is queued once however many call,
    and its dispatch entry, written with the move, has the reconciler send its message if
    this call dies before it does. Returns how many it queued (0 too before the barrier, or
    for a job not running)."""
    if not row.gathers or done < row.first_gather or row.state is not JobState.RUNNING:
        return 0
    pending = [r for r in tasks.list_tasks(clients.tasks, row.parts, row.first_gather, row.gathers)
               if r.status is TaskStatus.PENDING]
    if not pending:
        return 0
    waiting = {r.task for r in pending}
    moved = [r for r in transitions.queue(clients, pending) if r.task in waiting]
    dispatch.send(clients, map(dispatch.ref_of, moved), per_message=clients.settings.tasks_per_message)
    log.info("job %s: every other task ended, %d gathers released", row.job, len(moved))
    return len(moved)


def settle(clients: Clients, row: jobs.JobRow) -> int:
    """Settle at planning (``transitions.settle``: PENDING → CACHED, no message, no worker)
    each task of the job (its ``row``) whose every output the cache holds already (as its
    stage says: ``stages.MADE_ALREADY``, which the application's stages register), a page at
    a time. A storage error here only leaves the tasks to the ordinary way: the stage finds
    them made. Returns how many."""
    planning.application()  # its stages' checks registered
    stages.load(clients.settings.stage_modules)
    settled, job, tiles = 0, row.job, row.tiles
    # the tasks that wait first (a climatology a job before this one made: the tile tasks it
    # waits for, settled first, would queue it), then those the window releases
    pages = [*range(tiles, row.total, SETTLE_PAGE), *range(0, tiles, SETTLE_PAGE)]
    checked = set(stages.MADE_ALREADY)
    try:
        while pages:
            first = pages.pop(0)
            end = row.total if first >= tiles else tiles
            rows = tasks.list_tasks(clients.tasks, row.parts, first, min(SETTLE_PAGE, end - first))
            if first >= tiles and not {r.stage for r in rows} & checked:
                # a plan lists its waiting tasks that a cache may hold (climatologies) before
                # those it cannot (reductions): the rest is left to run, as unsettled tasks are
                pages = [p for p in pages if p < tiles]
                continue
            made: dict[str, list[str]] = {}
            for stage in sorted({r.stage for r in rows} & set(stages.MADE_ALREADY)):
                made |= stages.MADE_ALREADY[stage](clients, rows)
            settled += transitions.settle(clients, rows, made)
    except AzureError as exc:
        log.warning("job %s: tasks left to run as they are (%d settled at planning): %s", job, settled, exc)
    if settled:
        log.info("job %s: %d tasks made already, settled at planning", job, settled)
    return settled


def release(clients: Clients, job: str, *, min_room: float = 0.0, row: jobs.JobRow | None = None,
            counts: Counter[str] | None = None) -> int:
    """Top up the job's window: release PENDING tasks to the shard queues until the tasks
    QUEUED or RUNNING (``tasks.in_flight``) fill the window; the cursor passes over tasks
    settled at planning (terminal, never queued), which take no place in it. The room is
    counted once a call: a release that counted again after each chunk chased a window
    draining as fast as it sent, a few tasks a chunk, each chunk a read of the job's counts
    and of its rows in every partition, its messages a few tasks each; the next look tops up
    what drained meanwhile. A job whose every task has ended (all settled at planning) is
    left as it is: the sweep's walk of its cursor changed its row under the finisher, and
    kept the sweep from finding it still. With ``min_room`` > 0 it does nothing until that
    share of the window has drained (so it is cheap to call after every task). Returns how
    many tasks it released.

    One releaser at a time per job holds a short lease on the job row (``ReleaserUntil``),
    so that the workers finishing tasks together do not all send the same messages. It moves
    the cursor a chunk at a time and renews the lease with each move, so however slow the
    storage, a live releaser keeps its lease and its sends count. A releaser that dies
    leaves the lease to expire; its successor resends what it may not have sent
    (duplicates, which workers drop). ``row`` and ``counts`` (the job row and its
    ``tasks.state_counts``) spare the first reads when the caller has just made them."""
    window = clients.settings.window
    lease = timedelta(seconds=max(RELEASE_LEASE_S, clients.settings.lease_seconds))
    total_released = 0
    row = row if row is not None else jobs.get(clients, job)
    holding = False
    room: int | None = None
    filled = 0  # places of the window this call's sends took (PENDING rows it queued)
    while True:
        if row.state is not JobState.RUNNING:
            break
        released, total = row.released, row.tiles
        holder = row.releaser_until
        if released >= total or (not holding and holder is not None and holder > tasks.now()):
            break
        if room is None:
            counts = counts if counts is not None else tasks.state_counts(clients.tasks, row.parts)
            if completion.all_terminal(clients, row, sum(tasks.terminal_of(counts).values())):
                break  # all settled at planning: a walk of the cursor would send nothing, only move the row
            room = window - tasks.in_flight(counts)
            if room <= 0 or room < window * min_room:
                break
        count = min(room - filled, total - released, RELEASE_CHUNK)
        if count <= 0:
            break
        try:
            if not holding:
                row = jobs.update(clients, row, releaser_until=tasks.now() + lease)
                holding = True
            listed = tasks.list_tasks(clients.tasks, row.parts, released, count)
            queued = transitions.queue(clients, listed)
            dispatch.send(clients, map(dispatch.ref_of, queued), per_message=clients.settings.tasks_per_message)
            # The cursor moves only after the sends, and renews the lease as it moves.
            row = jobs.update(clients, row, released=released + count, releaser_until=tasks.now() + lease)
        except Exception as exc:
            if tasks.is_conflict(exc):
                return total_released  # another releaser holds it now, or the job was cancelled
            raise
        total_released += count
        filled += sum(1 for r in listed if r.status is TaskStatus.PENDING)  # not a resend's, already counted
    if holding:
        try:
            jobs.update(clients, row, releaser_until=NO_RELEASER)
        except Exception as exc:
            if not tasks.is_conflict(exc):
                raise
    return total_released
