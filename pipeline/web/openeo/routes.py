"""The openEO API's routes under ``/openeo/1.2`` (and ``/.well-known/openeo``), added to the
app by :func:`add_routes`.

Discovery (capabilities, conformance, file formats, collections, processes, the sign-in
methods) is open, as openEO clients read it before they sign in: it holds no user's data, as
the API's own OpenAPI page does not. Everything else is a signed-in user's (``signin``), and a
job is its owner's: another user's is answered as one that does not exist.

A job's state is its latest run's (``store``): ``created`` before a start; ``queued`` until
its first task runs; ``running``; then ``finished``, ``error`` (a task DEAD, or a budget
spent: the job stopped, what it made kept) or ``canceled``. Its progress is its tasks' (ended
over all), its usage and costs those measured (while it runs, its committed attempts'
seconds), and its results the products of the graph's result node as a STAC collection whose
assets are short-lived signed links.
"""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import HttpResponseError, ResourceExistsError
from fastapi import APIRouter, Body, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse
from starlette.routing import Match

from pipeline import failures
from pipeline.lifecycle import costs, jobs, results, rollups, snapshots, tasks
from pipeline.lifecycle.jobs import JobRow
from pipeline.lifecycle.status import JobState, TaskStatus
from pipeline.modis import layout, stacitems
from pipeline.modis.products import CATALOG
from pipeline.planning import RequestError
from pipeline.reduction import CUBE_GATHER, REDUCE_STAGE, SITES_GATHER, ZONES_GATHER, udf
from pipeline.requests import application, vectors
from pipeline.requests.request import JobRequest
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web import audit, ratelimit
from pipeline.web.identity import Caller
from pipeline.web.openeo import collections, graph, parameters, processes, signin, store
from pipeline.web.openeo.errors import RESPONSES, OpenEOError, OpenEORoute

API_VERSION = "1.2.0"
PREFIX = "/openeo/1.2"
PLAN = "pay-as-you-go"
COG = "image/tiff; application=geotiff; profile=cloud-optimized"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FILES = ("stdout.txt", "stderr.txt")  # what a program's attempt leaves in logs
ENDPOINTS = [
    ("/", ["GET"]), ("/conformance", ["GET"]), ("/credentials/basic", ["GET"]), ("/credentials/oidc", ["GET"]),
    ("/me", ["GET"]), ("/file_formats", ["GET"]), ("/udf_runtimes", ["GET"]), ("/service_types", ["GET"]),
    ("/collections", ["GET"]),
    ("/collections/{collection_id}", ["GET"]), ("/processes", ["GET"]), ("/validation", ["POST"]),
    ("/jobs", ["GET", "POST"]), ("/jobs/{job_id}", ["GET", "PATCH", "DELETE"]),
    ("/jobs/{job_id}/results", ["GET", "POST", "DELETE"]), ("/jobs/{job_id}/estimate", ["GET"]),
    ("/jobs/{job_id}/logs", ["GET"]),
]
CONFORMANCE = ["https://api.openeo.org/1.2.0", "https://api.stacspec.org/v1.0.0/collections"]
# what save_result writes (graph.FORMATS), as GET /file_formats lists it
FILE_FORMATS = {
    "GTiff": {"title": "GeoTIFF (Cloud-Optimized)", "gis_data_types": ["raster"], "parameters": {},
              "description": "A Cloud-Optimized GeoTIFF per product, tile and date (or group of dates), with its "
                             "layer's scale, offset, no-data and unit."},
    "netCDF": {"title": "netCDF-4 (CF)", "gis_data_types": ["raster"], "parameters": {},
               "description": "One CF-1.8 netCDF-4 file per layer over the region and dates, or per reduction over "
                              "its groups: time, y, x, the grid's CRS as a grid mapping, the layer's stored type "
                              "with its fill value, scale, offset and unit, a chunk per tile and date."},
    "Zarr": {"title": "Zarr (format 2, zipped)", "gis_data_types": ["raster"], "parameters": {},
             "description": "The same cube as netCDF's, as a Zarr store (format 2) in a zip file."},
    "CSV": {"title": "CSV (aggregate_spatial's table)", "gis_data_types": ["table"], "parameters": {},
            "description": "aggregate_spatial's statistics over polygons: a row per zone, band and date (or group "
                           "of dates) — zone, input, key, start, end, unit, then a column per statistic (p10… for "
                           "quantiles); at points, the sites' table: a row per site, band and date — site, lon, lat, "
                           "product, layer, date, value, unit, quality, usable, status, tile, row, col, granule…"},
    "Parquet": {"title": "Parquet (aggregate_spatial's table)", "gis_data_types": ["table"], "parameters": {},
                "description": "The same table as CSV's, as Apache Parquet (at points, GeoParquet)."},
    "JSON": {"title": "JSON (time series at points)", "gis_data_types": ["table"], "parameters": {},
             "description": "aggregate_spatial at points as openEO's time series: {date: [[a value per band] per "
                            "point, in the geometries' order]}, null where a point has no data."},
}


def _iso(when: datetime | None) -> str | None:
    return when.isoformat().replace("+00:00", "Z") if when else None


def _duration(seconds: float) -> str:
    return f"PT{max(0.0, seconds):.0f}S"


def _budget(given: Any, field: str = "budget") -> float | None:
    if given is None:
        return None
    if isinstance(given, bool) or not isinstance(given, (int, float)) or given < 0:
        raise OpenEOError(400, "BudgetInvalid", f"{field}: a budget is a number of US dollars, 0 or more")
    return float(given)


class Run:
    """What an openEO job's latest run (a bagpipe job) says: its state as openEO names it,
    progress, timestamps, usage and costs."""

    def __init__(self, clients: Clients, record: store.OpenEOJob) -> None:
        self.record, self.status = record, "created"
        self.row: JobRow | None = None
        self.progress, self.spent = 0.0, 0.0
        self.counts: dict[str, int] = {}
        if not record.latest:
            return
        try:
            row = jobs.get(clients, record.latest)
        except jobs.JobNotFound:
            return
        rollup, as_of = snapshots.look(clients, row.job, row.parts, row.state.finished, tiles=False)
        status = jobs.status(clients, row.job, rollup, row, as_of, workers=False)  # openEO shows no workers
        self.row, self.counts = row, status["counts"]
        self.progress = 100.0 * status["progress"]
        self.spent = row.cost_usd if row.cost_usd is not None else jobs.spent(rollup)
        began = sum(n for s, n in self.counts.items() if s != TaskStatus.PENDING.value and s != TaskStatus.QUEUED.value)
        state = row.state
        if state is JobState.ACCEPTED or (state is JobState.RUNNING and not began):
            self.status = "queued"
        elif state in (JobState.RUNNING, JobState.FINISHING):
            self.status, self.progress = "running", min(self.progress, 99.0)
        elif state is JobState.SUCCEEDED:
            self.status, self.progress = "finished", 100.0
        elif state is JobState.FAILED or row.error:
            self.status = "error"
        else:  # cancelled, or being cancelled, by its user
            self.status = "canceled"

    @property
    def active(self) -> bool:
        return self.status in ("queued", "running")

    def usage(self) -> dict[str, Any] | None:
        row = self.row
        if row is None:
            return None
        found: dict[str, Any] = {}
        if row.compute_s is not None:
            found["cpu"] = {"value": row.compute_s, "unit": "cpu-seconds"}
        if row.started_at:
            end = row.finished_at or tasks.now()
            found["duration"] = {"value": round((end - row.started_at).total_seconds(), 1), "unit": "seconds"}
        return found or None


def _summary(clients: Clients, record: store.OpenEOJob, run: Run, full: bool = False) -> dict[str, Any]:
    row = run.row
    found: dict[str, Any] = {
        "id": record.id, "title": record.title or None, "description": record.description or None,
        "status": run.status, "progress": round(run.progress, 1), "created": _iso(record.created_at),
        "updated": _iso(max(record.updated_at, row.updated_at) if row else record.updated_at),
        "plan": record.plan or PLAN, "budget": record.budget, "costs": round(run.spent, 4) if row else None,
        "log_level": record.log_level,
    }
    if row is not None:  # openEO 1.3's timestamps of the latest start
        found |= {"queued": _iso(row.created_at), "started": _iso(row.started_at), "finished": _iso(row.finished_at)}
    if full:
        found["process"] = json.loads(store.text_of(clients, record, "process"))
        found["usage"] = run.usage()
    return {k: v for k, v in found.items() if v is not None or k in ("title", "description", "costs", "budget")}


def _own(clients: Clients, caller: Caller, job_id: str) -> store.OpenEOJob:
    record = store.get(clients, caller.user.name, job_id)
    if record is None:
        raise OpenEOError(404, "JobNotFound", f"no batch job {job_id[:80]!r} (or not yours)")
    return record


def _compile(body: dict[str, Any], clients: Clients) -> graph.Compiled:
    """A body's process, compiled and its request checked as the native API checks one
    (task limit, layers, expressions): every refusal a 4xx naming the process or field."""
    process = body.get("process")
    if not isinstance(process, dict):
        raise OpenEOError(400, "ProcessGraphMissing", "process: the job's process {process_graph: {...}} is missing")
    try:
        compiled = graph.compile_graph(process, label=str(body.get("title") or ""))
        application.plan(clients.settings, compiled.request, compiled.program(), clients=clients)
    except parameters.CompileError as exc:
        raise OpenEOError(404 if exc.code == "CollectionNotFound" else 400, exc.code, exc.message) from None
    except RequestError as exc:
        raise OpenEOError(400, "ProcessGraphInvalid", f"the request it makes: {exc.field}: {exc.message}") from None
    return compiled


def _kept(clients: Clients, compiled: graph.Compiled) -> graph.Compiled:
    """A compiled graph whose polygons, zones and sites are kept in storage (each once, by
    its digest), its request naming them by digest and summary: what the job's record keeps
    (a table property holds 32 K characters; the polygons themselves are in its process)."""
    request = vectors.kept(compiled.request, lambda document: application.store_vector(clients, document),
                           lambda ref: application.load_vector(clients, ref))
    _store_udf(clients, compiled)
    return dataclasses.replace(compiled, request=request)


def _store_udf(clients: Clients, compiled: graph.Compiled) -> None:
    """Keep the bundle of the graph's UDF (if it runs one) in ``bundles`` under its digest,
    as an uploaded reducer's is: once, however many jobs run the same code and context."""
    made = compiled.bundle()
    if made is None:
        return
    try:
        clients.transfers.upload(clients.bundles, names.bundle_blob(made.digest), made.archive(), "application/gzip",
                                 overwrite=False)
    except ResourceExistsError:
        pass  # the same UDF, kept before: content-addressed


def _runnable(clients: Clients, record: store.OpenEOJob) -> JobRequest:
    """The request a start submits: the record's, or, if it names kept polygons, zones or
    sites, compiled again from the process, which holds them (a kept document unused for the
    cache's retention may be gone; submitting keeps it again)."""
    request = graph.Compiled.from_json(store.text_of(clients, record, "compiled")).request
    if not any(v is not None and v.kept is not None for v in (request.region, request.zones, request.sites)):
        return request
    try:
        return graph.compile_graph(json.loads(store.text_of(clients, record, "process")), label=record.title).request
    except parameters.CompileError as exc:
        raise OpenEOError(400, exc.code, exc.message) from None


def _entries(clients: Clients, row: JobRow) -> list[dict[str, Any]]:
    """A run's tasks as its manifest names them: the manifest's once it has finished, else
    read from its task rows (what has succeeded so far)."""
    if row.state.finished:
        found = results.manifest(clients, row.job)
        if found is not None:
            entries: list[dict[str, Any]] = found["tasks"]
            return entries
    return [{"task": t.task, "stage": t.stage, **layout.typed(params), "status": status.value, "outputs": outputs}
            for t in tasks.list_tasks(clients.tasks, row.parts) for params, status, outputs in t.places()]


def _is_result(entry: dict[str, Any], compiled: graph.Compiled, output: str) -> bool:
    """Whether a task's output is one of the job's results: a tile's layer or a reduction's
    output of the graph's result node as GeoTIFF; as netCDF or Zarr every cube the job made
    (the result's, and each layer's a reduction reads, or a layer the request makes beside
    the result, each named after its layer or reducer); as a table the zones' (or, at points,
    the sites') table in that format."""
    if compiled.format in graph.SERIES:  # aggregate_spatial's: the zones' or the sites' table in that format
        return entry["stage"] in (ZONES_GATHER, SITES_GATHER) and output.endswith(graph.SERIES[compiled.format])
    if compiled.format in graph.CUBES:
        return bool(entry["stage"] == CUBE_GATHER)
    if compiled.reduction:
        return layout.is_reduction(entry)
    if entry["stage"] != "modis":
        return False
    return layout.output_name(entry, output.rsplit("/", 1)[-1]) in compiled.layers.get(entry["product"], [])


def _asset(clients: Clients, entry: dict[str, Any], output: str) -> tuple[str, dict[str, Any]]:
    """A result's asset, by the file name a client saves it as (word characters, dots and
    dashes only, as openEO's Python client takes them: a tile's + sign is dropped; a layer's
    cube is named after its product too, as two products may have a layer of one name)."""
    file = output.rsplit("/", 1)[-1]
    first, last = layout.dates(entry)
    found: dict[str, Any] = {"href": results.sas_url(clients, *results.locate(clients, output)), "roles": ["data"],
                             "start_datetime": f"{first}T00:00:00Z", "end_datetime": f"{last}T23:59:59Z"}
    if layout.is_gather(entry):
        key = f"{entry['product']}.{file}" if entry.get("layer") else file
        suffix = ".zip" if file.endswith(".zip") else file[file.rfind("."):]
        return key, found | {"type": stacitems.TABLES.get(suffix, "application/octet-stream"),
                             "title": f"{layout.folder(entry)} {key} {first} to {last}"}
    return file.replace("+", ""), found | {"type": COG, "title": f"{layout.folder(entry)} {entry['tile']} "
                                                                f"{layout.span(entry)}"}


def _results(clients: Clients, base: str, record: store.OpenEOJob, run: Run) -> dict[str, Any]:
    """The results as a STAC collection (openEO 1.2): every product of the result node an
    asset with a signed link, the extent the request's."""
    compiled = graph.Compiled.from_json(store.text_of(clients, record, "compiled"))
    request = compiled.request
    row = run.row
    assert row is not None
    assets: dict[str, Any] = {}
    for entry in _entries(clients, row):
        for output in entry["outputs"]:
            if _is_result(entry, compiled, output):
                key, asset = _asset(clients, entry, output)
                assets[key] = asset
    bbox = list(_box_of(request) or (-180.0, -90.0, 180.0, 90.0))
    return {
        "stac_version": collections.STAC_VERSION, "stac_extensions": [], "type": "Collection", "id": record.id,
        "title": record.title or f"bagpipe job {record.id}", "description": record.description or (
            f"The results of openEO batch job {record.id} (bagpipe job {row.job})."),
        "license": "proprietary",
        "extent": {"spatial": {"bbox": [bbox]},
                   "temporal": {"interval": [[f"{request.start}T00:00:00Z", f"{request.end}T23:59:59Z"]]}},
        "summaries": {"bagpipe:job": [row.job]}, "openeo:status": run.status,
        "assets": dict(sorted(assets.items())),
        "links": [{"rel": "self", "href": f"{base}/jobs/{record.id}/results", "type": "application/json"},
                  {"rel": "root", "href": f"{base}/", "type": "application/json"}],
    }


def _box_of(request: JobRequest) -> tuple[float, float, float, float] | None:
    """The request's lon/lat box: its region's, or its polygons' (kept: their summary's)."""
    region = request.region
    if region is not None and region.bbox is not None:
        return region.bbox
    for where in (region, request.zones, request.sites):
        if where is not None and where.kept is not None and where.kept.bbox is not None:
            return where.kept.bbox
    return None


def _logs(clients: Clients, record: store.OpenEOJob, run: Run, level: str) -> list[dict[str, Any]]:
    """The job's log: its runs' failed attempts (class, message, a program's stdout and stderr
    as links) — a retried platform failure a warning, any other an error — and the job's own
    end (an error for a run that failed or was stopped), newest run last."""
    found: list[dict[str, Any]] = []
    for job in record.run_ids:
        try:
            row = jobs.get(clients, job)
        except jobs.JobNotFound:
            continue
        found.append({"id": f"{job}-queued", "level": "info", "message": f"started as bagpipe job {job} "
                      f"({row.total} tasks)", "time": _iso(row.created_at)})
        for attempt in reversed(rollups.newest_failures(clients.tasks, row.parts, 500)):
            transient = attempt.failure_class in {f.value for f in failures.TRANSIENT}
            entry: dict[str, Any] = {
                "id": f"{job}-{attempt.task}-{attempt.attempt}", "level": "warning" if transient else "error",
                "code": attempt.failure_class or "unknown",
                "message": f"task {attempt.task} ({attempt.stage}), attempt {attempt.attempt}: "
                           f"{attempt.failure_class}: {attempt.error}",
                "time": _iso(attempt.ended_at), "data": {"task": attempt.task, "attempt": attempt.attempt,
                                                          "stage": attempt.stage, "class": attempt.failure_class},
            }
            if attempt.stage == REDUCE_STAGE:
                entry["links"] = [{"rel": "related", "title": name, "type": "text/plain", "href": results.sas_url(
                    clients, clients.logs.container_name, names.log_prefix(job, attempt.task, attempt.attempt) + name)}
                    for name in LOG_FILES]
            found.append(entry)
        if row.state.finished:
            failed = row.state is not JobState.SUCCEEDED and (row.error or row.state is JobState.FAILED)
            ended = _counts(clients, job) if row.manifest else {}
            counts = ", ".join(f"{n} {s}" for s, n in sorted(ended.items()))
            found.append({"id": f"{job}-{row.state.value.lower()}", "level": "error" if failed else "info",
                          "message": f"bagpipe job {job} {row.state.value}" + (f": {row.error}" if row.error else "")
                          + (f" ({counts})" if counts else ""), "time": _iso(row.finished_at)})
    wanted = LOG_LEVELS.index(level)
    return [e for e in found if LOG_LEVELS.index(e["level"]) >= wanted]


def _counts(clients: Clients, job: str) -> dict[str, int]:
    found = results.manifest(clients, job)
    return dict(found.get("counts", {})) if found else {}


def add_routes(app: FastAPI, clients: Clients) -> None:
    """The openEO API's routes, in the app."""
    router = APIRouter(prefix=PREFIX, route_class=OpenEORoute, tags=["openEO"])
    caller_of = signin.authenticator(clients)
    # what compiles a graph or submits one spends from the user's request rate, as the native
    # API's submissions and estimates do (the same bucket): a refusal is openEO's error object
    spending = ratelimit.limited(caller_of, clients)
    settings = clients.settings

    def base_of(request: Request) -> str:
        return str(request.base_url).rstrip("/") + PREFIX

    @app.get("/.well-known/openeo", tags=["openEO"])
    def well_known(request: Request) -> dict[str, Any]:
        """The openEO versions served here."""
        return {"versions": [{"url": base_of(request) + "/", "api_version": API_VERSION, "production": False}]}

    @router.get("/")
    def capabilities(request: Request) -> dict[str, Any]:
        """What this back end is and what it serves (open: it holds no data)."""
        base = base_of(request)
        return {
            "api_version": API_VERSION, "backend_version": "bagpipe 0.1.0", "stac_version": collections.STAC_VERSION,
            "type": "Catalog", "id": "bagpipe", "title": "bagpipe", "production": False,
            "description": "MODIS imagery processed as a bag of tasks on Azure: a process graph runs as tile tasks "
                           "(a target tile, a date, a product) and grouped reductions.",
            "conformsTo": CONFORMANCE,
            "endpoints": [{"path": path, "methods": methods} for path, methods in ENDPOINTS
                          if path != "/credentials/oidc" or settings.entra_issuer],
            "billing": {"currency": "USD", "default_plan": PLAN, "plans": [{
                "name": PLAN, "paid": True, "description": "Azure's public prices for the compute and storage a "
                "job's tasks use (GET /jobs/{id}/estimate before, measured after)."}]},
            "links": [{"rel": "self", "href": f"{base}/", "type": "application/json"},
                      {"rel": "version-history", "href": str(request.base_url) + ".well-known/openeo",
                       "type": "application/json"},
                      {"rel": "data", "href": f"{base}/collections", "type": "application/json"},
                      {"rel": "conformance", "href": f"{base}/conformance", "type": "application/json"}],
        }

    @router.get("/conformance")
    def conformance() -> dict[str, Any]:
        return {"conformsTo": CONFORMANCE}

    @router.get("/file_formats")
    def file_formats() -> dict[str, Any]:
        """What save_result writes."""
        return {"input": {}, "output": FILE_FORMATS}

    @router.get("/udf_runtimes")
    def udf_runtimes() -> dict[str, Any]:
        """The UDF runtime a run_udf runs in: Python, its version and the libraries it imports."""
        return udf.runtimes()

    @router.get("/service_types")
    def service_types() -> dict[str, Any]:
        """None: bagpipe offers no secondary web services (its results are files)."""
        return {}

    @router.get("/credentials/oidc")
    def oidc() -> dict[str, Any]:
        """Microsoft Entra ID, where this deployment signs users in with it (elsewhere, as on
        the local stack, the endpoint is not there: the API's list of providers is never empty)."""
        if not settings.entra_issuer:
            raise OpenEOError(404, "NotFound", "this deployment signs in with HTTP Basic only (GET /credentials/basic)")
        return signin.oidc_providers(clients)

    @router.get("/credentials/basic")
    def basic(request: Request) -> dict[str, str]:
        """HTTP Basic with a personal API token as the password: that token, as the client's
        access token (``Bearer basic//TOKEN``)."""
        return signin.basic_token(clients, request)

    @router.get("/me")
    def me(caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        user = caller.user
        return {"user_id": user.name, "name": user.name, "email": user.email or None, "default_plan": PLAN,
                "budget": settings.default_budget_usd or None, "links": []}

    @router.get("/collections")
    def list_collections(request: Request) -> dict[str, Any]:
        base = base_of(request)
        return {"collections": [collections.collection(name, base, graph.common_names(name))
                                for name in sorted(CATALOG)],
                "links": [{"rel": "self", "href": f"{base}/collections", "type": "application/json"}]}

    @router.get("/collections/{collection_id}")
    def one_collection(collection_id: str, request: Request) -> dict[str, Any]:
        if collection_id not in CATALOG:
            raise OpenEOError(404, "CollectionNotFound", f"no collection {collection_id[:80]!r} (GET /collections)")
        return collections.collection(collection_id, base_of(request), graph.common_names(collection_id))

    @router.get("/processes")
    def list_processes() -> dict[str, Any]:
        """The processes bagpipe runs, each its official specification."""
        return {"processes": list(processes.specs()), "links": []}

    @router.post("/validation")
    def validation(body: dict[str, Any] = Body(...), caller: Caller = Depends(spending)) -> dict[str, Any]:
        """The process's errors, as a job made of it would be refused (none: it would run)."""
        try:
            _compile({"process": body}, clients)
        except OpenEOError as exc:
            return {"errors": [{"code": exc.code, "message": exc.message}]}
        return {"errors": []}

    @router.post("/jobs", status_code=201)
    def create_job(request: Request, body: dict[str, Any] = Body(...),
                   caller: Caller = Depends(spending)) -> Response:
        """Create a job (not started): its graph compiled and checked now, refused naming the
        process or field if bagpipe cannot run it."""
        compiled = _kept(clients, _compile(body, clients))
        record = store.create(
            clients, caller.user.name, json.dumps(body["process"]), compiled.to_json(),
            title=str(body.get("title") or "")[:200], description=str(body.get("description") or "")[:4000],
            plan=str(body.get("plan") or ""), budget=_budget(body.get("budget")),
            log_level=_level(body.get("log_level") or "info", "log_level"))
        audit.record(clients, caller.user.name, "openeo.create", record.id)
        location = f"{base_of(request)}/jobs/{record.id}"
        return Response(status_code=201, headers={"Location": location, "OpenEO-Identifier": record.id})

    @router.get("/jobs")
    def list_jobs(request: Request, limit: int = 100, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        if not 1 <= limit <= 1000:
            raise OpenEOError(400, "ParameterInvalid", "limit: between 1 and 1,000")
        found = store.list_for(clients, caller.user.name)[:limit]
        return {"jobs": [_summary(clients, r, Run(clients, r)) for r in found], "links": []}

    @router.get("/jobs/{job_id}")
    def get_job(job_id: str, caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        record = _own(clients, caller, job_id)
        return _summary(clients, record, Run(clients, record), full=True)

    @router.patch("/jobs/{job_id}", status_code=204)
    def patch_job(job_id: str, body: dict[str, Any] = Body(...), caller: Caller = Depends(spending)) -> Response:
        record = _own(clients, caller, job_id)
        if Run(clients, record).active:
            raise OpenEOError(400, "JobLocked", "the job is queued or running: cancel it (DELETE /jobs/{id}/results) "
                              "before changing it")
        changes: dict[str, Any] = {}
        if "process" in body:
            changes |= {"process": json.dumps(body["process"]),
                        "compiled": _kept(clients, _compile(body, clients)).to_json()}
        for name in ("title", "description", "plan"):
            if name in body:
                changes[name] = str(body[name] or "")[:4000]
        if "budget" in body:
            changes["budget"] = _budget(body["budget"])
        if "log_level" in body:
            changes["log_level"] = _level(body["log_level"] or "info", "log_level")
        if changes:
            _conditional(lambda: store.update(clients, record, **changes))
        return Response(status_code=204)

    @router.delete("/jobs/{job_id}", status_code=204)
    def delete_job(job_id: str, caller: Caller = Depends(caller_of)) -> Response:
        """Delete the job: a run still going is cancelled first (its products stay in storage
        for the retention rule's time, named by no job of the user's)."""
        record = _own(clients, caller, job_id)
        if Run(clients, record).active:
            jobs.cancel(clients, record.latest, owner=f"openeo-delete-{record.latest}")
        store.delete(clients, record)
        audit.record(clients, caller.user.name, "openeo.delete", job_id)
        return Response(status_code=204)

    @router.post("/jobs/{job_id}/results", status_code=202)
    def start_job(job_id: str, caller: Caller = Depends(spending)) -> Response:
        """Start the job: a bagpipe job of its request, unless one is queued or running. Its
        estimate is checked against its budget (or the user's default) first; a restart runs
        only what the earlier runs did not make (the rest is in the cache)."""
        record = _own(clients, caller, job_id)
        if Run(clients, record).active:
            return Response(status_code=202)
        request = _runnable(clients, record)
        compiled = graph.Compiled.from_json(store.text_of(clients, record, "compiled"))
        _store_udf(clients, compiled)  # kept again: a start long after the job was made runs it
        program = compiled.program()
        budget = record.budget if record.budget is not None else (settings.default_budget_usd or None)
        if budget is not None:
            estimate = costs.estimate(clients.runtimes, application.plan(settings, request, program, clients=clients),
                                      settings.min_samples)
            if estimate["usd"] > budget:
                raise OpenEOError(402, "PaymentRequired", f"budget: the job is estimated at "
                                  f"{costs.dollars(estimate['usd'])}, above its budget of {costs.dollars(budget)}")
        row = application.submit(clients, request, owner=caller.user.name, program=program, budget_usd=budget)
        try:
            store.update(clients, record, runs=",".join([*record.run_ids, row.job]))
        except HttpResponseError as exc:  # started at the same moment by another request: keep theirs
            if not tasks.is_conflict(exc):
                raise
            jobs.cancel(clients, row.job, owner=f"openeo-start-{row.job}")
        audit.record(clients, caller.user.name, "openeo.start", job_id, {"job": row.job, "tasks": row.total})
        return Response(status_code=202)

    @router.delete("/jobs/{job_id}/results", status_code=204)
    def cancel_job(job_id: str, caller: Caller = Depends(caller_of)) -> Response:
        record = _own(clients, caller, job_id)
        if Run(clients, record).active:
            jobs.cancel(clients, record.latest, owner=f"openeo-cancel-{record.latest}")
            audit.record(clients, caller.user.name, "openeo.cancel", job_id)
        return Response(status_code=204)

    @router.get("/jobs/{job_id}/results")
    def job_results(job_id: str, request: Request, partial: bool = False,
                    caller: Caller = Depends(caller_of)) -> JSONResponse:
        """The products of the graph's result, each a signed link; ``partial=true`` for what
        a job still running, or failed in part, has made so far."""
        record = _own(clients, caller, job_id)
        run = Run(clients, record)
        if run.row is None:
            raise OpenEOError(400, "JobNotStarted", "the job has not been started (POST /jobs/{id}/results)")
        if run.status != "finished" and not partial:
            raise OpenEOError(400, "JobNotFinished", f"the job is {run.status}: ask with partial=true for what it "
                              "has made so far")
        found = _results(clients, base_of(request), record, run)
        expires = tasks.now().timestamp() + settings.sas_minutes * 60
        return JSONResponse(found, headers={"OpenEO-Costs": f"{run.spent:.4f}",
                                            "Expires": datetime.fromtimestamp(expires).strftime(
                                                "%a, %d %b %Y %H:%M:%S GMT")})

    @router.get("/jobs/{job_id}/logs")
    def job_logs(job_id: str, offset: str | None = None, level: str = "debug", limit: int = 100,
                 caller: Caller = Depends(caller_of)) -> dict[str, Any]:
        """The job's failed attempts (class, message, a program's output) and how its runs ended."""
        record = _own(clients, caller, job_id)
        wanted = _level(level, "level")
        if not 1 <= limit <= 1000:
            raise OpenEOError(400, "ParameterInvalid", "limit: between 1 and 1,000")
        found = _logs(clients, record, Run(clients, record), wanted)
        start = 0
        if offset:
            ids = [e["id"] for e in found]
            start = ids.index(offset) + 1 if offset in ids else len(found)
        page = found[start:start + limit]
        links = [{"rel": "next", "href": f"{PREFIX}/jobs/{job_id}/logs?offset={page[-1]['id']}&level={wanted}"
                  f"&limit={limit}"}] if start + limit < len(found) and page else []
        return {"level": wanted, "logs": page, "links": links}

    @router.get("/jobs/{job_id}/estimate")
    def job_estimate(job_id: str, caller: Caller = Depends(spending)) -> dict[str, Any]:
        """Its tasks' compute time from the runtime history, and their cost at Azure's prices
        (an upper bound: what the cache holds costs almost nothing)."""
        record = _own(clients, caller, job_id)
        compiled = graph.Compiled.from_json(store.text_of(clients, record, "compiled"))
        found = costs.estimate(clients.runtimes, application.plan(settings, compiled.request, compiled.program()),
                               settings.min_samples)
        slots = max(1, settings.window)
        return {"costs": found["usd"], "duration": _duration(found["compute_s"] / slots),
                "downloads_included": None, "expires": _iso((tasks.now() + timedelta(hours=1)).replace(microsecond=0)),
                "bagpipe:tasks": found["tasks"], "bagpipe:compute_s": found["compute_s"],
                "bagpipe:known": found["known"]}

    served = list(router.routes)

    @router.api_route("/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
    def elsewhere(path: str, request: Request) -> Response:
        """What the routes above do not serve, refused with openEO's error object: a path
        with an empty segment is the same path without it (a client that joins its base URL
        and a path with a slash too many: 308, which keeps method and body), a path served by
        other methods is a 405, any other a 404."""
        if "//" in request.url.path:
            query = f"?{request.url.query}" if request.url.query else ""
            return RedirectResponse(re.sub("/{2,}", "/", request.url.path) + query, 308)
        if any(route.matches(request.scope)[0] is Match.PARTIAL for route in served):
            raise OpenEOError(405, "MethodNotAllowed", f"{request.method} is not served at /{path[:80]}")
        raise OpenEOError(404, "NotFound", f"no endpoint /{path[:80]} here (GET {PREFIX}/ lists them)")

    app.include_router(router, responses=RESPONSES)


def _level(given: Any, field: str) -> str:
    if given not in LOG_LEVELS:
        raise OpenEOError(400, "ParameterInvalid", f"{field}: one of {', '.join(LOG_LEVELS)}")
    return str(given)


def _conditional(write: Any) -> None:
    try:
        write()
    except HttpResponseError as exc:
        if not tasks.is_conflict(exc):
            raise
        raise OpenEOError(409, "Conflict", "the job changed meanwhile: read it again") from None
