"""bagpipe's application: what a scientist's request (``request.JobRequest``) becomes — tile
tasks, then reductions — and what its finished products add to the job's manifest and
email. Importing it registers it with the lifecycle (``pipeline.planning``), with the
stages its tasks run and the checks that settle the ones the cache has made already.
"""

from __future__ import annotations

import json
from typing import Any

from azure.core.exceptions import ResourceNotFoundError

from pipeline import planning
from pipeline.lifecycle import jobs, results, storable
from pipeline.lifecycle.jobs import JobRow
from pipeline.lifecycle.status import JobState
from pipeline.modis import POINT_STAGE, TILE_STAGE, batches, cachedtiles, layout, overview, points, tilestage
from pipeline.modis.granules import from_param
from pipeline.planning import Finished, TaskPlan
from pipeline.redact import redact
from pipeline.reduction import builtin, bundles, cubes, gather, reducers, zonal
from pipeline.reduction import stage as reduction_stage
from pipeline.reduction.reducers import Program
from pipeline.requests import vectors
from pipeline.requests.expansion import expand, plan_of
from pipeline.requests.request import JobRequest, installed, program_name
from pipeline.requests.search import resolve, with_sources
from pipeline.science import vectors as science_vectors
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients

# imported for what they register
STAGES = (tilestage, reduction_stage, builtin, cachedtiles, points, gather, zonal, cubes)
SYNTHETIC_NOTE = "synthetic data (local imitation): made from granules the local stack synthesized, not from NASA's"


class Requests:
    """The application of ``planning.Application``: MODIS requests as tile tasks and reductions."""

    def plan(self, settings: Settings, request: str, resolved: str, *, search: bool, limit: int) -> list[TaskPlan]:
        batch = settings.tile_batch or (batches.MAX_TARGETS if settings.tile_stage == TILE_STAGE else 1)
        specs = expand(JobRequest.model_validate_json(request), limit, settings.tile_stage,
                       Program.from_json(resolved) if resolved else None, batch=batch)
        return plan_of(with_sources(resolve(settings, specs, TILE_STAGE, POINT_STAGE)) if search else specs)

    def entry(self, params: dict[str, str]) -> dict[str, Any]:
        return layout.typed(params)

    def finished(self, clients: Clients, row: JobRow, entries: list[dict[str, Any]]) -> Finished:
        name_installed_reducers(clients.settings, entries)
        missing: dict[str, str] = {}
        try:  # optional: the products stand without them, and the job says why they are missing
            pictures = overview.build(clients, row.job, entries) if row.outcome is not JobState.CANCELLED else []
        except Exception as exc:
            pictures, missing = [], {"overviews": f"{type(exc).__name__}: {redact(str(exc))}"}
        notes = [SYNTHETIC_NOTE] if any(g.synthetic for e in entries if e.get("granules")
                                        for g in from_param(e["granules"])) else []
        asked = asked_line(JobRequest.model_validate_json(row.request))
        return Finished({"catalog": catalog_of(clients.settings), "overviews": pictures,
                         **({"missing": missing} if missing else {})},
                        [asked] + ([_overview_line(clients, pictures)] if pictures else []), notes)


planning.register(Requests())


def plan(settings: Settings, request: JobRequest, program: Program | None = None,
         clients: Clients | None = None) -> list[TaskPlan]:
    """The tasks ``request`` makes (the catalog not searched: what submission counts and an
    estimate prices), its reducer resolved to ``program`` (else the installed one of its
    name), its vectors read and summarized (kept documents read through ``clients``);
    RequestError if it cannot run here."""
    if clients is not None:
        request = vectors.kept(request, vectors.digest_only, lambda ref: load_vector(clients, ref))
    named = program_name(request)
    if named is not None and program is None:
        program = installed(named[0], settings.reducers_path, named[1])
    return Requests().plan(settings, request.model_dump_json(), program.to_json() if program else "",
                           search=False, limit=settings.max_tasks)


def submit(clients: Clients, request: JobRequest, owner: str = "", program: Program | None = None,
           budget_usd: float | None = None) -> JobRow:
    """Store a valid request as ``owner``'s job and enqueue its plan message
    (``jobs.submit``); RequestError if it cannot run (then nothing is written). ``program``
    is the reduction the request's reducer resolved to (an uploaded bundle's exact digest);
    ``budget_usd`` what its measured cost may reach before it is stopped."""
    named = program_name(request)
    if named is not None and program is None:
        program = installed(named[0], clients.settings.reducers_path, named[1])
    request = vectors.kept(request, lambda document: store_vector(clients, document),
                           lambda ref: load_vector(clients, ref))
    tasks = plan(clients.settings, request, program)
    return jobs.submit(clients, request.model_dump_json(), tasks, owner, program.to_json() if program else "",
                       request.label, request.email or "", budget_usd, field_of=stored_field(request))


def check_storable(clients: Clients, request: JobRequest, tasks: list[TaskPlan], owner: str,
                   program: Program | None) -> None:
    """What submitting ``request`` (planned as ``tasks``) would store, measured as its
    submission measures it (``storable.check``, its vectors as the digests it would keep):
    RequestError 413 naming the field, at estimate."""
    request = vectors.kept(request, vectors.digest_only, lambda ref: load_vector(clients, ref))
    row = jobs.new_row(clients, request.model_dump_json(), tasks, owner, program.to_json() if program else "",
                       request.label, request.email or "")
    storable.check(clients, row.to_entity(), row.parts, tasks, stored_field(request))


# the request's field a task parameter comes from ("PROGRAM": the request's program, ``reducer``
# or ``reduce.program``)
PARAM_FIELDS = {"args": "PROGRAM.args", "reducer": "PROGRAM.name", "layers": "layers", "crs": "grid.crs",
                "product": "products", "sources": "grid.tile_size", "bounds": "grid.tile_size", "derived": "derive",
                "reduce": "reduce", "input": "reduce.inputs", "encodings": "reduce.inputs"}
# fields within a field of the request named apart from it (where a request's size lies)
NESTED = ("reducer.args", "reduce.program.args")


def stored_field(request: JobRequest) -> storable.FieldOf:
    """The request's field that makes a stored property large: the job row's ``Request``
    (the request's largest field, ``NESTED``'s apart from theirs), its ``Label``, ``Email``
    and ``Program``, and a task's ``Params`` (by its largest parameter)."""
    program = "reduce.program" if request.reduce is not None and request.reduce.program is not None else "reducer"
    fields: dict[str, Any] = json.loads(request.model_dump_json())

    def field_of(stored: str, param: str) -> str:
        if stored == "Params":
            return PARAM_FIELDS.get(param, "body").replace("PROGRAM", program)
        if stored != "Request":
            return {"Label": "label", "Email": "email", "Program": f"{program}.name"}.get(stored, "body")
        sizes = {name: _size(value) for name, value in fields.items()}
        for path in NESTED:
            value = _at(fields, path)
            if value:
                sizes[path] = _size(value)
                sizes[path.split(".")[0]] -= sizes[path]
        return max(sizes, key=lambda name: sizes[name])

    return field_of


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False))


def _at(fields: dict[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` of the request's fields (None where there is none)."""
    value: Any = fields
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def store_vector(clients: Clients, document: dict[str, Any]) -> str:
    """Keep a checked vector document in ``tiles`` under its digest (once: the same points
    again are the same blob); returns the digest."""
    digest = science_vectors.digest_of(document)
    blob = clients.tiles.get_blob_client(names.vector_blob(digest))
    if not blob.exists():
        clients.transfers.upload(clients.tiles, names.vector_blob(digest), science_vectors.canonical(document),
                                 "application/json")
    return digest


def load_vector(clients: Clients, digest: str) -> dict[str, Any]:
    """A kept vector document by its digest; KeyError if none is kept."""
    try:
        data, _ = clients.transfers.download(clients.tiles, names.vector_blob(digest))
    except ResourceNotFoundError:
        raise KeyError(digest) from None
    found: dict[str, Any] = json.loads(data)
    return found


def name_installed_reducers(settings: Settings, entries: list[dict[str, Any]]) -> None:
    """Give each reduction that ran a reducer installed on the workers its ``digest``, as a
    bundle's is named (the same canonical SHA-256 of its folder): its products' provenance."""
    installed_here = reducers.catalog(settings.reducers_path)
    digests: dict[str, str] = {}
    for entry in entries:
        name = entry.get("reducer")
        if name and not entry.get("bundle") and name in installed_here:
            if name not in digests:
                digests[name] = bundles.digest_of(installed_here[name].here)
            entry["digest"] = digests[name]


def catalog_of(settings: Settings) -> dict[str, str]:
    """Where the job's granules were searched (the provenance its STAC items name): the
    catalog's kind and its URL (secrets redacted)."""
    url = settings.stac_url if settings.catalog == "stac" else settings.cmr_url
    return {"kind": settings.catalog, "url": redact(url)}


def asked_line(request: JobRequest) -> str:
    """What the job was asked for, in a line of the email: its products and layers, span,
    region, grid and reduction (the email said only the job's id and label)."""
    made = ", ".join(f"{p} ({', '.join(request.layers[p])})" if request.layers and p in request.layers else p
                     for p in request.products)
    region = request.region
    if region is None:
        where = "the sites given"
    elif region.bbox is not None:
        where = f"the box {', '.join(f'{v:g}' for v in region.bbox)} (west, south, east, north)" + (
            ", masked by the polygon given" if region.masked else "")
    elif region.tiles:
        where = f"the MODIS tiles {', '.join(region.tiles)}"
    else:
        where = "the polygon given"
    grid = request.grid
    on = (f", on {grid.crs}" + (f" at {grid.resolution:g}" if grid.resolution else "")
          + (f" in tiles of {grid.tile_size:g}" if grid.tile_size else "")) if grid else ""
    found = f"Asked: {made}, {request.start} to {request.end}, over {where}{on}"
    if request.reducer is not None:
        found += f"; the program {request.reducer.name} over each product's span"
    if request.reduce is not None:
        if request.reduce.expression:
            what = f"the expression {request.reduce.expression}"
        elif request.reduce.program is not None:
            what = f"the program {request.reduce.program.name}"
        else:
            p = request.reduce.percentile
            what = f"the {request.reduce.reducer}" + (f" {p:g}" if p is not None else "")
        inputs = request.reduce.inputs
        named = ", ".join(inputs.values() if isinstance(inputs, dict) else inputs) if inputs else "every layer made"
        found += f"; reduced by {request.reduce.by}: {what} of {named}"
    return found + ".\n\n"


def _overview_line(clients: Clients, pictures: list[dict[str, Any]]) -> str:
    """The email's link to the job's first overview (its region, coloured, with a legend)."""
    first = pictures[0]
    link = results.sas_url(clients, clients.products.container_name, first["picture"])
    span = f"{first['date']} to {first['last']}" if first.get("last") else first["date"]
    return f"Overview of the region ({first['product']} {first['layer']}, {span}):\n{link}\n\n"
