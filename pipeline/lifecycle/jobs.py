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
import logging
import secrets
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.data.tables import UpdateMode

from pipeline.lifecycle import costs, health, rollups, tasks, transitions
from pipeline.lifecycle.request import JobRequest, expand, installed
from pipeline.lifecycle.status import JobState, TaskStatus, job_transition
from pipeline.lifecycle.tasks import TerminalCounter, if_match, now
from pipeline.redact import redact
from pipeline.reduction.reducers import Program
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web.identity import User

log = logging.getLogger(__name__)
ACTIVE = "~active"
LISTING = "~list"
PLAN_TRIES = 5  # plan messages sent for a job before it is failed as unplannable
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
    reducer resolved to (an uploaded bundle's exact digest), kept on the row for the planner.

    The indexes are written before the job row (an index entry whose job does not exist
    yet is skipped by its readers), so a job never exists that the sweep cannot find; the
    plan message last, and only as a hint: a job that stays ACCEPTED because its message
    was lost (a failed send, a crash here) is planned by the sweep (:func:`replan_stale`)."""
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
    clients.jobs.upsert_entity({"PartitionKey": ACTIVE, "RowKey": job})
    for index in {listing(None), listing(owner or None)}:
        clients.jobs.upsert_entity({"PartitionKey": index, "RowKey": _listing_key(created, job), "Job": job})
    try:
        clients.jobs.create_entity(row)
    except ResourceExistsError:
        pass  # created by this very call, its answer lost and the request sent again by the SDK
    except (ServiceRequestError, ServiceResponseError):
        get(clients, job)  # an answer lost: the row is there (else JobNotFound: the job was not made)
    request_plan(clients, job)
    return row


def request_plan(clients: Clients, job: str) -> bool:
    """Send the job's plan message; False if it could not be sent (the sweep plans a job left
    ACCEPTED too long, so the submitter need not fail)."""
    try:
        clients.plan_queue.send_message(json.dumps({"job": job}).encode())
        return True
    except AzureError as exc:
        log.warning("plan message of %s not sent (the sweep will plan it): %s", job, exc)
        return False


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


def deactivate(clients: Clients, job: str, unless_younger_than: timedelta | None = None) -> None:
    """Drop the job's entry in the active index (``unless_younger_than``: keep it if it was
    written more recently: a job being submitted has its entry before its row)."""
    try:
        if unless_younger_than is not None:
            written = clients.jobs.get_entity(ACTIVE, job).metadata["timestamp"]
            if written is not None and now() - written < unless_younger_than:
                return
        clients.jobs.delete_entity(ACTIVE, job)
    except ResourceNotFoundError:
        pass


def replan_stale(clients: Clients, row: dict[str, Any]) -> bool:
    """The sweep's look at an ACCEPTED job: if nothing has moved it for two leases (its plan
    message lost, poisoned, or its planner dead), send its plan message again — up to
    :data:`PLAN_TRIES` times, after which it fails, saying so. True if it acted."""
    if row["State"] != JobState.ACCEPTED.value or now() - row["UpdatedAt"] < timedelta(
            seconds=2 * clients.settings.lease_seconds) or row.get("PlanningUntil", now()) > now():
        return False  # moving, or a planner is searching the catalogs for it
    tries = int(row.get("PlanTries", 0)) + 1
    try:
        if tries > PLAN_TRIES:
            refuse(clients, row, f"planning failed {PLAN_TRIES} times; the planner's log says why")
            return True
        update(clients, row, PlanTries=tries)
    except HttpResponseError as exc:
        if not tasks.is_conflict(exc):
            raise
        return False  # moved meanwhile: a planner is at work
    log.warning("job %s not planned after %s: plan message sent again (%d)", row["PartitionKey"],
                now() - row["UpdatedAt"], tries)
    return request_plan(clients, row["PartitionKey"])


def refuse(clients: Clients, row: dict[str, Any], why: str) -> dict[str, Any]:
    """End an ACCEPTED job that cannot be planned (its request no longer fits this
    deployment: a reducer gone, a lower task limit): FAILED, saying why, through the one
    completion (a manifest, an email). Raises HttpResponseError 412 if it moved meanwhile."""
    row = update(clients, row, State=JobState.FINISHING.value, Outcome=JobState.FAILED.value,
                 Error=redact(why)[:2000])
    announce_done(clients, row["PartitionKey"])
    return row


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
        transitions.cancel(clients, job, TerminalCounter(owner))
        announce_done(clients, job)
    return row


def status(clients: Clients, job: str, rollup: rollups.Rollup | None = None) -> dict[str, Any]:
    """What ``GET /api/jobs/{id}`` shows: state, counts per task status and per failure
    class, progress and timestamps. From the job row and its rollups (``rollup``, if the
    caller has read them): a few rows, whatever the job's size."""
    row = get(clients, job)
    if rollup is None:
        rollup = rollups.read(clients.tasks, job, tiles=False)
    counts = {s.value: rollup.counts.get(s.value, 0) for s in TaskStatus}
    counts[TaskStatus.PENDING.value] = max(0, int(row.get("Planned", 0)) - sum(counts.values()))
    total = int(row["Total"])
    done = sum(counts[s.value] for s in TaskStatus if s.terminal)
    return {
        "job": job,
        "state": row["State"],
        "label": row.get("Label", ""),
        "error": row.get("Error") or None,
        "total": total,
        "counts": counts,
        "failures": dict(rollup.failures),
        "monitor_kills": rollup.kills,
        "workers": health.worker_table(clients, rollup.writers),
        "progress": done / total if total else 1.0,
        "created": row["CreatedAt"].isoformat(),
        "updated": row["UpdatedAt"].isoformat(),
        "finished": row["FinishedAt"].isoformat() if row.get("FinishedAt") else None,
        "cost": {"compute_s": row["ComputeS"], "usd": row["CostUSD"], "prices": costs.PRICE_LIST}
        if row.get("ComputeS") is not None else None,  # measured at completion
        "request": json.loads(row["Request"]),
        "owner": row.get("Owner", ""),
        "program": json.loads(row["Program"]) if row.get("Program") else None,
    }
