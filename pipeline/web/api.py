"""The request API: one FastAPI app, served by uvicorn on the local stack and through the
Functions ASGI middleware in Azure.

Every ``/api`` endpoint but ``/api/auth`` and the link that confirms an address wants a
signed-in user (``pipeline.web.auth``: a personal API token, or in Azure an Entra sign-in); a
job is its owner's (an admin's is every job), and another user's job is answered as one that
does not exist. Users, tokens and the audit trail are in ``pipeline.web.accounts``; the
addresses a user's jobs may mail in ``pipeline.web.addresses``; uploaded reducers in
``pipeline.web.uploads``.
"""

from __future__ import annotations

from typing import Any, Literal

from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pipeline.lifecycle import costs, jobs, results
from pipeline.planning import RequestError, size
from pipeline.reduction import bundles
from pipeline.requests import application, vectors
from pipeline.requests.doubts import doubts
from pipeline.requests.request import JobRequest, program_name
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import clients_for
from pipeline.web import accounts, addresses, audit, auth, ratelimit, registry, stacapi, uploads
from pipeline.web.identity import Caller, IdentityError
from pipeline.web.openeo import routes as openeo
from pipeline.web.openeo import store as openeo_store
from pipeline.web.openeo.errors import OpenEOError
from pipeline.web.portal import add_portal

MAX_BODY_BYTES = 64 * 1024
MAX_VECTOR_BYTES = 32 * 1024 * 1024  # a request carrying its sites or zones, or a vector upload
# routes (method, path) whose body may be larger: a reducer bundle's upload; a request with its
# sites, zones or polygon inline (kept at submission as a document of their own, never in the job row)
LARGE_BODIES = {("POST", uploads.UPLOAD_PATH): bundles.MAX_UPLOAD, ("POST", "/api/jobs"): MAX_VECTOR_BYTES,
                ("POST", "/api/estimate"): MAX_VECTOR_BYTES, ("POST", "/api/vectors"): MAX_VECTOR_BYTES}
# an openEO process graph, with its polygons: creating, changing (any job's path: PATH/*) and validating one
LARGE_BODIES |= {("POST", f"{openeo.PREFIX}/jobs"): openeo_store.MAX_BYTES,
                 ("PATCH", f"{openeo.PREFIX}/jobs/*"): openeo_store.MAX_BYTES,
                 ("POST", f"{openeo.PREFIX}/validation"): openeo_store.MAX_BYTES}


class VectorUpload(BaseModel):
    """What ``POST /api/vectors`` takes: sites (a list of {id, lon, lat}, a GeoJSON
    FeatureCollection of Points, or CSV text), zones (a GeoJSON FeatureCollection of
    polygons) or a region's polygon (a GeoJSON Polygon or MultiPolygon)."""

    kind: Literal["sites", "zones", "region"]
    data: Any


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
    for code, why in ((400, "Bad parameter"), (401, "Not signed in: no valid API token or sign-in"),
                      (403, "Signed in, but not allowed"), (404, "No such job (or not yours)"),
                      (409, "Not in a state that allows it"), (413, "Request body too large"),
                      (429, "Too many submissions and estimates: retry after the Retry-After seconds"),
                      (503, "Storage unavailable: retry after the Retry-After seconds"),
                      (422, "Invalid request: the field and what is wrong with it"))
}


class BodyLimit:
    """Refuse request bodies over a size with 413, before anything reads them whole: the
    ``limit`` for every route but those ``larger`` names (method, path; a path ending ``/*``
    is any path of one more segment), which have their own (an openEO route's refusal is
    openEO's error object, as its others are)."""

    def __init__(self, app: ASGIApp, limit: int, larger: dict[tuple[str, str], int] | None = None) -> None:
        self.app, self.limit, self.larger = app, limit, larger or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        limit = self.larger.get((method, path), self.larger.get((method, path.rsplit("/", 1)[0] + "/*"), self.limit))
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await self._refuse(scope, send, limit)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await self._refuse(scope, send, limit)

    async def _refuse(self, scope: Scope, send: Send, limit: int) -> None:
        """413: the app's error body, or openEO's error object on an openEO route."""
        message = f"request body larger than {limit} bytes"
        response = OpenEOError(413, "PayloadTooLarge", message).response() if str(scope["path"]).startswith(
            f"{openeo.PREFIX}/") else JSONResponse({"detail": message, "field": "body"}, 413)
        await response({"type": "http"}, _no_receive, send)


class _TooLarge(Exception):
    pass


async def _no_receive() -> Message:
    return {"type": "http.disconnect"}


def create_app(settings: Settings) -> FastAPI:
    """The API for one deployment."""
    clients = clients_for(settings)
    signed_in = auth.authenticator(clients)
    spending = ratelimit.limited(signed_in, clients)  # signed in, and within the user's rate

    app = FastAPI(
        title="bagpipe",
        description="Bag-of-tasks processing of MODIS imagery on Azure.",
        openapi_url="/api/openapi.json",
        docs_url="/api/docs",
        redoc_url=None,
        responses=ERRORS,
    )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = exc.detail if isinstance(exc.detail, dict) else {"detail": exc.detail}
        return JSONResponse(body, exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return JSONResponse({"detail": exc.message, "field": exc.field, **exc.extra}, exc.status)

    @app.exception_handler(IdentityError)
    async def _identity_error(_: Request, exc: IdentityError) -> JSONResponse:
        return JSONResponse({"detail": exc.message, "field": exc.field}, exc.status)

    @app.exception_handler(bundles.BundleError)
    async def _bundle_error(_: Request, exc: bundles.BundleError) -> JSONResponse:
        return JSONResponse({"detail": exc.message, "field": exc.field}, 422)

    @app.exception_handler(ServiceRequestError)
    @app.exception_handler(ServiceResponseError)
    async def _storage_down(_: Request, exc: Exception) -> JSONResponse:
        """Storage unreachable (restarting, a network fault): say so, and when to retry."""
        return JSONResponse({"detail": f"storage is unavailable, retry shortly ({type(exc).__name__})"}, 503,
                            headers={"Retry-After": "5"})

    @app.exception_handler(jobs.JobNotFound)
    async def _no_job(_: Request, exc: jobs.JobNotFound) -> JSONResponse:
        job = str(exc.args[0])
        return JSONResponse({"detail": f"no job {job if len(job) <= 80 else job[:80] + '…'!r}"}, 404)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [  # a body that is not JSON is the body's fault (its loc's last part is a character offset)
            {"field": "body", "message": f"{e['msg']} (at character {e['loc'][-1]})"} if e["type"] == "json_invalid"
            else {"field": ".".join(str(p) for p in e["loc"] if p != "body") or "body", "message": e["msg"]}
            for e in exc.errors()
        ]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return JSONResponse({"detail": detail, "field": errors[0]["field"], "errors": errors}, 422)

    def mailable(request: JobRequest, caller: Caller) -> None:
        """Refuse a request whose completion would mail an address its user may not mail."""
        if request.email and not addresses.may_mail(clients, caller.user, str(request.email)):
            raise RequestError(403, "email", f"{request.email} has not agreed to your jobs' notifications: ask it "
                               f"to (POST /api/addresses, bagpipe addresses add; it gets a link to open), or name "
                               f"your own address ({caller.user.email}) or none")

    @app.post("/api/jobs", status_code=202)
    def submit(request: JobRequest, caller: Caller = Depends(spending)) -> dict[str, Any]:
        """Submit a processing request; it is planned into tasks asynchronously."""
        mailable(request, caller)
        named = program_name(request)
        program = registry.resolve(clients, caller.user, *named) if named else None
        row = application.submit(clients, request, owner=caller.user.name, program=program)
        job = row.job
        if program is not None:
            registry.record_use(clients, program, job, caller.user.name)
        audit.record(clients, caller.user.name, "job.submit", job, {"tasks": row.total}
                     | ({"reducer": program.label, "digest": program.digest} if program and program.digest else {}))
        return {"job": job, "state": row.state.value, "total": row.total}

    @app.post("/api/estimate")
    def estimate(request: JobRequest, caller: Caller = Depends(spending)) -> dict[str, Any]:
        """How many tasks a request would make, their compute time (from the runtime history)
        and what they would cost at Azure's public prices, without submitting it; ``confirm``:
        why it may not be what its user meant (a box across half the world, far more tasks than
        their last job), for a client to ask before it submits."""
        mailable(request, caller)
        named = program_name(request)
        program = registry.resolve(clients, caller.user, *named) if named else None
        plan = application.plan(settings, request, program, clients)
        application.check_storable(clients, request, plan, caller.user.name, program)  # refused now, as at submission
        found = costs.estimate(clients.runtimes, plan, settings.min_samples)
        last = next(iter(jobs.list_jobs(clients, 1, owner=caller.user.name)), None)
        return found | {"limit": settings.max_tasks,
                        "confirm": doubts(request, size(plan), (last.job, last.places) if last else None)}

    @app.post("/api/vectors", status_code=201)
    def keep_vectors(upload: VectorUpload, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """Keep sites, zones or a region's polygon (checked first; a refusal names what is
        wrong) and answer its digest, which a request names as ``{"kept": {"ref": …}}``."""
        document = vectors.document_of(upload.data, upload.kind, "data")
        ref = application.store_vector(clients, document)
        count = len(document.get("sites") or document.get("zones") or [1])
        audit.record(clients, caller.user.name, "vectors.keep", ref, {"kind": upload.kind, "count": count})
        return {"ref": ref, "kind": upload.kind, "count": count}

    @app.get("/api/jobs")
    def list_jobs(limit: int = 50, all: bool = False, caller: Caller = Depends(signed_in)) -> list[dict[str, Any]]:
        """My jobs, the newest first (an admin's ``all=true``: everyone's)."""
        if not 1 <= limit <= 500:
            raise HTTPException(400, "limit must be between 1 and 500")
        if all and not caller.user.admin:
            raise HTTPException(403, "only an admin may list every user's jobs")
        return [
            {"job": r.job, "state": r.state.value, "label": r.label, "owner": r.owner,
             "total": r.total, "created": r.created_at.isoformat()}
            for r in jobs.list_jobs(clients, limit, owner=None if all else caller.user.name)
        ]

    @app.get("/api/jobs/{job_id}")
    def job_status(job_id: str, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """State, task counts per status, failure classes, progress and timestamps."""
        return jobs.status(clients, job_id, row=jobs.get_for(clients, job_id, caller.user))  # its row read once

    @app.post("/api/jobs/{job_id}/cancel", status_code=202)
    def cancel(job_id: str, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """Cancel a job: no task starts after this; the job ends CANCELLED."""
        row = jobs.get_for(clients, job_id, caller.user)
        if row.state.finished:
            raise HTTPException(409, f"job {job_id} already finished: {row.state.value}")
        row = jobs.cancel(clients, job_id, owner=f"api-cancel-{job_id}")
        audit.record(clients, caller.user.name, "job.cancel", job_id)
        return {"job": job_id, "state": row.state.value}

    @app.get("/api/jobs/{job_id}/results")
    def job_results(job_id: str, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """The manifest of a finished job, with short-lived download links."""
        row = jobs.get_for(clients, job_id, caller.user)
        found = results.manifest(clients, job_id)
        if found is None or not row.state.finished:
            raise HTTPException(409, f"job {job_id} has not finished: {row.state.value}")
        return results.with_links(clients, job_id, found)

    @app.get("/api/jobs/{job_id}/logs")
    def job_logs(job_id: str, task: str | None = None, caller: Caller = Depends(signed_in)) -> list[dict[str, Any]]:
        """What a job's programs wrote (stdout and stderr of every attempt, successful or not,
        by task and attempt), with short-lived links to read it; ``task``: one task's, by its
        number."""
        if task is not None and not (task.isascii() and task.isdigit() and len(task) <= names.TASK_KEY_WIDTH):
            raise HTTPException(400, {"detail": f"task: a task's number, as status shows it (not {task[:20]!r})",
                                      "field": "task"})
        jobs.get_for(clients, job_id, caller.user)
        return results.logs(clients, job_id, None if task is None else names.task_key(int(task)))

    add_portal(app, clients, signed_in)
    accounts.add_routes(app, clients, signed_in)
    addresses.add_routes(app, clients, signed_in, spending)
    stacapi.add_routes(app, clients, signed_in)
    uploads.add_routes(app, clients, signed_in)
    openeo.add_routes(app, clients)
    # the ASGI app served is FastAPI behind its body limit; callers only serve it
    return BodyLimit(app, MAX_BODY_BYTES, LARGE_BODIES)  # type: ignore[return-value]  # an ASGI app, as FastAPI is
