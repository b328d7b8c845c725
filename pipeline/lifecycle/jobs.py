"""Job rows: submit, read, list, cancel, and the status a scientist sees.

jobs table: PK = job id, RK = ``job`` (the job row, with its ``Owner``); index partitions
keyed so that nothing needs a scan: ``~active`` (RK = job id) lists unfinished jobs for the
sweep, ``~list`` (RK = inverted creation time + job id) lists every job newest first (an
admin's view), and ``~list~<user>`` the same for one owner.

A job is its owner's: :func:`get_for` answers another user's job exactly as a job that does
not exist (an admin's is every job).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Protocol

from azure.core.exceptions import (
    AzureError,
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.data.tables import UpdateMode

from pipeline.lifecycle import costs, fenced, health, partitions, rollups, snapshots, storable, tasks, transitions
from pipeline.lifecycle.rollups import RollupWriter
from pipeline.lifecycle.status import JobState, TaskStatus, job_transition
from pipeline.lifecycle.tasks import if_match, now
from pipeline.planning import TaskPlan, gathers, releasable, size
from pipeline.redact import redact
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.storage.rows import Row, stored

log = logging.getLogger(__name__)
ACTIVE = "~active"
LISTING = "~list"
PLAN_TRIES = 5  # plan messages sent for a job before it is failed as unplannable
_FAR_FUTURE_MS = 10**13
NO_FINISHER = datetime(1970, 1, 1, tzinfo=UTC)  # a finisher's lease that has long run out


class JobNotFound(LookupError):
    pass


@dataclass(frozen=True, kw_only=True)
class JobRow(Row):
    """A job's row in the jobs table (PK = job id, RK = ``job``), with the ETag it was read
    with: every conditional update of the job goes through :func:`update` with it."""

    job: str = field(metadata=stored("PartitionKey"))
    request: str  # the JobRequest, as JSON
    state: JobState
    total: int  # every task, reductions included
    tiles: int  # the tile tasks: the release cursor's end (reductions wait for their tiles)
    places: int  # the places its tasks work on, a batch's each: its size whatever its tasks' batches
    gathers: int = 0  # its last tasks, which wait for all the others (``planning.TaskPlan.after_all``)
    buckets: int = 1  # the table partitions its tasks are spread over (``pipeline.lifecycle.partitions``)
    created_at: datetime
    updated_at: datetime
    last_write: str = ""  # the mark of the last write by :func:`update`: its own, read back
    planned: int = 0  # task rows the planner has written
    released: int = 0  # the release cursor: tile tasks sent to the queues
    label: str = ""
    email: str = ""  # where its completion is mailed ("" for nowhere)
    owner: str = ""  # the user whose job it is ("" on a stack without sign-in)
    program: str = ""  # what its application resolved at submission (a reduction's program), as it wrote it
    error: str = ""  # why the job failed as a whole (its tasks' errors are on their rows)
    warning: str = ""  # what a finished job's scientist must know beside its state (it made nothing)
    notes: str = ""  # what its application says of its products (a JSON list: "synthetic data …")
    plan_tries: int = 0  # plan messages the sweep has sent again
    planning_until: datetime | None = None  # a planner is searching the catalogs until then
    releaser_until: datetime | None = None  # the releaser's lease on the cursor
    outcome: JobState | None = None  # the final state, decided when the job goes FINISHING
    finisher: str = ""  # the finisher that holds the job, and its lease
    finisher_until: datetime | None = None
    mail_id: str = ""  # the completion email's Message-ID, fixed before it is sent
    mail_at: datetime | None = None  # when a finisher was about to send it (its record, ``notified_at``, follows)
    notified_at: datetime | None = None
    finish_tries: int = 0  # finishers that failed on the job (``completion``): past a few, the next ends it
    finish_error: str = ""  # the last one's error
    missing: str = ""  # the optional pieces its finisher could not make, and why (JSON: piece → error)
    finished_at: datetime | None = None
    manifest: str = ""
    compute_s: float | None = None  # measured at completion
    budget_usd: float | None = field(default=None, metadata=stored("BudgetUSD"))  # past it, the sweep stops the job
    started_at: datetime | None = None  # planned: its tasks began to be released
    cost_usd: float | None = field(default=None, metadata=stored("CostUSD"))
    key: str = field(default=names.JOB_ROW, metadata=stored("RowKey"))
    etag: str = field(default="", compare=False)
    # what a submitted job's row has always said, if only that it is nothing yet
    written: ClassVar[frozenset[str]] = frozenset({"planned", "released", "label", "email", "owner", "program"})

    @classmethod
    def completed(cls, found: dict[str, Any]) -> dict[str, Any]:
        """A row written before ``Tiles`` (``Places``) was kept counts all its tasks as tiles
        (as places: it was planned a place a task)."""
        return {"tiles": found["total"], "places": found["total"]} | found

    @property
    def cancelled(self) -> bool:
        """Cancelled, or being cancelled: a task not planned by now never will be (its planner
        cancels any it writes after the cancel)."""
        return JobState.CANCELLED in (self.state, self.outcome) or self.state is JobState.CANCELLING

    @property
    def parts(self) -> list[str]:
        """The PartitionKeys of its tasks in the tasks table."""
        return partitions.parts(self.job, self.buckets)

    @property
    def first_gather(self) -> int:
        """The sequence number of its first task that waits for the whole job."""
        return self.total - self.gathers

    @property
    def all_released(self) -> bool:
        """Whether the release cursor has reached its end (reductions are released by their
        dependencies, not by the window)."""
        return self.released >= self.tiles


def new_job_id(at: datetime) -> str:
    return f"j{at:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def _listing_key(created: datetime, job: str) -> str:
    return f"{_FAR_FUTURE_MS - int(created.timestamp() * 1000):013d}-{job}"


def listing(owner: str | None) -> str:
    """The index partition listing ``owner``'s jobs (None: everyone's)."""
    return LISTING if owner is None else f"{LISTING}~{owner}"


def submit(clients: Clients, request: str, plan: list[TaskPlan], owner: str = "", resolved: str = "",
           label: str = "", email: str = "", budget_usd: float | None = None,
           field_of: storable.FieldOf = storable.anywhere) -> JobRow:
    """Store a valid request (its JSON, as its application wrote it) as ``owner``'s job of
    the tasks ``plan`` (``planning.Application.plan``'s, without the catalog: the planner
    makes the same again with it) and enqueue its plan message. ``resolved`` is what the
    application resolved of it at submission (an uploaded reducer's exact digest), kept on
    the row for the planner; ``label`` and ``email`` (where its completion is mailed, if
    anywhere) are the request's; ``budget_usd``, if given, what its measured cost may reach
    before the sweep stops it (:func:`over_budget`). A job whose rows a table could not hold
    is refused first (``storable.check``: RequestError 413, naming the field ``field_of``
    gives).

    The indexes are written before the job row (an index entry whose job does not exist
    yet is skipped by its readers), so a job never exists that the sweep cannot find; the
    plan message last, and only as a hint: a job that stays ACCEPTED because its message
    was lost (a failed send, a crash here) is planned by the sweep (:func:`replan_stale`)."""
    row = new_row(clients, request, plan, owner, resolved, label, email, budget_usd)
    storable.check(clients, row.to_entity(), row.parts, plan, field_of)
    job, created = row.job, row.created_at
    clients.jobs.upsert_entity({"PartitionKey": ACTIVE, "RowKey": job})
    for index in {listing(None), listing(owner or None)}:
        clients.jobs.upsert_entity({"PartitionKey": index, "RowKey": _listing_key(created, job), "Job": job})
    try:
        row = dataclasses.replace(row, etag=clients.jobs.create_entity(row.to_entity())["etag"])
    except ResourceExistsError:
        pass  # created by this very call, its answer lost and the request sent again by the SDK
    except (ServiceRequestError, ServiceResponseError):
        get(clients, job)  # an answer lost: the row is there (else JobNotFound: the job was not made)
    request_plan(clients, job)
    return row


def new_row(clients: Clients, request: str, plan: list[TaskPlan], owner: str = "", resolved: str = "",
            label: str = "", email: str = "", budget_usd: float | None = None) -> JobRow:
    """The row a job of ``request``, planned as ``plan``, is submitted as (a new id)."""
    created = now()
    return JobRow(
        job=new_job_id(created), request=request, state=JobState.ACCEPTED, total=len(plan), tiles=releasable(plan),
        places=size(plan), gathers=gathers(plan), created_at=created, updated_at=created,
        buckets=partitions.buckets_for(clients.settings, len(plan)), label=label, email=email, owner=owner,
        program=resolved, budget_usd=budget_usd,
    )


def request_plan(clients: Clients, job: str) -> bool:
    """Send the job's plan message; False if it could not be sent (the sweep plans a job left
    ACCEPTED too long, so the submitter need not fail)."""
    try:
        clients.plan_queue.send_message(json.dumps({"job": job}).encode())
        return True
    except AzureError as exc:
        log.warning("plan message of %s not sent (the sweep will plan it): %s", job, exc)
        return False


def get(clients: Clients, job: str) -> JobRow:
    if not names.JOB_KEY.fullmatch(job):  # no key the table would refuse, and none it could hold
        raise JobNotFound(job)
    try:
        entity = clients.jobs.get_entity(job, names.JOB_ROW)
    except ResourceNotFoundError:
        raise JobNotFound(job) from None
    return JobRow.from_entity(entity)


class Viewer(Protocol):
    """Who looks at a job: a user, by name, who may be an admin (``pipeline.web.identity.User``)."""

    @property
    def name(self) -> str: ...

    @property
    def admin(self) -> bool: ...


def get_for(clients: Clients, job: str, user: Viewer) -> JobRow:
    """The job row if ``user`` may see it (its owner, or an admin); else JobNotFound, as
    for a job that does not exist, so that another user's job is not disclosed."""
    row = get(clients, job)
    if not user.admin and row.owner != user.name:
        raise JobNotFound(job)
    return row


def update(clients: Clients, row: JobRow, **changes: Any) -> JobRow:
    """Conditional update of a job row read with :func:`get` (``changes`` by field name);
    raises HttpResponseError 412 if it changed meanwhile. A change of state is checked by
    the job state machine.

    A fenced write (``pipeline.lifecycle.fenced``): refused or unanswered, it is settled on
    the row read again, whose ``last_write`` is this write's own random mark when it applied
    (the client's retry of an applied write is refused: the row changed, by that very
    write), and that row is returned. Taken for another writer's, it had left a releaser
    giving up a lease it held and a finisher its hold. (Its time would not do: two writers'
    clocks can agree to the microsecond.)"""
    if "state" in changes:
        changes["state"] = job_transition(row.state, changes["state"])
    changes |= {"updated_at": now(), "last_write": fenced.mark()}
    written = fenced.write(
        lambda: clients.jobs.update_entity(row.stored_changes(**changes), mode=UpdateMode.MERGE, **if_match(row.etag)),
        lambda: get(clients, row.job), changes["last_write"])
    if not written.applied:
        raise written.error or RuntimeError(f"job {row.job} neither written nor refused")
    if written.answer is None:
        return written.row
    return dataclasses.replace(row, **changes, etag=written.answer["etag"])


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


def replan_stale(clients: Clients, row: JobRow) -> bool:
    """The sweep's look at an ACCEPTED job: if nothing has moved it for two leases (its plan
    message lost, poisoned, or its planner dead), send its plan message again — up to
    :data:`PLAN_TRIES` times, after which it fails, saying so. True if it acted."""
    if row.state is not JobState.ACCEPTED or now() - row.updated_at < timedelta(
            seconds=2 * clients.settings.lease_seconds) or (row.planning_until or now()) > now():
        return False  # moving, or a planner is searching the catalogs for it
    tries = row.plan_tries + 1
    try:
        if tries > PLAN_TRIES:
            refuse(clients, row, f"planning failed {PLAN_TRIES} times; the planner's log says why")
            return True
        update(clients, row, plan_tries=tries)
    except HttpResponseError as exc:
        if not tasks.is_conflict(exc):
            raise
        return False  # moved meanwhile: a planner is at work
    log.warning("job %s not planned after %s: plan message sent again (%d)", row.job,
                now() - row.updated_at, tries)
    return request_plan(clients, row.job)


def refuse(clients: Clients, row: JobRow, why: str) -> JobRow:
    """End an ACCEPTED job that cannot be planned (its request no longer fits this
    deployment: a reducer gone, a lower task limit): FAILED, saying why, through the one
    completion (a manifest, an email). Raises HttpResponseError 412 if it moved meanwhile."""
    row = update(clients, row, state=JobState.FINISHING, outcome=JobState.FAILED, error=redact(why)[:2000],
                 finisher_until=NO_FINISHER)  # held by nobody: the first finisher takes it
    announce_done(clients, row.job)
    return row


def list_jobs(clients: Clients, limit: int = 50, owner: str | None = None) -> list[JobRow]:
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


def cancel(clients: Clients, job: str, owner: str, why: str = "") -> JobRow:
    """Cancel a job: no task starts after this returns; running attempts are revoked (their
    commit fails); completion (manifest + email) follows through the done queue. ``why``: the
    reason a job is stopped rather than cancelled by its user (its error, in its status and
    manifest); what its tasks made before stays theirs, named by its manifest."""
    row = get(clients, job)
    while not row.state.finished and row.state not in (JobState.CANCELLING, JobState.FINISHING):
        try:
            row = update(clients, row, state=JobState.CANCELLING, **({"error": redact(why)[:2000]} if why else {}))
        except Exception as exc:
            if not tasks.is_conflict(exc):
                raise
            row = get(clients, job)
    if row.state is JobState.CANCELLING:
        transitions.cancel(clients, row.parts, RollupWriter(owner))
        announce_done(clients, job)
    return row


def spent(rollup: rollups.Rollup) -> float:
    """What a running job has cost so far, in USD: its committed attempts' seconds as its
    rollups' histograms hold them (each at its bin's middle: within a twentieth of a decade)
    and its ended tasks' storage calls. Failed attempts are not in the histograms: a floor."""
    seconds = sum(rollups.bin_seconds(int(b)) * n for bins in rollup.runtimes.values() for b, n in bins.items())
    ended = sum(n for state, n in rollup.counts.items() if TaskStatus(state).terminal)
    return costs.usd(seconds, ended)


def over_budget(clients: Clients, row: JobRow, rollup: rollups.Rollup) -> bool:
    """The sweep's look at a running job with a budget: past it, stop the job (a cancel that
    says why). True if it stopped it."""
    if row.budget_usd is None or row.state is not JobState.RUNNING:
        return False
    cost = spent(rollup)
    if cost <= row.budget_usd:
        return False
    log.warning("job %s past its budget (%s of %s): stopped", row.job, costs.dollars(cost),
                costs.dollars(row.budget_usd))
    cancel(clients, row.job, owner=f"budget-{row.job}", why=f"stopped: its budget of {costs.dollars(row.budget_usd)} "
           f"was spent ({costs.dollars(cost)} measured); what it made is kept")
    return True


def status(clients: Clients, job: str, rollup: rollups.Rollup | None = None,
           row: JobRow | None = None, as_of: datetime | None = None, workers: bool = True) -> dict[str, Any]:
    """What ``GET /api/jobs/{id}`` shows: state, counts per task status and per failure
    class, progress and timestamps. From the job row and its rollups as the job's status
    row has them (``snapshots.look``; ``row``, ``rollup`` and when it was summed, ``as_of``,
    if the caller has read them): two rows read by key, whatever the job's size, and the
    workers' health rows (one query) for its workers' table — left empty with ``workers``
    False, by a caller that shows none (openEO's job, polled as often as the native one)."""
    row = row if row is not None else get(clients, job)
    if rollup is None:
        rollup, as_of = snapshots.look(clients, job, row.parts, row.state.finished, tiles=False)
    counts = {s.value: rollup.counts.get(s.value, 0) for s in TaskStatus}
    counts[TaskStatus.PENDING.value] = max(0, row.planned - sum(counts.values()))
    if row.cancelled:  # cancelled while it was being planned: what was not planned is cancelled
        counts[TaskStatus.CANCELLED.value] += max(0, row.total - sum(counts.values()))
    total = row.total
    done = sum(counts[s.value] for s in TaskStatus if s.terminal)
    return {
        "job": job,
        "state": row.state.value,
        "label": row.label,
        "error": row.error or None,
        "warning": row.warning or None,
        "notes": json.loads(row.notes) if row.notes else [],
        "missing": json.loads(row.missing) if row.missing else {},  # pieces its finisher could not make, and why
        "total": total,
        "counts": counts,
        "failures": dict(rollup.failures),
        "monitor_kills": rollup.kills,
        "speculative_attempts": rollup.backups,  # backup copies of slow attempts at the job's tail
        "workers": health.worker_table(clients, rollup.workers) if workers else [],
        "progress": done / total if total else 1.0,
        "created": row.created_at.isoformat(),
        "updated": row.updated_at.isoformat(),
        "as_of": (as_of or now()).isoformat(),  # when the counts were summed (two sweep passes ago at most)
        "finished": row.finished_at.isoformat() if row.finished_at else None,
        "cost": {"compute_s": row.compute_s, "usd": row.cost_usd, "prices": costs.PRICE_LIST}
        if row.compute_s is not None else None,  # measured at completion
        "budget_usd": row.budget_usd,
        "started": row.started_at.isoformat() if row.started_at else None,
        "request": json.loads(row.request),
        "owner": row.owner,
        "program": json.loads(row.program) if row.program else None,
    }
