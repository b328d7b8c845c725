"""Worker health: find the slow machine, the ModisAzure paper's real straggler.

A slow VM slows every task it runs; killing each of its attempts in turn at 4× the mean
learns nothing from it. So each worker reports, every few seconds while it holds work, how
its latest attempts compare with their history — the ratio of each attempt's seconds to
the mean for its work (``runtimes``), a running attempt counting with the time it has run
so far, one revoked for time with the time it ran — and the monitor's sweep compares the
workers: one whose recent ratio (the median of its last few attempts) is at least
``slow_ratio`` times the others' median (or times 1, if they run faster than their
history) is marked slow. It then takes no more tasks, gives up the attempts it holds (each goes
back to the queue at once, a transient ``worker_slow`` failure, for a healthy worker to
run) and exits with REPLACE_EXIT, so that a fresh one replaces it: the local stack starts
another; in Azure the Container Apps job retries the replica (a new one) and its event
scaler starts new executions while the queues hold work.

Marking is relative and bounded: never when the others are slow too (storage slowed down
or the whole deployment overloaded is no machine's fault), and never more than a third
of the workers heard from at once (one, if there are fewer than six).

The ``workerhealth`` table holds one row per worker (PartitionKey ``w``): the worker writes its
figures (a merge that never touches ``State``), the monitor writes ``State``.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import UpdateMode

from pipeline import runtimes
from pipeline.clients import Clients
from pipeline.tasks import now

log = logging.getLogger(__name__)

PARTITION = "w"
HEALTHY, SLOW = "healthy", "slow"
REPORT_EVERY_S = 1.0  # a worker holding attempts reports this often
RECENT = 6  # ratios of ended attempts a worker keeps
HEARD_WITHIN = timedelta(seconds=30)  # a worker not heard from for this long is not compared
FORGET_AFTER = timedelta(days=1)  # a worker row this old is deleted by the sweep
MAX_SLOW_SHARE = 1 / 3  # of the workers heard from, at most this many slow at once
# a drained worker's exit status (EX_TEMPFAIL): "replace me" — the local stack starts a fresh
# worker; a Container Apps job retries the replica (replicaRetryLimit), a new one
REPLACE_EXIT = 75
SLOWNESS = ("execution_timeout", "worker_slow")  # attempts ended for being slow


def recent_ratio(ended: list[float], running: list[float], slots: int) -> float | None:
    """A worker's recent ratio: the median of its latest ``slots`` ended attempts, or the
    least of the ones it runs now (each at least as slow as it has run so far) if that is
    higher — so a machine that has just slowed down shows it as soon as all the attempts it
    runs now do (one or two tasks slow by themselves do not make it slow), and a slow one
    still shows it while its new attempts are young. Two attempts at least; None with
    fewer."""
    found = [statistics.median(ended[-max(2, slots):])] if len(ended[-max(2, slots):]) >= 2 else []
    found += [min(running)] if len(running) >= 2 else []
    return max(found) if found else None


def report(clients: Clients, worker: str, ended: list[float], running: list[float], slots: int,
           attempts: int) -> str:
    """Write a worker's ratios (its latest ended attempts', oldest first, and its running
    ones' so far) and how many attempts it has run; return its state as the monitor sees it."""
    clients.workers.upsert_entity({
        "PartitionKey": PARTITION, "RowKey": worker, "Ratios": json.dumps([round(r, 3) for r in ended]),
        "Running": json.dumps([round(r, 3) for r in running]), "Slots": slots, "Attempts": attempts,
        "SeenAt": now(),
    }, mode=UpdateMode.MERGE)
    row = clients.workers.get_entity(PARTITION, worker)
    return str(row.get("State") or HEALTHY)


def left(clients: Clients, worker: str, state: str) -> None:
    """Record that a worker has gone (``state``: how it left)."""
    try:
        clients.workers.upsert_entity({"PartitionKey": PARTITION, "RowKey": worker, "Left": state, "SeenAt": now()},
                                      mode=UpdateMode.MERGE)
    except Exception as exc:  # statistics, never results
        log.info("worker %s's departure not recorded: %s", worker, exc)


def _ratio_of(row: Any) -> float | None:
    try:
        return recent_ratio(json.loads(row.get("Ratios") or "[]"), json.loads(row.get("Running") or "[]"),
                            int(row.get("Slots") or 2))
    except (ValueError, TypeError):
        return None


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


def worker_table(clients: Clients, task_rows: Sequence[Mapping[str, Any]],
                 attempt_rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The job's workers: attempts run, the median ratio of their attempts' runtimes to the
    history (attempts that computed; a running one, or one ended for being slow, with the
    time it ran), and
    each worker's state (healthy, slow, or how it left)."""
    mean_of: dict[tuple[str, str], float] = {}
    expected: dict[str, float] = {}
    for row in task_rows:
        params = json.loads(row["Params"])
        key = (row["Stage"], runtimes.history_key(params))
        if key not in mean_of:
            history = runtimes.read(clients.runtimes, *key)
            mean_of[key] = history.mean if history.count >= clients.settings.min_samples else 0.0
        expected[row["RowKey"]] = mean_of[key] * runtimes.work_of(params)
    at = now()
    found: dict[str, dict[str, Any]] = {}
    ratios: dict[str, list[float]] = {}
    for attempt in attempt_rows:
        worker = attempt.get("Worker")
        if not worker:
            continue
        found.setdefault(worker, {"worker": worker, "attempts": 0, "committed": 0})
        found[worker]["attempts"] += 1
        outcome = attempt.get("Outcome")
        found[worker]["committed"] += outcome in ("SUCCEEDED", "CACHED", "NO_DATA")
        mean = expected.get(attempt["Task"], 0.0)
        if not mean or not attempt.get("StartedAt"):
            continue
        if outcome == "SUCCEEDED" and attempt.get("RuntimeS") is not None:
            ratios.setdefault(worker, []).append(float(attempt["RuntimeS"]) / mean)
        elif outcome == "RUNNING" or attempt.get("FailureClass") in SLOWNESS:  # at least this slow
            ended = attempt.get("EndedAt") or at
            ratios.setdefault(worker, []).append((ended - attempt["StartedAt"]).total_seconds() / mean)
    for worker, entry in found.items():
        entry["median_ratio"] = round(statistics.median(ratios[worker]), 2) if worker in ratios else None
        try:
            row = clients.workers.get_entity(PARTITION, worker)
            entry["state"] = row.get("Left") or row.get("State") or HEALTHY
        except ResourceNotFoundError:
            entry["state"] = "unknown"
    return sorted(found.values(), key=lambda e: e["worker"])
