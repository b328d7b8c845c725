"""The API's routes for reducers scientists upload (``pipeline.reduction.bundles``: the archive and
its checks; ``pipeline.web.registry``: versions, sharing, use).

``POST /api/reducers`` takes a bundle as a tar.gz body (``bagpipe reducers push DIR``) or as
multipart form files whose file names are their paths in the bundle (the portal). Its body
may be up to ``bundles.MAX_UPLOAD`` bytes; every other route keeps the API's 64 KiB.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from pipeline.reduction import bundles
from pipeline.storage.clients import Clients
from pipeline.web import registry
from pipeline.web.identity import Caller

UPLOAD_PATH = "/api/reducers"
_UPLOAD_BODY = {"requestBody": {"required": True, "content": {
    "application/gzip": {"schema": {"type": "string", "format": "binary"}},
    "multipart/form-data": {"schema": {"type": "object", "properties": {
        "files": {"type": "array", "items": {"type": "string", "format": "binary"}}}}},
}}}


class Sharing(BaseModel):
    model_config = ConfigDict(extra="forbid")
    users: Annotated[list[Annotated[str, Field(max_length=32)]], Field(max_length=256)] = []
    everyone: bool = False


async def _bundle_of(request: Request) -> bundles.Bundle:
    kind = request.headers.get("content-type", "")
    if kind.startswith("multipart/form-data"):
        form = await request.form(max_files=bundles.MAX_FILES + 1, max_fields=16)
        members = []
        for _, value in form.multi_items():
            if isinstance(value, UploadFile):
                members.append((value.filename or "", await value.read(), False))
        await form.close()
        return await run_in_threadpool(bundles.from_files, members)
    return await run_in_threadpool(bundles.from_tar, await request.body())


def add_routes(app: FastAPI, clients: Clients, signed_in: Callable[..., Caller]) -> None:
    @app.post(UPLOAD_PATH, status_code=201, openapi_extra=_UPLOAD_BODY)
    async def push(request: Request, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """Upload a reducer bundle: checked whole before anything is stored, then kept as the
        next version of my reducer of its manifest's name (or the latest, if unchanged)."""
        bundle = await _bundle_of(request)
        return await run_in_threadpool(registry.push, clients, caller.user, bundle)

    @app.get(UPLOAD_PATH)
    def catalog(caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """The reducers I may run: installed, mine, and others' shared with me."""
        return registry.catalog_for(clients, caller.user)

    @app.get(UPLOAD_PATH + "/{owner}/{name}")
    def show(owner: str, name: str, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """A reducer's versions (digest, size, date) and the jobs that ran each."""
        try:
            return registry.show(clients, caller.user, owner, name)
        except LookupError:
            raise HTTPException(404, f"no reducer {owner}/{name}") from None

    @app.post(UPLOAD_PATH + "/{owner}/{name}/share")
    def share(owner: str, name: str, body: Sharing, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """Who besides me may run it: named users, or everyone (its owner, or an admin)."""
        shared: dict[str, Any] = _changing(
            lambda: registry.share(clients, caller.user, owner, name, body.users, body.everyone), owner, name)
        return shared

    @app.delete(UPLOAD_PATH + "/{owner}/{name}")
    def delete_all(owner: str, name: str, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """Delete every version: no new job may name it (running ones finish)."""
        return {"deleted": _changing(lambda: registry.delete(clients, caller.user, owner, name), owner, name)}

    @app.delete(UPLOAD_PATH + "/{owner}/{name}/{version}")
    def delete_one(owner: str, name: str, version: int, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """Delete one version."""
        return {"deleted": _changing(lambda: registry.delete(clients, caller.user, owner, name, version),
                                     owner, name)}


def _changing(change: Callable[[], Any], owner: str, name: str) -> Any:
    try:
        return change()
    except LookupError as exc:  # the reducer, or the version of it, that is not there
        raise HTTPException(404, f"no reducer {exc.args[0] if exc.args else f'{owner}/{name}'}") from None
    except PermissionError as exc:
        raise HTTPException(403, str(exc)) from None
