"""Worker health: find the slow machine, the ModisAzure paper's real straggler.

A slow VM slows every task it runs; killing each of its attempts in turn at 4× the mean
learns nothing from it. So each worker reports, every few seconds while it holds work, how
its latest attempts compare with their history — the ratio of each attempt's seconds to
the mean for its work (``runtimes``), a running attempt counting with the time it has run
so far, one revoked for time as at least ``slow_ratio`` — and the monitor's sweep compares
the workers: one whose recent ratio (the least of its last few attempts': all of them
slow) is at least ``slow_ratio`` times the others' median (or times 1, if they run faster than their
history) is marked slow. In the same pass the monitor takes from it the attempts it runs (each
goes back to the queue at once, a transient ``worker_slow`` failure, for a healthy worker
to run: ``monitor.revoke_slow``); the worker, at its next report, takes no more tasks,
gives up whatever it still holds and exits with REPLACE_EXIT, so that a fresh one replaces
it: the local stack starts another; in Azure the Container Apps job retries the replica (a
new one) and its event scaler starts new executions while the queues hold work.

A machine that barely runs the worker at all (its CPU stolen, throttled or stopped) shows
sooner than any attempt can: the worker's own probe naps a few milliseconds again and
again, and the wall time the naps took over the time they asked for (its stall,
``worker.pace``) counts as its ratio once it is STALL_FLOOR or more; the worker reports
at once when it gets there, not at its next round.

Marking is relative and bounded: never when the others are slow too (storage slowed down
or the whole deployment overloaded is no machine's fault), and never more than a third
of the workers heard from at once (one, if there are fewer than six).

The ``workerhealth`` table holds one row per worker (PartitionKey ``w``): the worker writes its
figures (a merge that never touches ``State``), and at its start how it confines scientists'
programs (``Sandbox``: ``pipeline.reduction.sandbox.Mode.describe``, "none: …" where it refuses to
run them); the monitor writes ``State``.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from azure.data.tables import UpdateMode

from pipeline.lifecycle.tasks import now
from pipeline.storage import names
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)

PARTITION = "w"
HEALTHY, SLOW = "healthy", "slow"
STOPPED, REPLACED = "stopped", "replaced"  # how a worker left: stopped (idle, told to), or drained to be replaced
REPORT_EVERY_S = 1.0  # a worker holding attempts reports this often
RECENT = 6  # ratios of ended attempts a worker keeps
HEARD_WITHIN = timedelta(seconds=30)  # a worker not heard from for this long is not compared
FORGET_AFTER = timedelta(days=1)  # a worker row this old is deleted by the sweep
MAX_SLOW_SHARE = 1 / 3  # of the workers heard from, at most this many slow at once
# a drained worker's exit status (EX_TEMPFAIL): "replace me" — the local stack starts a fresh
# worker; a Container Apps job retries the replica (replicaRetryLimit), a new one
REPLACE_EXIT = 75
SLOWNESS = ("execution_timeout", "worker_slow")  # attempts ended for being slow
# a worker's stall counts from this: run a third of the time or less (the machine's load, shared by
# every worker, makes the stalls of all of them rise together: the comparison with the others discounts it)
STALL_FLOOR = 3.0


def recent_ratio(ended: list[float], running: list[float], slots: int) -> float | None:
    """A worker's recent ratio: the least of its latest ``slots`` ended attempts', or of
    the ones it runs now (each at least as slow as it has run so far) if that is higher.
    A slow machine slows every attempt it runs, so all of them show it, as soon as those it
    runs now do, and still while its new attempts are young; tasks slow by themselves, a
    few among many anywhere, do not make a worker slow (with the median, two slow tasks of
    a four-slot worker's last four did). Two attempts at least; None with fewer."""
    found = [min(ended[-max(2, slots):])] if len(ended[-max(2, slots):]) >= 2 else []
    found += [min(running)] if len(running) >= 2 else []
    return max(found) if found else None


def report(clients: Clients, worker: str, ended: list[float], running: list[float], slots: int,
           attempts: int, stall: float | None = None) -> str:
    """Write a worker's ratios (its latest ended attempts', oldest first, and its running
    ones' so far), how many attempts it has run and its stall (``worker.pace``: the wall
    time its probe's naps took over the time they asked for, lately); return its state as
    the monitor sees it."""
    clients.workers.upsert_entity({
        "PartitionKey": PARTITION, "RowKey": worker, "Ratios": json.dumps([round(r, 3) for r in ended]),
        "Running": json.dumps([round(r, 3) for r in running]), "Slots": slots, "Attempts": attempts,
        "Stall": round(stall, 3) if stall is not None else None, "SeenAt": now(),
    }, mode=UpdateMode.MERGE)
    row = clients.workers.get_entity(PARTITION, worker)
    return str(row.get("State") or HEALTHY)


def sandbox(clients: Clients, worker: str, mode: str) -> None:
    """Record how a worker confines scientists' programs (its sandbox's mode), for its job's
    worker table: a worker that refuses to run them says so there."""
    try:
        clients.workers.upsert_entity({"PartitionKey": PARTITION, "RowKey": worker, "Sandbox": mode, "SeenAt": now()},
                                      mode=UpdateMode.MERGE)
    except Exception as exc:  # statistics, never results
        log.info("worker %s's sandbox not recorded: %s", worker, exc)


def left(clients: Clients, worker: str, state: str) -> None:
    """Record that a worker has gone (``state``: how it left)."""
    try:
        clients.workers.upsert_entity({"PartitionKey": PARTITION, "RowKey": worker, "Left": state, "SeenAt": now()},
                                      mode=UpdateMode.MERGE)
    except Exception as exc:  # statistics, never results
        log.info("worker %s's departure not recorded: %s", worker, exc)


def _ratio_of(row: Any) -> float | None:
    """A worker's figure as the monitor compares it: its recent ratio, or its stall if that
    is higher and at least STALL_FLOOR (a machine that runs the worker a third of the time
    or less slows all it runs that much, before any attempt has run long enough to show it)."""
    try:
        ratio = recent_ratio(json.loads(row.get("Ratios") or "[]"), json.loads(row.get("Running") or "[]"),
                             int(row.get("Slots") or 2))
        stall = float(row.get("Stall") or 0.0)
    except (ValueError, TypeError):
        return None
    return max(ratio or 0.0, stall) if stall >= STALL_FLOOR else ratio


def find_slow(clients: Clients, slow_ratio: float, at: datetime | None = None) -> list[str]:
    """Mark slow every worker that runs far past its history while the others do not;
    return the ones marked now. Also forgets rows of workers long gone."""
    if slow_ratio <= 0:
        return []
    at = at or now()
    heard: dict[str, float] = {}
    already = 0
    for row in clients.workers.query_entities("PartitionKey eq @p", parameters={"p": PARTITION}):
        seen = row.get("SeenAt")
        if seen is None or at - seen > FORGET_AFTER:
            clients.workers.delete_entity(PARTITION, row["RowKey"])
            continue
        if at - seen > HEARD_WITHIN or row.get("Left"):
            continue
        if row.get("State") == SLOW:
            already += 1
            continue
        ratio = _ratio_of(row)
        if ratio is not None:
            heard[row["RowKey"]] = ratio
    room = max(1, int((len(heard) + already) * MAX_SLOW_SHARE)) - already
    marked = []
    for worker, ratio in sorted(heard.items(), key=lambda item: -item[1]):
        others = [r for w, r in heard.items() if w != worker and w not in marked]
        if room <= 0 or not others or ratio < slow_ratio * max(1.0, statistics.median(others)):
            break
        clients.workers.upsert_entity({"PartitionKey": PARTITION, "RowKey": worker, "State": SLOW,
                                       "MarkedAt": at, "MarkedRatio": ratio}, mode=UpdateMode.MERGE)
        log.warning("worker %s is slow: its attempts run %.1f× their history, the others' %.1f×",
                    worker, ratio, statistics.median(others))
        marked.append(worker)
        room -= 1
    return marked


def slot_writer(worker: str, slot: int) -> str:
    """The name a worker's slot writes its rollup row under (the job's worker table reads
    the worker back from it)."""
    return f"{worker}{names.SLOT_MARK}{slot}"


def worker_table(clients: Clients, workers: Mapping[str, Mapping[str, int]]) -> list[dict[str, Any]]:
    """The job's workers, from its rollups (``workers``: per worker, the attempts it
    ``committed``, those that ``failed``, and its net ``running``: ``rollups.Rollup.workers``)
    and the workers' health rows — a row per worker, whatever the job's size: the attempts
    it ran for the job and how many it committed, its recent ratio of runtimes to their
    history (the least of its latest attempts', any job's, or of the ones it runs, or its
    stall: what the monitor compares; for a worker found slow, at least the figure it was
    found on), its state (healthy, slow, or how it left) and how it confines scientists'
    programs (``sandbox``: None if it has not said)."""
    found: dict[str, dict[str, Any]] = {}
    for worker, figures in workers.items():
        # claims: each ended in a commit, a failure, or is RUNNING still (or was revoked by the
        # monitor); one slot may end what another claimed, so only the worker's sum is clamped
        committed = figures.get("committed", 0)
        found[worker] = {"worker": worker, "committed": committed,
                         "attempts": committed + figures.get("failed", 0) + max(0, figures.get("running", 0)),
                         "recent_ratio": None, "state": "unknown",  # until its health row says (one query: the fleet's)
                         "sandbox": None}
    for row in clients.workers.query_entities("PartitionKey eq @p", parameters={"p": PARTITION},
                                              select=["RowKey", "Ratios", "Running", "Slots", "Stall", "State",
                                                      "Left", "MarkedRatio", "Sandbox"]) \
            if found else ():
        if row["RowKey"] not in found:
            continue
        ratio = _ratio_of(row)  # as the monitor compares it: its ended attempts, or the ones it runs, or its stall
        if row.get("MarkedRatio") is not None:  # found slow: what it was found on (its attempts since taken)
            ratio = max(ratio or 0.0, float(row["MarkedRatio"]))
        found[row["RowKey"]] |= {"recent_ratio": round(ratio, 2) if ratio is not None else None,
                                 "state": row.get("Left") or row.get("State") or HEALTHY,
                                 "sandbox": row.get("Sandbox")}
    return sorted(found.values(), key=lambda e: e["worker"])
