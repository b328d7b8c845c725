"""The web portal: its static page (``/``, ``/portal/…``) and the API routes only it needs
(the catalog of products and reducers, a job's page data, its quick-looks), on the same app
as the request API so it works wherever the API runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from pipeline import jobs, jobview, reducers
from pipeline.clients import Clients
from pipeline.products import CATALOG

STATIC = Path(__file__).resolve().parent.parent / "portal"


def add_portal(app: FastAPI, clients: Clients, authed: list[Any]) -> None:
    @app.get("/", include_in_schema=False)
    @app.get("/portal/", include_in_schema=False)  # in Azure: the anonymous route of the page
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/portal", StaticFiles(directory=STATIC), name="portal")

    @app.get("/api/catalog", dependencies=authed)
    def catalog() -> dict[str, Any]:
        """The products and the registered reducers a request may name."""
        return {
            "products": [{"name": p.name, "title": p.title, "period_days": p.period_days}
                         for p in CATALOG.values()],
            "reducers": [{"name": r.name, "description": r.description}
                         for r in sorted(reducers.catalog(clients.settings.reducers_path).values(),
                                         key=lambda r: r.name)],
            "max_tasks": clients.settings.max_tasks,
        }

    @app.get("/api/jobs/{job_id}/view", dependencies=authed)
    def job_view(job_id: str) -> dict[str, Any]:
        """The job page: status, tiles with their states, runtimes and the kill threshold,
        failed attempts with log links, time left."""
        jobs.get(clients, job_id)  # 404 if there is no such job
        return jobview.view(clients, job_id)

    @app.get("/api/jobs/{job_id}/quicklooks", dependencies=authed)
    def job_quicklooks(job_id: str) -> list[dict[str, Any]]:
        """The finished job's PNG quick-looks, with links and their lon/lat bounds."""
        jobs.get(clients, job_id)  # 404 if there is no such job
        return jobview.quicklooks(clients, job_id)
