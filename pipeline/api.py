"""The request API: one FastAPI app, served by uvicorn on the local stack and through the
Functions ASGI middleware in Azure.

Every ``/api/jobs`` endpoint requires a key: ``x-functions-key: KEY`` or
``Authorization: Bearer KEY``. In Azure the Functions host checks its function keys first
(``trust_host_auth``); locally the app checks ``BAGPIPE_API_KEY`` itself.
"""

from __future__ import annotations

import hmac
from typing import Any

from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pipeline import jobs, results
from pipeline.clients import clients_for
from pipeline.portal import add_portal
from pipeline.request import JobRequest, RequestError, expand
from pipeline.settings import Settings
from pipeline.status import JobState

MAX_BODY_BYTES = 64 * 1024


class FieldError(BaseModel):
    field: str  # dotted path into the request body, e.g. "region.bbox.0"
    message: str


class ErrorBody(BaseModel):
    """Every 4xx: what was wrong and, for a request body, which field. Some errors add
    figures (a request over the task limit says how many tasks it would make)."""

    model_config = ConfigDict(extra="allow")
    detail: str
    field: str | None = None
    errors: list[FieldError] | None = None


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": why}
    for code, why in ((400, "Bad parameter"), (401, "Missing or wrong API key"), (404, "No such job"),
                      (409, "Not in a state that allows it"), (413, "Request body too large"),
                      (503, "Storage unavailable: retry after the Retry-After seconds"),
                      (422, "Invalid request: the field and what is wrong with it"))
}


class BodyLimit:
    """Refuse request bodies over a size with 413, before anything reads them whole."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            await self._refuse(send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        response = JSONResponse(
            {"detail": f"request body larger than {self.limit} bytes", "field": "body"}, 413
        )
        await response({"type": "http"}, _no_receive, send)


class _TooLarge(Exception):
    pass


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def create_app(settings: Settings, *, trust_host_auth: bool = False) -> FastAPI:
    """The API for one deployment. Without ``trust_host_auth`` a key must be configured."""
    if not trust_host_auth and not settings.api_key:
        raise ValueError("the API needs BAGPIPE_API_KEY (or the Functions host's keys)")
    clients = clients_for(settings)
    header_key = APIKeyHeader(name="x-functions-key", auto_error=False)
    bearer = HTTPBearer(auto_error=False)

    def require_key(
        key: str | None = Depends(header_key),
        token: HTTPAuthorizationCredentials | None = Depends(bearer),
    ) -> None:
        if trust_host_auth:
            return
        given = key or (token.credentials if token else "")
        if not given or not hmac.compare_digest(given.encode(), settings.api_key.encode()):
            raise HTTPException(401, "a valid API key is required (x-functions-key or Bearer)",
                                headers={"WWW-Authenticate": "Bearer"})

    app = FastAPI(
        title="bagpipe",
        description="Bag-of-tasks processing of MODIS imagery on Azure.",
        openapi_url="/api/openapi.json",
        docs_url="/api/docs",
        redoc_url=None,
        responses=ERRORS,
    )
    authed = [Depends(require_key)]

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse({"detail": exc.message, "field": exc.field, **exc.extra}, exc.status)

    @app.exception_handler(ServiceRequestError)
    @app.exception_handler(ServiceResponseError)
    async def _storage_down(_: Request, exc: Exception) -> JSONResponse:
        """Storage unreachable (restarting, a network fault): say so, and when to retry."""
        return JSONResponse({"detail": f"storage is unavailable, retry shortly ({type(exc).__name__})"}, 503,
                            headers={"Retry-After": "5"})

    @app.exception_handler(jobs.JobNotFound)
    async def _no_job(_: Request, exc: jobs.JobNotFound) -> JSONResponse:
        return JSONResponse({"detail": f"no job {exc.args[0]!r}"}, 404)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"field": ".".join(str(p) for p in e["loc"] if p != "body") or "body", "message": e["msg"]}
            for e in exc.errors()
        ]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return JSONResponse({"detail": detail, "field": errors[0]["field"], "errors": errors}, 422)

    @app.post("/api/jobs", status_code=202, dependencies=authed)
    def submit(request: JobRequest) -> dict[str, Any]:
        """Submit a processing request; it is planned into tasks asynchronously."""
        row = jobs.submit(clients, request)
        return {"job": row["PartitionKey"], "state": row["State"], "total": row["Total"]}

    @app.post("/api/estimate", dependencies=authed)
    def estimate(request: JobRequest) -> dict[str, Any]:
        """How many tasks a request would make, without submitting it."""
        specs = expand(request, settings.max_tasks, reducers_path=settings.reducers_path)
        return {"tasks": len(specs), "limit": settings.max_tasks}

    @app.get("/api/jobs", dependencies=authed)
    def list_jobs(limit: int = 50) -> list[dict[str, Any]]:
        """The newest jobs first."""
        if not 1 <= limit <= 500:
            raise HTTPException(400, "limit must be between 1 and 500")
        return [
            {"job": r["PartitionKey"], "state": r["State"], "label": r.get("Label", ""),
             "total": r["Total"], "created": r["CreatedAt"].isoformat()}
            for r in jobs.list_jobs(clients, limit)
        ]

    @app.get("/api/jobs/{job_id}", dependencies=authed)
    def job_status(job_id: str) -> dict[str, Any]:
        """State, task counts per status, failure classes, progress and timestamps."""
        jobs.get(clients, job_id)
        return jobs.status(clients, job_id)

    @app.post("/api/jobs/{job_id}/cancel", status_code=202, dependencies=authed)
    def cancel(job_id: str) -> dict[str, Any]:
        """Cancel a job: no task starts after this; the job ends CANCELLED."""
        row = jobs.get(clients, job_id)
        if JobState(row["State"]).finished:
            raise HTTPException(409, f"job {job_id} already finished: {row['State']}")
        row = jobs.cancel(clients, job_id, owner=f"api-cancel-{job_id}")
        return {"job": job_id, "state": row["State"]}

    @app.get("/api/jobs/{job_id}/results", dependencies=authed)
    def job_results(job_id: str) -> dict[str, Any]:
        """The manifest of a finished job, with short-lived download links."""
        row = jobs.get(clients, job_id)
        found = results.manifest(clients, job_id)
        if found is None or not JobState(row["State"]).finished:
            raise HTTPException(409, f"job {job_id} has not finished: {row['State']}")
        return results.with_links(clients, job_id, found)

    add_portal(app, clients, authed)
    return BodyLimit(app, MAX_BODY_BYTES)  # type: ignore[return-value]
