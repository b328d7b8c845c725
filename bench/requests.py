"""What the worst requests within the limits cost the API: the seconds ``POST /api/estimate``
takes (the request validated, expanded into its tasks, what it would store measured, each
task's work summed), for requests of up to ``BAGPIPE_MAX_TASKS`` (50,000) tasks whose target
tiles cost the most to find MODIS tiles for: the whole Earth in lon/lat tiles whose edges lie
on MODIS tile edges, in Mollweide (a quarter of the tiles off the Earth), in polar
stereographic north of 30°N, in a UTM zone far beyond its own, and a reduction over each
tile. Each on the real API against an Azurite of its own, sign-in and all (the rate limit off), measured once,
in seconds and in CPU seconds of the process (the API runs in it; on a shared machine the
wall clock also counts the others' work).

    python -m bench.requests [--only NAME ...]

Last line: JSON, per request its tasks, status, seconds and CPU seconds, ``worst_s`` and
``worst_cpu_s``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from bagpipe.azurite import Azurite
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web import identity
from pipeline.web.api import create_app

EARTH = [-180, -90, 180, 90]
REQUESTS: dict[str, dict[str, Any]] = {
    # name: the request's region and grid (one 8-day period of MOD10A2)
    "lonlat-1.25deg-earth": {"region": {"bbox": EARTH}, "grid": {"crs": "EPSG:4326", "tile_size": 1.25,
                                                                  "resolution": 0.01}},
    "lonlat-1.14deg-earth": {"region": {"bbox": EARTH}, "grid": {"crs": "EPSG:4326", "tile_size": 1.14,
                                                                  "resolution": 0.01}},
    "mollweide-115km-earth": {"region": {"bbox": EARTH}, "grid": {"crs": "ESRI:54009", "tile_size": 115_000,
                                                                   "resolution": 500}},
    "polar-65km-north-of-30N": {"region": {"bbox": [-180, 30, 180, 90]},
                                "grid": {"crs": "EPSG:3413", "tile_size": 65_000, "resolution": 500}},
    "utm33-60km-earth": {"region": {"bbox": [-180, -80, 180, 84]},
                         "grid": {"crs": "EPSG:32633", "tile_size": 60_000, "resolution": 500}},
    "lonlat-1.8deg-earth-reduced": {"region": {"bbox": EARTH}, "grid": {"crs": "EPSG:4326", "tile_size": 1.8,
                                                                         "resolution": 0.01},
                                    "reducer": {"name": "snow_fraction"}},
}


def body(name: str) -> dict[str, Any]:
    return {"start": "2022-01-01", "end": "2022-01-08", "products": ["MOD10A2"]} | REQUESTS[name]


def measure(only: list[str]) -> dict[str, Any]:
    figures: dict[str, Any] = {"requests": {}}
    with tempfile.TemporaryDirectory() as tmp:
        azurite = Azurite(Path(tmp) / "azurite").start()
        try:
            settings = Settings(storage_connection=azurite.connection_string, namespace="bench",
                                requests_per_minute=0)
            clients = Clients(settings)
            clients.ensure_resources()
            token = identity.bootstrap_admin(clients, None)
            with TestClient(create_app(settings), headers={names.TOKEN_HEADER: token}) as api:
                for name in only or list(REQUESTS):
                    started, cpu = time.perf_counter(), time.process_time()
                    response = api.post("/api/estimate", json=body(name))
                    took, used = time.perf_counter() - started, time.process_time() - cpu
                    answer = response.json()
                    tasks = answer.get("tasks")
                    figures["requests"][name] = {"status": response.status_code, "tasks": tasks,
                                                 "seconds": round(took, 2), "cpu_s": round(used, 2)}
                    print(f"{name:>28}: {response.status_code} {tasks or answer.get('detail', '')} tasks, "
                          f"{took:7.2f} s ({used:.2f} s of CPU)", flush=True)
        finally:
            azurite.stop()
    figures["worst_s"] = max(f["seconds"] for f in figures["requests"].values())
    figures["worst_cpu_s"] = max(f["cpu_s"] for f in figures["requests"].values())
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=[], choices=list(REQUESTS), help="these requests only")
    print(json.dumps(measure(parser.parse_args().only)))


if __name__ == "__main__":
    main()
