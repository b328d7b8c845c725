"""What speaking openEO costs on top of the native API: the seconds of translating a process
graph into a bagpipe request (``pipeline.web.openeo.graph``: parsed and checked by
openeo-pg-parser-networkx, walked into a ``JobRequest``) against what the native API does
with the same request when it is submitted or estimated — validated, its polygons or sites
read and summarized, and planned into its tasks (``application.plan``; no catalog search, no
storage) — for graphs as scientists write them: a year's monthly maximum NDVI over one 1°
tile and over a hundred, daily NDVI band math, a field's mean by aggregate_spatial, sites'
time series, a mask_polygon, and a graph of some 50,000 characters (a field of 2,000
vertices). Each is timed ``--repeat`` times (the median; CPU seconds of the process, as the
machine is shared), after one untimed run (the parser's import, seconds of CPU once per
process, is measured apart: ``first_compile_s``).

    python -m bench.openeo [--repeat N]

Last line: JSON, per graph its tasks, ``native_s`` (validate, keep, plan), ``translate_s``
(compile) and ``ratio`` (translate over native); ``worst_ratio`` over the graphs, and
``first_compile_s``. The goal (issue 46): the translation costs under 5 % of the native work.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from pipeline.requests import application, vectors
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.web.openeo import graph

BOX = {"west": -108.0, "south": 35.2, "east": -107.5, "north": 35.8}
WIDE = {"west": -110.0, "south": 30.0, "east": -100.0, "north": 40.0}  # a hundred 1° target tiles
FIELD = {"type": "Polygon", "coordinates": [[[-107.9, 35.3], [-107.6, 35.3], [-107.7, 35.7], [-107.9, 35.3]]]}


def _reducer(name: str) -> dict[str, Any]:
    return {"process_graph": {"r": {"process_id": name, "arguments": {"data": {"from_parameter": "data"}},
                                    "result": True}}}


def _graph(*nodes: tuple[str, str, dict[str, Any]], product: str = "MOD13A1", extent: Any = None,
           span: tuple[str, str] = ("2022-01-01", "2023-01-01"), bands: list[str] | None = None,
           fmt: str = "GTiff") -> dict[str, Any]:
    """load → the nodes in order (each reading the one before) → save_result."""
    flat: dict[str, Any] = {"load": {"process_id": "load_collection", "arguments": {
        "id": product, "spatial_extent": extent or BOX, "temporal_extent": list(span),
        "bands": bands or ["500m_16_days_NDVI"]}}}
    before = "load"
    for key, process, arguments in nodes:
        flat[key] = {"process_id": process, "arguments": {"data": {"from_node": before}, **arguments}}
        before = key
    flat["save"] = {"process_id": "save_result", "arguments": {"data": {"from_node": before}, "format": fmt},
                    "result": True}
    return {"process_graph": flat}


def _circle(vertices: int) -> dict[str, Any]:
    ring = [[round(-107.75 + 0.2 * math.cos(2 * math.pi * k / vertices), 7),
             round(35.5 + 0.2 * math.sin(2 * math.pi * k / vertices), 7)] for k in range(vertices)]
    return {"type": "Polygon", "coordinates": [[*ring, ring[0]]]}


MONTHLY = ("m", "aggregate_temporal_period", {"period": "month", "reducer": _reducer("max")})
SITES = {"type": "FeatureCollection", "features": [
    {"type": "Feature", "id": f"s{k}", "properties": {}, "geometry": {"type": "Point", "coordinates": [
        -107.95 + 0.004 * k, 35.25 + 0.005 * k]}} for k in range(100)]}
GRAPHS: dict[str, dict[str, Any]] = {
    "monthly-max-1-tile": _graph(MONTHLY),
    "monthly-max-100-tiles": _graph(MONTHLY, extent=WIDE),
    "daily-ndvi-band-math": _graph(("n", "ndvi", {}), product="MCD43A4", span=("2022-03-01", "2022-04-01"),
                                   bands=["red", "nir"]),
    "field-mean-aggregate-spatial": _graph(("z", "aggregate_spatial", {"geometries": FIELD,
                                                                       "reducer": _reducer("mean")}), fmt="CSV"),
    "100-sites-time-series": _graph(("z", "aggregate_spatial", {"geometries": SITES, "reducer": _reducer("mean")}),
                                    fmt="JSON"),
    "mask-polygon-monthly": _graph(("k", "mask_polygon", {"mask": FIELD}), MONTHLY),
    "2000-vertex-field-monthly": _graph(("c", "filter_spatial", {"geometries": _circle(2000)}), MONTHLY),
}


def _native(settings: Settings, body: dict[str, Any]) -> int:
    """What the native API does with a request before it is stored: validated, its vectors
    read and summarized (their digests alone: nothing stored), planned; its task count."""
    request = vectors.kept(JobRequest.model_validate(body), vectors.digest_only, lambda ref: {})
    return len(application.plan(settings, request))


def _median(run: Callable[[], Any], repeat: int) -> float:
    seconds = []
    for _ in range(repeat):
        began = time.process_time()
        run()
        seconds.append(time.process_time() - began)
    return statistics.median(seconds)


def measure(repeat: int) -> dict[str, Any]:
    settings = Settings(storage_connection="UseDevelopmentStorage=true")
    began = time.process_time()
    graph.compile_graph(GRAPHS["monthly-max-1-tile"])  # the parser imported (dask, xarray): once per process
    figures: dict[str, Any] = {"first_compile_s": round(time.process_time() - began, 3), "graphs": {}}
    for name, process in GRAPHS.items():
        body = graph.compile_graph(process).request.model_dump(mode="json", exclude_none=True)
        tasks = _native(settings, body)  # untimed, as the compile above: both warm
        native = _median(lambda: _native(settings, body), repeat)  # noqa: B023  # called before the loop moves on
        translate = _median(lambda: graph.compile_graph(process), repeat)  # noqa: B023
        figures["graphs"][name] = {"tasks": tasks, "graph_chars": len(json.dumps(process)),
                                   "native_s": round(native, 5), "translate_s": round(translate, 5),
                                   "ratio": round(translate / native, 4)}
    figures["worst_ratio"] = max(g["ratio"] for g in figures["graphs"].values())
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    figures = measure(args.repeat)
    for name, found in figures["graphs"].items():
        print(f"{name}: {found['tasks']} tasks, native {found['native_s'] * 1000:.1f} ms, translation "
              f"{found['translate_s'] * 1000:.1f} ms ({found['ratio']:.1%})")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
