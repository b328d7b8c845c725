"""The storage calls bagpipe makes, as the scale model's table (``bench.sim.core.Call`` rows).

``TODAY`` is the code as it stands (worker/runner.py, inbox.py, delivery.py, readahead.py,
handout.py, lease.py, commits.py; pipeline/lifecycle/ends.py, transitions.py, dispatch.py, planner.py,
completion.py, sweep.py, tasks.py, runtimes.py): cut a call there, cut its row here, and
``make bench NAME=scale`` predicts the difference. ``PLANNED`` is the planned layout as a
what-if (partitions per job, counters and rollups read at constant cost, claims and commits
grouped, deletes batched): a prediction of what it buys, not a description of code.

Cost kinds (measured on the local stack by ``bench.sim.scale_calibrate``): ``get`` (a point
read), ``query`` (a key-range read, per entity too), ``txn`` (an entity-group transaction,
per entity too), ``update`` (a conditional update), ``send``, ``receive`` (per message
too), ``delete`` (a message), ``renew`` (a message's visibility), ``blob`` (counted and
priced only: a stage's transfers are inside its runtime).
"""

from __future__ import annotations

from collections.abc import Mapping

from bench.sim.core import (
    ALL,
    BEAT,
    BLOB,
    CLAIM,
    END,
    FETCH,
    FINISH,
    JOB,
    LOOK,
    PLAN,
    QUEUE,
    RELEASE,
    RUNTIMES,
    SWEEP,
    TASK,
    Call,
)

Q = Mapping[str, float]
RUNTIME_FLUSH_S = 5.0  # pipeline.lifecycle.runtimes.RuntimeBook: reads and merges at most this often per worker


def _per_book(q: Q) -> float:
    """A worker reads (and merges) a runtime history at most every 5 s: per task, the
    smaller of 1 and 1 / (5 s × the worker's tasks per second)."""
    return min(1.0, 1.0 / (RUNTIME_FLUSH_S * q["worker_tasks_per_s"]))


def _if_reductions(q: Q) -> float:
    return 1.0 if q["reductions"] else 0.0


def _received_ahead(q: Q) -> bool:
    """Whether workers receive a slot's worth of messages ahead (attempts under a second,
    runner.AHEAD_BELOW_S): then a receive brings several, and their rows come in one query
    (worker.readahead) in place of a read per claim."""
    return q["worker_tasks_per_s"] > q["slots"]


def _per_message(q: Q) -> float:
    """The attempts a message names, on average: a release packs BAGPIPE_TASKS_PER_MESSAGE of
    one shard and partition; while attempts are long, a worker runs one and gives the rest
    back one a message (worker.inbox), so a task then costs about a send and a delete."""
    return float(q["tasks_per_message"]) if _received_ahead(q) else 1.0


def _together(q: Q) -> float:
    """The attempts one claim transaction moves, while attempts are short: those of a
    message that go to free slots at once (transitions.claim_many); and so the commits that
    end together (worker.commits). Else one."""
    return min(q["slots"], _per_message(q)) if _received_ahead(q) else 1.0


def _counter_rows(q: Q) -> float:
    """The rollup rows a read of a job's counts reads, in each partition: the folded row, and
    a row per writer that wrote there lately (pipeline.lifecycle.rollups.fold: the sweep
    folds a row its writer has left alone for FOLD_IDLE_S). A slot writes a partition at each
    claim and commit of a task there, and spreads its tasks over all of them: in the fold's
    window it makes ``2 × window × its tasks per second`` writes, so while tasks are short
    every writer has a row in every partition, and while they take minutes few do."""
    writes = 2 * q["fold_window_s"] * q["worker_tasks_per_s"] / q["slots"]
    touched = 1 - (1 - 1 / q["partitions"]) ** writes
    return q["partitions"] * (1 + q["writers"] * touched)


TILE_KINDS = ("reprojection",)  # kinds whose stage moves blobs (the no-op stage moves none)
TODAY: tuple[Call, ...] = (
    # the planner (pipeline.lifecycle.planner.plan): rows 100 to a transaction, the cursor on the job row
    Call("plan: create task rows", "txn", TASK, PLAN, 1 / 100, 100),
    Call("plan: job row cursor", "update", JOB, PLAN, 1 / 100),
    # a release (planner.release), 64 tasks a chunk: its lease and cursor on the job row, the
    # PENDING rows read, moved to QUEUED with their dispatch entries 50 to a transaction, sent
    # by 8 threads; its room counted once, from the counts its caller read (a look, the sweep)
    Call("release: job row lease and cursor", "update", JOB, RELEASE, 3 / 64),
    Call("release: read PENDING rows", "query", TASK, RELEASE, 1 / 64, 64),
    Call("release: QUEUED + dispatch entries", "txn", TASK, RELEASE, 1 / 50, 100),
    Call("release: send message", "send", QUEUE, RELEASE, lambda q: 1 / _per_message(q), 1, lanes=8),
    # a worker's receive (up to 32 messages)
    Call("receive messages", "receive", QUEUE, FETCH, 1, 32),
    # a slot's attempt (Worker.handle, transitions.claim or claim_many / ends.end, Delivery.settle)
    Call("runtime history read", "get", RUNTIMES, CLAIM, _per_book),
    Call("claim: read task row", "get", TASK, CLAIM, lambda q: 0.0 if _received_ahead(q) else 1.0),
    # a receive of a slot's worth: their rows in one key-range query (a shard holds every shards-th task)
    Call("claim: task rows read ahead", "query", TASK, CLAIM,
         lambda q: 1.0 / max(q["slots"], _per_message(q)) if _received_ahead(q) else 0.0,
         lambda q: max(q["slots"], _per_message(q)) * q["shards"]),
    Call("claim: task rows, attempts, deadline and dispatch entries", "txn", TASK, CLAIM,
         lambda q: 1 / _together(q), lambda q: 4 * _together(q) + 1),
    Call("stage: cache check, sources read", "blob", BLOB, CLAIM, 9, kinds=TILE_KINDS),
    Call("stage: output written", "blob", BLOB, END, 6, kinds=TILE_KINDS),
    Call("reduction: tiles read", "blob", BLOB, CLAIM, lambda q: q["tiles_per_reduction"], kinds=("reduction",)),
    Call("reduction: products and logs written", "blob", BLOB, END, 3, kinds=("reduction",)),
    # the commit's transaction counts the task off its reduction's row too (rollups, counters); one
    # that does not (no reductions) shares its transaction with the worker's commits that come with it
    Call("commit: task row, attempt, deadline entry, counter", "txn", TASK, END,
         lambda q: 1.0 if q["reductions"] else 1 / _together(q),
         lambda q: 5.0 if q["reductions"] else 3 * _together(q) + 1),
    Call("delete message", "delete", QUEUE, END, lambda q: 1 / _per_message(q)),
    Call("runtime history merge: read", "get", RUNTIMES, END, _per_book),
    Call("runtime history merge: write", "update", RUNTIMES, END, _per_book),
    # the tile task whose commit counts its reduction's last tile off sends the reduction's message
    Call("reduction release: send message", "send", QUEUE, END,
         lambda q: _if_reductions(q) / max(1.0, q["tiles_per_reduction"]), kinds=TILE_KINDS),
    # progress.Watch.task_ended's look at the job: its row, and every writer's counter row
    Call("look: job row", "get", JOB, LOOK),
    Call("look: counter rows", "query", ALL, LOOK, 1, _counter_rows),
    # the lease every third of it (Lease._run): renew, still held?, move the deadline entry
    Call("heartbeat: renew message", "renew", QUEUE, BEAT),
    Call("heartbeat: read task row", "get", TASK, BEAT),
    Call("heartbeat: move deadline entry", "txn", TASK, BEAT, 1, 3),
    # the sweep, per job per pass (sweep._sweep_job): job row (three times), overdue and due
    # entries, counters (release), the fold; reductions are released by their last tile's commit
    Call("sweep: job row", "get", JOB, SWEEP, 3),
    Call("sweep: overdue deadline entries", "query", ALL, SWEEP),
    Call("sweep: due dispatch entries", "query", ALL, SWEEP),
    Call("sweep: counter rows", "query", ALL, SWEEP, 1, _counter_rows),
    # its fold (rollups.fold): the rollup rows again, a transaction when enough went quiet
    Call("sweep: fold, counter rows", "query", ALL, SWEEP, 1, _counter_rows),
    # the finisher (completion.write_manifest): every task row, pages of 1,000
    Call("completion: list task rows", "query", ALL, FINISH, 1 / 1000, 1000),
    Call("completion: manifest written", "blob", BLOB, FINISH, 1 / 1000),
)

_CUT = {  # counts from a bounded rollup; claims and commits grouped per worker
    "look: counter rows", "sweep: counter rows", "sweep: fold, counter rows",
    "claim: read task row", "claim: task rows read ahead", "claim: task rows, attempts, deadline and dispatch entries",
    "commit: task row, attempt, deadline entry, counter",
}


def _per_group(q: Q) -> float:
    return 1.0 / q["slots"]


PLANNED: tuple[Call, ...] = (
    *(c for c in TODAY if c.op not in _CUT),
    Call("claim (grouped): read task rows", "query", TASK, CLAIM, _per_group, lambda q: q["slots"]),
    Call("claim (grouped): task rows, attempts, deadline and dispatch entries", "txn", TASK, CLAIM, _per_group,
         lambda q: 4 * q["slots"]),
    Call("commit (grouped): task rows, attempts, deadline entries, counter", "txn", TASK, END, _per_group,
         lambda q: 3 * q["slots"] + 1),
    Call("look: rollup row per partition", "query", ALL, LOOK, 1, lambda q: q["partitions"]),
    Call("sweep: rollup row per partition", "query", ALL, SWEEP, 1, lambda q: q["partitions"]),
)
