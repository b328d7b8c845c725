"""The periodic sweep: the monitor and the reconciler, one pass over the unfinished jobs.

First it takes their attempts from the workers found slow. Then for each job it revokes
the attempts past their deadline, sends again the message of every task QUEUED too long
without being taken (a message lost, or poisoned), plans again a job left ACCEPTED (its
plan message lost), tops up the release window, goes on with a cancellation, announces a
completion nobody made (a worker that died between its commit and its announcement, a
finisher that died), and folds the rollup rows of writers gone quiet (``rollups.fold``),
summing the rows it read for the job's status row, which looks at the job read
(``snapshots``: written last, once the pass's length is known). Last it removes the cache
markers of makers that died with no task left to take them over. It never finishes a job
itself, so a long completion never holds up revocations. One job's failure is logged and
the pass goes on with the others. Locally it runs in a loop; in Azure as a Durable
Functions eternal orchestration. Cheap: key-range queries and a few key reads per job.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta
from itertools import chain

from azure.core.exceptions import ResourceNotFoundError

from pipeline.lifecycle import completion, dispatch, health, jobs, monitor, planner, progress, rollups, snapshots, tasks
from pipeline.lifecycle.notify import Mailer
from pipeline.lifecycle.rollups import RollupWriter
from pipeline.lifecycle.status import JobState
from pipeline.lifecycle.tasks import message_bytes
from pipeline.storage import cache, names
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)
_writer = RollupWriter(f"sweep-{uuid.uuid4().hex[:12]}")
Sum = tuple[str, datetime, rollups.Rollup]  # a job, when its rollups were read, their sum
ORPHAN_AGE = timedelta(minutes=5)  # an active-index entry this old whose job row does not exist is dropped


class BadMessage(ValueError):
    """A plan or done message that can never be handled (it names no job)."""


def sweep(clients: Clients) -> dict[str, int]:
    """One pass over the active jobs. Returns what it did."""
    started = time.monotonic()
    report = monitor.SweepReport()
    done: Counter[str] = Counter()
    try:  # first: the jobs' sums below then hold what it revoked
        slow = health.find_slow(clients, clients.settings.slow_ratio)
        done["slow"] = len(slow)
        monitor.revoke_slow(clients, slow, report)
    except Exception:
        log.exception("worker health not checked; the next pass tries again")
        done["errors"] += 1
    sums: list[Sum] = []
    for job in jobs.active_jobs(clients):
        try:
            sums += _sweep_job(clients, job, report, done)
        except Exception:
            log.exception("sweep of job %s failed; the next pass tries again", job)
            done["errors"] += 1
    try:
        done["markers"] = cache.sweep_markers((clients.tiles, clients.sources), lambda owner: _ended(clients, owner))
    except Exception:
        log.exception("cache markers not swept; the next pass tries again")
        done["errors"] += 1
    fresh_for = snapshots.fresh_for(clients.settings, time.monotonic() - started)  # the pass's length known
    for job, began, rollup in sums:
        try:
            done["summed"] += snapshots.write(clients, job, rollup, began, fresh_for)
        except Exception:
            log.exception("status row of job %s not written; the next pass tries again", job)
            done["errors"] += 1
    return {"revoked": len(report.revoked), "stale": report.stale, "backups": report.backups,
            "resent": done["resent"],
            "replanned": done["replanned"], "announced": done["announced"], "slow_workers": done["slow"],
            "markers": done["markers"], "folded": done["folded"], "summed": done["summed"], "stopped": done["stopped"],
            "errors": done["errors"]}


def _ended(clients: Clients, owner: str) -> bool:
    """Whether the task a cache marker names (``{partition}/{task}``) is terminal, or gone with
    its job."""
    part, _, task = owner.partition("/")
    try:
        return tasks.get_task(clients.tasks, part, task).status.terminal
    except ResourceNotFoundError:
        return True


def _sweep_job(clients: Clients, job: str, report: monitor.SweepReport, done: Counter[str]) -> list[Sum]:
    """One job's part of the pass; the sum of its rollups, if its status row is to be written."""
    try:
        row = jobs.get(clients, job)
    except jobs.JobNotFound:
        jobs.deactivate(clients, job, unless_younger_than=ORPHAN_AGE)
        return []
    state = row.state
    if state.finished:
        jobs.deactivate(clients, job)
        return []
    due = monitor.revoke_overdue(clients, row, report)
    done["resent"] += dispatch.redispatch_due(clients, row.parts)
    if state is JobState.ACCEPTED:
        done["replanned"] += jobs.replan_stale(clients, row)
        return []
    done["announced"] += progress.follow_up(clients, _writer, job, row)
    monitor.speculate(clients, row, due, report)
    began = tasks.now()  # last: nothing waits on these; the rows read once for the fold and the sum
    found = {part: list(rollups.rows(clients.tasks, [part])) for part in row.parts}
    done["folded"] += sum(rollups.fold(clients.tasks, part, rows) for part, rows in found.items())
    summed = rollups.summed(chain.from_iterable(found.values()))
    done["stopped"] += jobs.over_budget(clients, row, summed)
    return [(job, began, summed)]


def job_of_message(body: bytes | str) -> str:
    """The job id a plan or done message names; BadMessage if there is none."""
    try:
        found = json.loads(message_bytes(body))
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadMessage(f"not JSON: {exc}") from None
    if not isinstance(found, dict) or not isinstance(found.get("job"), str):
        raise BadMessage("a plan/done message is {\"job\": id}")
    job: str = found["job"]
    return job


def handle_plan(clients: Clients, body: bytes | str) -> None:
    """The planner trigger: plan the job a ``plan`` message names."""
    job = job_of_message(body)
    try:
        planner.plan(clients, job)
    except jobs.JobNotFound:
        log.warning("plan message for unknown job %r dropped", job)


def handle_done(clients: Clients, mailer: Mailer, body: bytes | str) -> None:
    """The completion trigger: finish the job a ``done`` message names, if complete."""
    job = job_of_message(body)
    try:
        completion.complete(clients, mailer, job)
    except jobs.JobNotFound:
        log.warning("done message for unknown job %r dropped", job)


def handle_poisoned(clients: Clients, mailer: Mailer, queue: str, body: bytes | str, why: str) -> None:
    """A ``plan`` or ``done`` message the queue gave up on (handled and failed too often:
    poisoned) ends its job, saying why, instead of leaving it for the sweep to announce
    again and again: a job still ACCEPTED is refused, a complete one is finished as its
    finishers could (``completion.complete``'s ``give_up``). ``queue``: the poisoned
    message's queue, ``plan`` or ``done``."""
    try:
        job = job_of_message(body)
        row = jobs.get(clients, job)
    except (BadMessage, jobs.JobNotFound) as exc:
        log.warning("poisoned %s message dropped: %s", queue, exc)
        return
    if queue == names.PLAN_QUEUE:
        if row.state is JobState.ACCEPTED:
            jobs.refuse(clients, row, f"its planning failed every time ({why}); the planner's log says why")
    elif queue == names.DONE_QUEUE:
        completion.complete(clients, mailer, job, give_up=f"its completion failed every time ({why})")
    else:
        raise ValueError(f"no poisoned message of queue {queue!r} is handled")
