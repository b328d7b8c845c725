"""The periodic sweep: the monitor's revocation of overdue attempts, then a pass over the
unfinished jobs to top up release windows and finish jobs whose last step was lost (a
worker that died between its commit and its top-up, a finisher that died in FINISHING, a
canceller that died midway). Locally it runs in a loop; in Azure as a Durable Functions
eternal orchestration. Cheap: key-range queries and a few key reads."""

from __future__ import annotations

import json
import logging
import uuid

from pipeline import completion, jobs, monitor, planner
from pipeline.clients import Clients
from pipeline.notify import Mailer
from pipeline.status import JobState
from pipeline.tasks import TerminalCounter, message_bytes

log = logging.getLogger(__name__)
_counter = TerminalCounter(f"sweep-{uuid.uuid4().hex[:12]}")


def sweep(clients: Clients, mailer: Mailer) -> dict[str, int]:
    """One pass of the monitor: revoke overdue attempts, then go over the active jobs.
    Returns what it did (revoked attempts, finished jobs)."""
    report = monitor.sweep_overdue(clients)
    finished = 0
    for job in jobs.active_jobs(clients):
        try:
            row = jobs.get(clients, job)
        except jobs.JobNotFound:
            jobs.deactivate(clients, job)
            continue
        state = JobState(row["State"])
        if state is JobState.RUNNING:
            planner.release(clients, job)
            planner.release_reductions(clients, row)
        elif state is JobState.CANCELLING:
            jobs.cancel_tasks(clients, job, _counter)
        if state is not JobState.ACCEPTED:
            finished += completion.complete(clients, mailer, job)
    return {"revoked": len(report.revoked), "stale": report.stale, "finished": finished}


def job_of_message(body: bytes | str) -> str:
    """The job id a plan or done message names; ValueError if there is none."""
    try:
        found = json.loads(message_bytes(body))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(found, dict) or not isinstance(found.get("job"), str):
        raise ValueError("a plan/done message is {\"job\": id}")
    return found["job"]


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
