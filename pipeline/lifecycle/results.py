"""A finished job's results: the manifest, with short-lived SAS download links."""

from __future__ import annotations

import json
import threading
import weakref
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.blob import BlobSasPermissions, BlobServiceClient, UserDelegationKey, generate_blob_sas

from pipeline.lifecycle.tasks import now
from pipeline.storage import names
from pipeline.storage.clients import Clients

KEY_HOURS = 1.0  # a user delegation key outlasts the first link it signs by this (Azure allows seven days)
_keys: weakref.WeakKeyDictionary[BlobServiceClient, UserDelegationKey] = weakref.WeakKeyDictionary()
_keys_lock = threading.Lock()


def delegation_key(service: BlobServiceClient, until: datetime) -> UserDelegationKey:
    """A user delegation key that signs links valid until ``until``: the one this process
    holds for ``service`` while it lasts that long, else a new one (for an hour longer).
    One key serves every link of a request, and every request until it nears its expiry."""
    with _keys_lock:
        key = _keys.get(service)
        if key is None or datetime.fromisoformat(str(key.signed_expiry)) < until:
            key = service.get_user_delegation_key(now() - timedelta(minutes=5), until + timedelta(hours=KEY_HOURS))
            _keys[service] = key
        return key


def sas_url(clients: Clients, container: str, blob: str) -> str:
    """A read-only link to one blob, valid for ``sas_minutes``: signed with the account
    key where there is one (local stack), else with a user delegation key (managed
    identity in Azure, where shared keys are off). The blob's name is percent-encoded in
    the link (a reduction may name its outputs as it likes: ``a b#?%é.tif``), as the SDK
    encodes it in its own URLs; the signature is of the name itself."""
    service = clients.blob_service
    start, expiry = now() - timedelta(minutes=5), now() + timedelta(minutes=clients.settings.sas_minutes)
    credential = service.credential
    key = getattr(credential, "account_key", None)
    kwargs: dict[str, Any] = {"account_key": key} if key else {"user_delegation_key": delegation_key(service, expiry)}
    token = generate_blob_sas(
        account_name=str(service.account_name),
        container_name=container,
        blob_name=blob,
        permission=BlobSasPermissions(read=True),
        start=start,
        expiry=expiry,
        **kwargs,
    )
    return f"{service.url.rstrip('/')}/{quote(container)}/{quote(blob, safe='/~')}?{token}"


def manifest(clients: Clients, job: str) -> dict[str, Any] | None:
    """The job's manifest as written at completion, or None before it exists."""
    try:
        data, _ = clients.transfers.download(clients.products, names.manifest_blob(job))
    except ResourceNotFoundError:
        return None
    manifest: dict[str, Any] = json.loads(data)
    return manifest


def locate(clients: Clients, output: str) -> tuple[str, str]:
    """Where an output named on a task row lives: a reprojected tile in ``tiles``, anything
    else in ``products``."""
    if output.startswith(names.TILE_OUTPUT_PREFIX):
        return clients.tiles.container_name, output.removeprefix(names.TILE_OUTPUT_PREFIX)
    return clients.products.container_name, output


def with_links(clients: Clients, job: str, found: dict[str, Any]) -> dict[str, Any]:
    """The manifest with a SAS link beside each output, to each pack of small outputs, to
    each overview image and to the manifest itself."""
    container = clients.products.container_name
    for task in found["tasks"]:
        task["links"] = {blob: sas_url(clients, *locate(clients, blob)) for blob in task["outputs"]}
    packs = {member["pack"] for member in found.get("packed", {}).values()}
    found["pack_links"] = {pack: sas_url(clients, container, pack) for pack in sorted(packs)}
    for image in found.get("overviews", []):
        image["links"] = {kind: sas_url(clients, container, image[kind]) for kind in ("picture", "map")}
    found["manifest_url"] = sas_url(clients, container, names.manifest_blob(job))
    return found


MAX_LOGS = 1000  # log files one answer lists (two an attempt)


def logs(clients: Clients, job: str, task: str | None = None) -> list[dict[str, Any]]:
    """The logs a job's programs left — every attempt's stdout and stderr, successful or not —
    or one task's, by task and attempt, each with its size and a short-lived link; at most
    :data:`MAX_LOGS` files, the first tasks first."""
    prefix = f"{job}/" if task is None else names.log_prefix(job, task, 0).rsplit("/", 2)[0] + "/"
    found = []
    for blob in clients.logs.list_blobs(name_starts_with=prefix, results_per_page=MAX_LOGS):
        parts = blob.name[len(job) + 1:].split("/")
        if len(parts) != 3 or not parts[1].isdigit():
            continue
        found.append({"task": parts[0], "attempt": int(parts[1]), "name": parts[2], "bytes": blob.size,
                      "link": sas_url(clients, clients.logs.container_name, blob.name)})
        if len(found) >= MAX_LOGS:
            break
    return found
