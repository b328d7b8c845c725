"""The web portal: its static page (``/``, ``/portal/…``) and the API routes only it needs
(how to sign in, the catalog of products and reducers, a job's page data, its
quick-looks, a preview of its table), on the same app as the request API so it works wherever the API runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from pipeline.lifecycle import jobs
from pipeline.modis.products import CATALOG
from pipeline.requests.reductions import AGGREGATES
from pipeline.science import builtins
from pipeline.science.groups import CLIMATOLOGIES
from pipeline.storage.clients import Clients
from pipeline.web import auth, jobview, registry, tablepreview
from pipeline.web.identity import Caller

STATIC = Path(__file__).resolve().parents[2] / "portal"


def add_portal(app: FastAPI, clients: Clients, signed_in: Callable[..., Caller]) -> None:
    @app.get("/", include_in_schema=False)
    @app.get("/portal/", include_in_schema=False)  # in Azure: the anonymous route of the page
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/portal", StaticFiles(directory=STATIC), name="portal")

    @app.get("/api/auth")
    def sign_in_methods() -> dict[str, Any]:
        """How to sign in here: a personal API token, and in Azure the platform's Entra
        sign-in (open to all: it holds no data)."""
        return auth.methods(clients)

    @app.get("/api/catalog")
    def catalog(caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """The products, and the reducers a request of mine may name: the installed ones,
        my uploads and those shared with me (their latest versions)."""
        found = registry.catalog_for(clients, caller.user)
        uploaded = [{"name": r["name"] if r["owner"] == caller.user.name else f"{r['owner']}/{r['name']}",
                     "description": r["description"], "version": r["version"], "digest": r["digest"]}
                    for r in found["mine"] + found["shared"]]
        return {
            "products": [{"name": p.name, "title": p.title, "period_days": p.period_days,
                          "cadence": p.cadence, "default_layer": p.default.name,
                          "layers": [{"name": layer.name, "unit": layer.unit, "categorical": layer.categorical}
                                     for layer in p.layers]}
                         for p in CATALOG.values()],
            "reducers": found["installed"] + uploaded,
            # what reduce asks for (pipeline.requests.reductions): built-ins, groupings, aggregates
            "builtins": list(builtins.NAMES),
            "groupings": ["span", "month", "season", "year", "days:N", *CLIMATOLOGIES],
            "aggregates": list(AGGREGATES),
            "max_tasks": clients.settings.max_tasks,
        }

    @app.get("/api/jobs/{job_id}/view")
    def job_view(job_id: str, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """The job page: status, tiles with their states, runtimes and the kill threshold,
        failed attempts with log links, time left."""
        jobs.get_for(clients, job_id, caller.user)  # 404 if there is no such job of mine
        return jobview.view(clients, job_id)

    @app.get("/api/jobs/{job_id}/quicklooks")
    def job_quicklooks(job_id: str, caller: Caller = Depends(signed_in)) -> list[dict[str, Any]]:
        """The finished job's PNG quick-looks, with links and their lon/lat bounds."""
        jobs.get_for(clients, job_id, caller.user)
        return jobview.quicklooks(clients, job_id)

    @app.get("/api/jobs/{job_id}/tables/{kind}")
    def job_table(job_id: str, kind: Literal["sites", "zones"],
                  rows: int = Query(20, ge=1, le=tablepreview.MAX_ROWS),
                  id: str | None = Query(None, max_length=200, description="the site or zone whose series"),
                  caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """A finished job's sites or zones table: its first rows, how many it has, its ids and
        one site's or zone's series per layer (``id``'s, else the first's)."""
        row = jobs.get_for(clients, job_id, caller.user)
        if not row.state.finished:
            raise HTTPException(409, f"job {job_id} has not finished: {row.state.value}")
        try:
            return tablepreview.preview(clients, row, kind, rows, id)
        except tablepreview.TableMissing as exc:
            raise HTTPException(404, str(exc)) from exc
