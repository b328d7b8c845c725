"""Job rows: submit, read, list, cancel, and the status a scientist sees.

jobs table: PK = job id, RK = ``job`` (the job row, with its ``Owner``); index partitions
keyed so that nothing needs a scan: ``~active`` (RK = job id) lists unfinished jobs for the
sweep, ``~list`` (RK = inverted creation time + job id) lists every job newest first (an
admin's view), and ``~list~<user>`` the same for one owner.

A job is its owner's: :func:`get_for` answers another user's job exactly as a job that does
not exist (an admin's is every job).
"""

from __future__ import annotations

import json
import secrets
from collections import Counter
from datetime import datetime
from typing import Any

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableTransactionError, UpdateMode

from pipeline import attempts, names, tasks
from pipeline.clients import Clients
from pipeline.identity import User
from pipeline.reducers import Program
from pipeline.request import JobRequest, expand, installed
from pipeline.status import JobState, TaskStatus, job_transition
from pipeline.tasks import TerminalCounter, if_match, now

ACTIVE = "~active"
LISTING = "~list"
_FAR_FUTURE_MS = 10**13


class JobNotFound(LookupError):
    pass


def new_job_id(at: datetime) -> str:
    return f"j{at:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def _listing_key(created: datetime, job: str) -> str:
    return f"{_FAR_FUTURE_MS - int(created.timestamp() * 1000):013d}-{job}"


def listing(owner: str | None) -> str:
    """The index partition listing ``owner``'s jobs (None: everyone's)."""
    return LISTING if owner is None else f"{LISTING}~{owner}"


def submit(clients: Clients, request: JobRequest, owner: str = "", program: Program | None = None) -> dict[str, Any]:
    """Store a valid request as ``owner``'s job and enqueue its plan message; RequestError
    if it cannot run (then nothing is written). ``program`` is the reduction the request's
    reducer resolved to (an uploaded bundle's exact digest), kept on the row for the planner."""
    if request.reducer is not None and program is None:
        program = installed(request.reducer.name, clients.settings.reducers_path)
    specs = expand(request, clients.settings.max_tasks, program=program)
    created = now()
    job = new_job_id(created)
    row = {
        "PartitionKey": job,
        "RowKey": names.JOB_ROW,
        "Request": request.model_dump_json(),
        "State": JobState.ACCEPTED.value,
        "Total": len(specs),
        "Tiles": sum(1 for s in specs if s.reducer is None),  # the release cursor's end: reductions wait
        "Planned": 0,
        "Released": 0,
        "CreatedAt": created,
        "UpdatedAt": created,
        "Label": request.label,
        "Owner": owner,
        "Program": program.to_json() if program else "",
    }
    clients.jobs.create_entity(row)
    clients.jobs.upsert_entity({"PartitionKey": ACTIVE, "RowKey": job})
    for index in {listing(None), listing(owner or None)}:
        clients.jobs.upsert_entity({"PartitionKey": index, "RowKey": _listing_key(created, job), "Job": job})
    clients.plan_queue.send_message(json.dumps({"job": job}).encode())
    return row


def get(clients: Clients, job: str) -> dict[str, Any]:
    if not names.JOB_KEY.fullmatch(job):  # no key the table would refuse, and none it could hold
        raise JobNotFound(job)
    try:
        entity = clients.jobs.get_entity(job, names.JOB_ROW)
    except ResourceNotFoundError:
        raise JobNotFound(job) from None
    return dict(entity) | {"_etag": entity.metadata["etag"]}


def get_for(clients: Clients, job: str, user: User) -> dict[str, Any]:
    """The job row if ``user`` may see it (its owner, or an admin); else JobNotFound, as
    for a job that does not exist, so that another user's job is not disclosed."""
    row = get(clients, job)
    if not user.admin and row.get("Owner") != user.name:
        raise JobNotFound(job)
    return row


def request_of(row: dict[str, Any]) -> JobRequest:
    return JobRequest.model_validate_json(row["Request"])


def program_of(row: dict[str, Any]) -> Program | None:
    """The reduction the job runs, as resolved when it was submitted."""
    return Program.from_json(row["Program"]) if row.get("Program") else None


def update(clients: Clients, row: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """Conditional update of a job row read with :func:`get`; raises HttpResponseError 412
    if it changed meanwhile. A change of State is checked by the job state machine."""
    if "State" in changes:
        changes["State"] = job_transition(row["State"], changes["State"]).value
    changes["UpdatedAt"] = now()
    entity = {"PartitionKey": row["PartitionKey"], "RowKey": names.JOB_ROW, **changes}
    meta = clients.jobs.update_entity(entity, mode=UpdateMode.MERGE, **if_match(row["_etag"]))
    return row | changes | {"_etag": meta["etag"]}


def active_jobs(clients: Clients) -> list[str]:
    return [r["RowKey"] for r in clients.jobs.query_entities("PartitionKey eq @pk", parameters={"pk": ACTIVE})]


def deactivate(clients: Clients, job: str) -> None:
    try:
        clients.jobs.delete_entity(ACTIVE, job)
    except ResourceNotFoundError:
        pass


def list_jobs(clients: Clients, limit: int = 50, owner: str | None = None) -> list[dict[str, Any]]:
    """The newest jobs first: ``owner``'s, or everyone's (None)."""
    index = clients.jobs.query_entities(
        "PartitionKey eq @pk", parameters={"pk": listing(owner)}, results_per_page=limit
    )
    found = []
    for entry in index:
        try:
            found.append(get(clients, entry["Job"]))
        except JobNotFound:
            continue
        if len(found) >= limit:
            break
    return found


def announce_done(clients: Clients, job: str) -> None:
    """Ask the completion handler to look at the job (duplicates are harmless)."""
    clients.done_queue.send_message(json.dumps({"job": job}).encode())


def cancel(clients: Clients, job: str, owner: str) -> dict[str, Any]:
    """Cancel a job: no task starts after this returns; running attempts are revoked (their
    commit fails); completion (manifest + email) follows through the done queue."""
    row = get(clients, job)
    while not JobState(row["State"]).finished and row["State"] not in (
        JobState.CANCELLING.value, JobState.FINISHING.value
    ):
        try:
            row = update(clients, row, State=JobState.CANCELLING.value)
        except Exception as exc:
            if not tasks.is_conflict(exc):
                raise
            row = get(clients, job)
    if row["State"] == JobState.CANCELLING.value:
        cancel_tasks(clients, job, TerminalCounter(owner))
        announce_done(clients, job)
    return row


def cancel_tasks(clients: Clients, job: str, counter: TerminalCounter) -> None:
    """Move every unfinished task of the job to CANCELLED, in transactions of one page."""
    while True:
        pending = [r for r in tasks.list_tasks(clients.tasks, job) if not TaskStatus(r["Status"]).terminal]
        if not pending:
            return
        for start in range(0, len(pending), tasks.BATCH - 1):
            chunk = pending[start : start + tasks.BATCH - 1]
            ops = [
                ("update", {"PartitionKey": job, "RowKey": r["RowKey"],
                            "Status": TaskStatus.CANCELLED.value, "EndedAt": now()},
                 {"mode": UpdateMode.MERGE, **if_match(r.metadata["etag"])})
                for r in chunk
            ]
            try:
                counter.write(clients.tasks, job, ops, {TaskStatus.CANCELLED.value: len(chunk)})
            except TableTransactionError:
                continue  # a row moved meanwhile; the next pass reads it again


def status(clients: Clients, job: str, task_rows: list[dict[str, Any]] | None = None,
           attempt_rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What ``GET /api/jobs/{id}`` shows: state, counts per task status and per failure
    class, progress and timestamps (from the rows given, if the caller has read them)."""
    row = get(clients, job)
    if task_rows is None:
        task_rows = tasks.list_tasks(clients.tasks, job)
    if attempt_rows is None:
        attempt_rows = attempts.list_attempts(clients.tasks, job, select=["FailureClass", "RevokedBy"])
    counts: Counter[str] = Counter(task["Status"] for task in task_rows)
    failures: Counter[str] = Counter()
    kills = 0
    for attempt in attempt_rows:
        if attempt.get("FailureClass"):
            failures[attempt["FailureClass"]] += 1
        kills += attempt.get("RevokedBy") == "monitor"
    total = int(row["Total"])
    done = sum(counts[s.value] for s in TaskStatus if s.terminal)
    return {
        "job": job,
        "state": row["State"],
        "label": row.get("Label", ""),
        "total": total,
        "counts": {s.value: counts.get(s.value, 0) for s in TaskStatus},
        "failures": dict(failures),
        "monitor_kills": kills,
        "progress": done / total if total else 1.0,
        "created": row["CreatedAt"].isoformat(),
        "updated": row["UpdatedAt"].isoformat(),
        "finished": row["FinishedAt"].isoformat() if row.get("FinishedAt") else None,
        "request": json.loads(row["Request"]),
        "owner": row.get("Owner", ""),
        "program": json.loads(row["Program"]) if row.get("Program") else None,
    }
