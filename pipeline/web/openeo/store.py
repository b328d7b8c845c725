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

A table property holds 32 K characters, and a graph may be longer (a polygon of a few
thousand vertices): the process, and its compiled form, are kept in the record up to
:data:`INLINE` characters, and beyond it as a blob of the job's in ``bundles`` (the container
kept as long as a job may name what is in it, not expired nor evicted as a cache), named by
its digest (``openeo/<job>/<sha256>.json``), which the record names instead. A change writes
the new blob before the record names it and deletes the old one after; deleting the job
deletes its blobs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.data.tables import UpdateMode

from pipeline.lifecycle.tasks import if_match, now
from pipeline.storage.clients import Clients
from pipeline.storage.rows import Row, stored

PREFIX = "~openeo~"
INLINE = 30_000  # characters of a process (or its compiled form) kept in the record (a table property holds 32 K)
MAX_BYTES = 4 * 1024 * 1024  # a job's body (its process graph): a polygon of 100,000 vertices fits
KEPT = ("process", "compiled")  # the fields kept in a blob when longer than INLINE


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
    process: str  # the process (its graph and parameters), JSON, as the user sent it ("": in process_blob)
    compiled: str  # graph.Compiled, JSON ("": in compiled_blob)
    process_blob: str = ""  # a process longer than INLINE: its blob in bundles
    compiled_blob: str = ""
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


def blob_name(job_id: str, text: str) -> str:
    return f"openeo/{job_id}/{hashlib.sha256(text.encode()).hexdigest()}.json"


def _kept(clients: Clients, job_id: str, **texts: str) -> dict[str, str]:
    """The fields to store of ``texts`` (process, compiled): each inline, or, longer than
    :data:`INLINE`, written as a blob and named (``<name>_blob``), the field empty."""
    found: dict[str, str] = {}
    for name, text in texts.items():
        if len(text) <= INLINE:
            found |= {name: text, f"{name}_blob": ""}
            continue
        blob = blob_name(job_id, text)
        try:
            clients.transfers.upload(clients.bundles, blob, text.encode(), "application/json", overwrite=False)
        except HttpResponseError as exc:
            if exc.status_code not in (409, 412):  # there already: the same text, by its digest
                raise
        found |= {name: "", f"{name}_blob": blob}
    return found


def _drop(clients: Clients, blobs: list[str]) -> None:
    for blob in blobs:
        try:
            clients.bundles.delete_blob(blob)
        except ResourceNotFoundError:
            pass


def text_of(clients: Clients, row: OpenEOJob, name: str) -> str:
    """A record's process or compiled form (``name``), from the record or its blob."""
    blob = getattr(row, f"{name}_blob")
    if not blob:
        return str(getattr(row, name))
    return clients.transfers.download(clients.bundles, blob)[0].decode()


def create(clients: Clients, owner: str, process: str, compiled: str, **fields: Any) -> OpenEOJob:
    at = now()
    job_id = new_id(at)
    texts = _kept(clients, job_id, process=process, compiled=compiled)
    row = OpenEOJob(owner_key=partition(owner), id=job_id, owner=owner, created_at=at, updated_at=at,
                    **texts, **fields)  # type: ignore[arg-type]  # process, compiled and their blobs: str
    try:
        meta = clients.jobs.create_entity(row.to_entity())
    except Exception:
        _drop(clients, [b for b in (row.process_blob, row.compiled_blob) if b])
        raise
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
    """A conditional update of the record (HttpResponseError 412 if it changed meanwhile):
    a new process or compiled form written first (a blob if long), the blob it replaces
    deleted once the record no longer names it (the new one, if the update failed)."""
    texts = {name: changes.pop(name) for name in KEPT if name in changes}
    changes |= _kept(clients, row.id, **texts)
    changes["updated_at"] = now()
    before = {getattr(row, f"{name}_blob") for name in texts} - {""}
    after = {changes[f"{name}_blob"] for name in texts} - {""}
    try:
        meta = clients.jobs.update_entity(row.stored_changes(**changes), mode=UpdateMode.MERGE, **if_match(row.etag))
    except Exception:
        _drop(clients, sorted(after - before))
        raise
    _drop(clients, sorted(before - after))
    return dataclasses.replace(row, **changes, etag=meta["etag"])


def delete(clients: Clients, row: OpenEOJob) -> None:
    """Delete the record, then the blobs it names."""
    try:
        clients.jobs.delete_entity(row.owner_key, row.id)
    except ResourceNotFoundError:
        pass
    _drop(clients, [b for b in (row.process_blob, row.compiled_blob) if b])
