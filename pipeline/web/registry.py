"""Uploaded reducers: their versions, who may use them, which jobs used them.

The bundle itself is a blob in ``bundles`` named by its digest (``pipeline.reduction.bundles``), so the
same content is stored once however many versions or users name it. The ``reducers`` table,
by partition:

- ``<owner>``: RK = ``<name>`` (sharing: ``SharedWith``, ``Everyone``) and RK =
  ``<name>@<version, 6 digits>`` (``Digest``, ``Size``, ``Files``, ``Description``,
  ``CreatedAt``): a range query lists a reducer's versions, the last is the latest.
- ``~shared~<user>`` and ``~everyone``: RK = ``<owner>:<name>``, what another user may run.
- ``~used~<owner>:<name>``: RK = ``<version>~<job>`` (``Owner``): the jobs that ran it.
- ``~digest~<digest>``: RK = ``<owner>:<name>@<version>``: who names a blob, so that a
  delete removes it only when nothing else does.

A request names ``name`` (mine, else an installed reducer), ``name@3``, or
``owner/name[@version]`` (someone else's, if they shared it with me or with everyone); the
job keeps the exact digest it resolved to. Private reducers of others are unknown names to
me, as their jobs are (an admin may use any).
"""

from __future__ import annotations

import json
import re
from typing import Any

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

from pipeline.lifecycle import jobs
from pipeline.lifecycle.tasks import now
from pipeline.planning import RequestError
from pipeline.reduction import reducers
from pipeline.reduction.bundles import Bundle
from pipeline.reduction.reducers import Program
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web import audit
from pipeline.web.identity import USER_NAME, User, get_user

REF = re.compile(r"^(?:(?P<owner>[a-z][a-z0-9_-]{0,31})/)?(?P<name>[a-z][a-z0-9_]{0,63})(?:@(?P<version>\d{1,6}))?$")
SHARED, EVERYONE, USED, DIGEST = "~shared~", "~everyone", "~used~", "~digest~"


def _vkey(name: str, version: int) -> str:
    return f"{name}@{version:06d}"


def _query(clients: Clients, partition: str, low: str = "", high: str = "~~") -> list[dict[str, Any]]:
    return list(clients.reducers.query_entities(
        "PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
        parameters={"pk": partition, "lo": low, "hi": high}))


def versions(clients: Clients, owner: str, name: str) -> list[dict[str, Any]]:
    """A reducer's version rows, oldest first (``@`` sorts before ``A``: the range is exact)."""
    return _query(clients, owner, f"{name}@", f"{name}A")


def _head(clients: Clients, owner: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(clients.reducers.get_entity(owner, name))
    except ResourceNotFoundError:
        return None


def may_use(head: dict[str, Any], user: User) -> bool:
    return (head["PartitionKey"] == user.name or user.admin or bool(head.get("Everyone"))
            or user.name in json.loads(head.get("SharedWith") or "[]"))


def push(clients: Clients, owner: User, bundle: Bundle) -> dict[str, Any]:
    """Store a validated bundle as the next version of ``owner``'s reducer of its name (the
    latest again if it is the same content); 409 for the name of an installed reducer."""
    name = bundle.reducer.name
    if name in reducers.catalog(clients.settings.reducers_path):
        raise RequestError(409, "reducer.json:name", f"{name!r} is the name of an installed reducer; "
                           "choose another")
    blob = names.bundle_blob(bundle.digest)
    try:
        clients.transfers.upload(clients.bundles, blob, bundle.archive(), "application/gzip", overwrite=False)
    except ResourceExistsError:
        pass  # the same content, stored before: content-addressed
    try:
        clients.reducers.create_entity({"PartitionKey": owner.name, "RowKey": name, "SharedWith": "[]",
                                        "Everyone": False})
    except ResourceExistsError:
        pass
    while True:
        known = versions(clients, owner.name, name)
        if known and known[-1]["Digest"] == bundle.digest:
            return _version_public(owner.name, name, known[-1]) | {"new": False}
        version = int(known[-1]["RowKey"].rsplit("@", 1)[1]) + 1 if known else 1
        row = {"PartitionKey": owner.name, "RowKey": _vkey(name, version), "Digest": bundle.digest,
               "Size": bundle.size, "Files": len(bundle.files), "Description": bundle.reducer.description,
               "Accepts": json.dumps(bundle.reducer.accepts), "CreatedAt": now()}
        try:
            clients.reducers.create_entity(row)
            break
        except ResourceExistsError:
            continue  # another push took that version: take the next
    clients.reducers.upsert_entity({"PartitionKey": f"{DIGEST}{bundle.digest}",
                                    "RowKey": f"{owner.name}:{_vkey(name, version)}"})
    audit.record(clients, owner.name, "reducer.push", f"{owner.name}/{name}@{version}", {"digest": bundle.digest})
    return _version_public(owner.name, name, row) | {"new": True}


def _version_public(owner: str, name: str, row: dict[str, Any]) -> dict[str, Any]:
    version = int(row["RowKey"].rsplit("@", 1)[1])
    return {"owner": owner, "name": name, "version": version, "ref": f"{owner}/{name}@{version}",
            "digest": row["Digest"], "size": row["Size"], "files": row["Files"],
            "description": row.get("Description", ""), "created": row["CreatedAt"].isoformat()}


def resolve(clients: Clients, user: User, ref: str, field: str = "reducer.name") -> Program:
    """What a request's reducer name runs for ``user``; RequestError 400 (naming ``field``)
    if it names nothing ``user`` may run."""
    parsed = REF.match(ref)
    installed = reducers.catalog(clients.settings.reducers_path)
    if parsed is None:
        raise RequestError(400, field, f"{ref!r} is not a reducer name ([owner/]name[@version])")
    owner, name, version = parsed["owner"], parsed["name"], parsed["version"]
    if owner is None and name in installed and version is None:
        return Program(name, accepts=installed[name].accepts)
    head = _head(clients, owner or user.name, name)
    if head is None or not may_use(head, user):
        known = ", ".join(sorted(installed)) or "none installed"
        raise RequestError(400, field, f"unknown reducer {ref!r} (installed: {known}; or one you "
                           "uploaded, or owner/name shared with you)")
    rows = versions(clients, head["PartitionKey"], name)
    if version is not None:
        rows = [r for r in rows if r["RowKey"] == _vkey(name, int(version))]
    if not rows:
        raise RequestError(400, field, f"{ref!r}: no such version")
    row = rows[-1]
    return Program(name, head["PartitionKey"], int(row["RowKey"].rsplit("@", 1)[1]), row["Digest"],
                   tuple(json.loads(row.get("Accepts") or "[]")))


def record_use(clients: Clients, program: Program, job: str, job_owner: str) -> None:
    if program.digest:
        clients.reducers.upsert_entity({"PartitionKey": f"{USED}{program.owner}:{program.name}",
                                        "RowKey": f"{program.version:06d}~{job}", "Owner": job_owner})


def catalog_for(clients: Clients, user: User) -> dict[str, Any]:
    """What ``user`` may run: the installed reducers, their own uploads, and others' shared
    with them (each with its latest version)."""
    def latest(owner: str, name: str) -> dict[str, Any] | None:
        rows = versions(clients, owner, name)
        return _version_public(owner, name, rows[-1]) if rows else None

    mine = [latest(user.name, r["RowKey"]) for r in _query(clients, user.name) if "@" not in r["RowKey"]]
    others = {r["RowKey"] for p in (f"{SHARED}{user.name}", EVERYONE) for r in _query(clients, p)}
    shared = [latest(*key.split(":", 1)) for key in sorted(others) if not key.startswith(f"{user.name}:")]
    return {"installed": [{"name": r.name, "description": r.description}
                          for r in sorted(reducers.catalog(clients.settings.reducers_path).values(),
                                          key=lambda r: r.name)],
            "mine": [m for m in mine if m], "shared": [s for s in shared if s]}


def show(clients: Clients, user: User, owner: str, name: str) -> dict[str, Any]:
    """A reducer's versions with the jobs that ran each (``user``'s own by id, others' as a
    count); LookupError if ``user`` may not see it."""
    head = _head(clients, owner, name) if USER_NAME.match(owner) else None
    if head is None or not may_use(head, user):
        raise LookupError(f"{owner}/{name}")
    used: dict[int, list[dict[str, Any]]] = {}
    for row in _query(clients, f"{USED}{owner}:{name}"):
        version, job = row["RowKey"].split("~", 1)
        used.setdefault(int(version), []).append({"job": job, "owner": row.get("Owner", "")})
    shown = []
    for row in versions(clients, owner, name):
        entry = _version_public(owner, name, row)
        runs = used.get(entry["version"], [])
        visible = [r["job"] for r in runs if user.admin or r["owner"] == user.name]
        shown.append(entry | {"jobs": visible, "other_jobs": len(runs) - len(visible)})
    sharing = {"users": json.loads(head.get("SharedWith") or "[]"), "everyone": bool(head.get("Everyone"))}
    return {"owner": owner, "name": name, "versions": shown,
            "sharing": sharing if owner == user.name or user.admin else None}


def _owned(clients: Clients, user: User, owner: str, name: str) -> dict[str, Any]:
    head = _head(clients, owner, name) if USER_NAME.match(owner) else None
    if head is None or not may_use(head, user):
        raise LookupError(f"{owner}/{name}")
    if owner != user.name and not user.admin:
        raise PermissionError(f"only {owner} may change {owner}/{name}")
    return head


def share(clients: Clients, user: User, owner: str, name: str, with_users: list[str], everyone: bool) -> dict[str, Any]:
    """Set who besides its owner may run the reducer (every version): named users, everyone."""
    head = _owned(clients, user, owner, name)
    unknown = [u for u in with_users if get_user(clients, u) is None]
    if unknown:
        raise RequestError(400, "users", f"no such user(s): {', '.join(unknown)}")
    before = set(json.loads(head.get("SharedWith") or "[]"))
    after = set(with_users) - {owner}
    for gone in before - after:
        _delete(clients, f"{SHARED}{gone}", f"{owner}:{name}")
    for new in after:
        clients.reducers.upsert_entity({"PartitionKey": f"{SHARED}{new}", "RowKey": f"{owner}:{name}"})
    if everyone:
        clients.reducers.upsert_entity({"PartitionKey": EVERYONE, "RowKey": f"{owner}:{name}"})
    else:
        _delete(clients, EVERYONE, f"{owner}:{name}")
    clients.reducers.upsert_entity({"PartitionKey": owner, "RowKey": name, "SharedWith": json.dumps(sorted(after)),
                                    "Everyone": everyone})
    audit.record(clients, user.name, "reducer.share", f"{owner}/{name}", {"users": sorted(after), "everyone": everyone})
    return {"users": sorted(after), "everyone": everyone}


def _delete(clients: Clients, partition: str, row: str) -> None:
    try:
        clients.reducers.delete_entity(partition, row)
    except ResourceNotFoundError:
        pass


def delete(clients: Clients, user: User, owner: str, name: str, version: int | None = None) -> list[int]:
    """Remove a version (or all): no new job may name it. Its blob goes too once no other
    version names the same digest and no unfinished job runs it (a job that has already
    resolved it keeps working until it ends). Returns the versions removed."""
    _owned(clients, user, owner, name)
    rows = [r for r in versions(clients, owner, name)
            if version is None or r["RowKey"] == _vkey(name, version)]
    if not rows:
        raise LookupError(f"{owner}/{name}@{version}")
    for row in rows:
        _delete(clients, owner, row["RowKey"])
        _delete(clients, f"{DIGEST}{row['Digest']}", f"{owner}:{row['RowKey']}")
    if not versions(clients, owner, name):
        share(clients, user, owner, name, [], False)
        _delete(clients, owner, name)
    for digest in {r["Digest"] for r in rows}:
        if not _query(clients, f"{DIGEST}{digest}") and not _running(clients, digest):
            try:
                clients.bundles.delete_blob(names.bundle_blob(digest))
            except ResourceNotFoundError:
                pass
    removed = [int(r["RowKey"].rsplit("@", 1)[1]) for r in rows]
    audit.record(clients, user.name, "reducer.delete", f"{owner}/{name}", {"versions": removed})
    return removed


def _running(clients: Clients, digest: str) -> bool:
    for job in jobs.active_jobs(clients):
        try:
            row = jobs.get(clients, job)
        except jobs.JobNotFound:
            continue
        program = Program.from_json(row.program) if row.program else None
        if program and program.digest == digest and not row.state.finished:
            return True
    return False

