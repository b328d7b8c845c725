"""openEO batch jobs as bagpipe keeps them.

openEO creates a job (``POST /jobs``) and starts it later (``POST /jobs/{id}/results``), as often
as the user likes; a bagpipe job is submitted to run. So an openEO job is a record of its own
and each start submits a bagpipe job, whose id the record keeps (``runs``, newest last): the
lifecycle's jobs and their invariants are untouched — a created job has no tasks, nothing to
release, plan, sweep or finish — and a restart is a new bagpipe job of the same request, in
which every tile and reduction the earlier runs made is found in the cache (settled at
planning, never run again): only what did not succeed runs.

jobs table: PK = ``~openeo~<user>``, RK = the openEO job id: a user's jobs are one partition
(listing them one query), another user's job is not in it (a 404, as for none), and every
change is a conditional update on the record's ETag.
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import UpdateMode

from pipeline.lifecycle.tasks import if_match, now
from pipeline.storage.clients import Clients
from pipeline.storage.rows import Row, stored

PREFIX = "~openeo~"
MAX_PROCESS = 30_000  # characters of a process graph kept (a table property holds 32 K)


def partition(user: str) -> str:
    return f"{PREFIX}{user}"


def new_id(at: datetime) -> str:
    return f"oe{at:%Y%m%d-%H%M%S}-{secrets.token_hex(4)}"


@dataclass(frozen=True, kw_only=True)
class OpenEOJob(Row):
    """An openEO batch job: what the user asked (its process graph, title, description,
    budget), what it compiles to, and the bagpipe jobs its starts submitted."""

    owner_key: str = field(metadata=stored("PartitionKey"))
    id: str = field(metadata=stored("RowKey"))
    owner: str
    process: str  # the process (its graph and parameters), JSON, as the user sent it
    compiled: str  # graph.Compiled, JSON
    title: str = ""
    description: str = ""
    plan: str = ""
    budget: float | None = None  # USD: the job stops past it
    log_level: str = "info"
    created_at: datetime
    updated_at: datetime
    runs: str = ""  # the bagpipe jobs of its starts, comma-separated, newest last
    etag: str = field(default="", compare=False)
    written: ClassVar[frozenset[str]] = frozenset({"title", "description", "runs"})

    @property
    def run_ids(self) -> list[str]:
        return [r for r in self.runs.split(",") if r]

    @property
    def latest(self) -> str:
        """Its latest run's bagpipe job id ("" if never started)."""
        found = self.run_ids
        return found[-1] if found else ""


def create(clients: Clients, owner: str, process: str, compiled: str, **fields: Any) -> OpenEOJob:
    at = now()
    row = OpenEOJob(owner_key=partition(owner), id=new_id(at), owner=owner, process=process, compiled=compiled,
                    created_at=at, updated_at=at, **fields)
    meta = clients.jobs.create_entity(row.to_entity())
    return dataclasses.replace(row, etag=meta["etag"])


def get(clients: Clients, owner: str, job_id: str) -> OpenEOJob | None:
    """``owner``'s job ``job_id``, or None (another user's is none)."""
    if not job_id or len(job_id) > 64 or any(c in job_id for c in "/\\#?'\x7f") or not job_id.isprintable():
        return None
    try:
        return OpenEOJob.from_entity(clients.jobs.get_entity(partition(owner), job_id))
    except ResourceNotFoundError:
        return None


def list_for(clients: Clients, owner: str) -> list[OpenEOJob]:
    """``owner``'s jobs, the newest first."""
    found = [OpenEOJob.from_entity(e) for e in clients.jobs.query_entities(
        "PartitionKey eq @pk", parameters={"pk": partition(owner)})]
    return sorted(found, key=lambda j: j.created_at, reverse=True)


def update(clients: Clients, row: OpenEOJob, **changes: Any) -> OpenEOJob:
    """A conditional update of the record (HttpResponseError 412 if it changed meanwhile)."""
    changes["updated_at"] = now()
    meta = clients.jobs.update_entity(row.stored_changes(**changes), mode=UpdateMode.MERGE, **if_match(row.etag))
    return dataclasses.replace(row, **changes, etag=meta["etag"])


def delete(clients: Clients, row: OpenEOJob) -> None:
    try:
        clients.jobs.delete_entity(row.owner_key, row.id)
    except ResourceNotFoundError:
        pass
