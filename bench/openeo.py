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

``e2e``: the same work as a whole job both ways on one local stack (its own Azurite, which logs
every request it serves; ``--workers`` of ``--slots`` slots): ``--months`` of MOD13A1 NDVI from
January 2022, its maximum per month, over ``--tiles`` 1° target tiles, saved as GeoTIFF — the
official ``openeo`` client's job (connect, basic authentication, the graph built, created,
started, its status polled, its results listed: a STAC item of signed links) and the native
API's (submitted, its status polled, its manifest with links). Both look at their job every
``POLL_S`` seconds on one clock from its start (a look's own time not added to the wait: a
quicker answer would otherwise mean more looks, each a few storage calls), so that the figure
is the translation's and not two pollers' (the client's ``start_and_wait`` waits longer between
polls as a job goes on). ``--rounds`` pairs, the openEO job first in one round and the native
first in the next, each cold: the deployment's ``sources`` and ``tiles`` containers emptied
before it, so that it downloads every granule, reprojects every tile and reduces every month
(the two are the same work: either finds the other's outputs made). One untimed job of each
first makes the imitated archive's granules and warms both paths (the graph parser's import in
the API). Per job: the wall seconds from its first request (the client's connection; the native
submission) to its results listed — and of them the bagpipe job's own, from its row's creation
to its end (``job_s``: the same work on either side, and most of the machine's noise), the rest
(``around_s``) what each side adds around it —, and the storage requests Azurite served
meanwhile, by kind (table, queue, blob; the imitated archive's reads of granules apart, as
Planetary Computer is not the deployment's storage) — every component's, the API's, the control
loop's, the workers' and their stage processes', idle polls included. The two jobs' products
are then downloaded and compared pixel for pixel.

``processes``: issue 46's choice of who computes the pixel processes — bagpipe's own or
openeo-processes-dask's implementations, whichever is faster on the same tile. One MODIS tile
of MOD13A1 (``--pixels`` a side, 2400: the whole tile) as the local stack's imitation of the
archives synthesizes it, int16 with the product's fill and scale: one date's layers for the
per-date processes (``ndvi``; ``normalized_difference`` and an EVI as band math under
``reduce_dimension`` over bands; ``linear_scale_range`` under ``apply``; ``mask`` by
``apply(pixel_reliability, gt 1)``), and the year's 23 NDVI composites for ``reduce_dimension``
over t (``max``, ``min``, ``mean``, ``median``, ``sd``, ``count``). Each graph is compiled by
bagpipe's compiler; ours is what the worker runs from the stored values to the stored output
(the tile task's derived-layer expression over the decoded layers, encoded; the aggregate
stage's built-in reducer over the stored stack), theirs the same path with their process in
the middle (the same decoding and encoding, timed here; their process timed in
openeo-processes-dask's own virtualenv, ``bench.openeo_dask``, on the same decoded arrays),
each the median CPU seconds of ``--process-repeat`` runs. The two outputs are compared pixel
for pixel.

    python -m bench.openeo [--parts translation e2e processes] [--repeat N] [--months 12]
        [--tiles 1] [--rounds 4] [--workers 1] [--slots 2] [--pixels 2400] [--process-repeat 3]

Last line: JSON, per graph its tasks, ``native_s`` (validate, keep, plan), ``translate_s``
(compile) and ``ratio`` (translate over native); ``worst_ratio`` over the graphs, and
``first_compile_s``; with ``e2e``, ``e2e`` (every job's figures, and the means of each side)
with ``e2e_wall_ratio`` and ``e2e_calls_ratio`` (the openEO jobs' mean over the native jobs'
mean), ``e2e_around_s`` (each side's mean) and ``e2e_same_pixels``; with ``processes``,
``processes`` (per process ``ours_s``, ``theirs_s`` and of it ``theirs_process_s``, ``ratio``:
theirs over ours, and their agreement: ``with_data``, the share of pixels both have a value
at, ``max_abs_diff`` there, ``nodata_ours_only`` and ``nodata_theirs_only``,
``stored_alike``: the share stored alike once theirs is encoded as ours),
``processes_version`` and ``processes_tile``. The goal (issue 46): the translation costs
under 5 % of the native work.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import numpy as np
import openeo
from rasterio.io import MemoryFile

from bagpipe import modis_world
from bagpipe.azurite import Azurite
from bagpipe.client import Api
from bagpipe.stack import LocalStack
from pipeline.lifecycle import jobs
from pipeline.modis import tilestage
from pipeline.modis.products import CATALOG
from pipeline.reduction import AGGREGATE_STAGE
from pipeline.requests import application, vectors
from pipeline.requests.request import JobRequest
from pipeline.science import builtins
from pipeline.science.encoding import Encoding, decode, encode
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients, clients_for
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


POLL_S = 0.5  # both sides look at their job's status on this clock
NAMESPACE = "oeobench"  # the deployment's tables, queues and containers, told from the imitated archive's
NDVI = "500m_16_days_NDVI"
# a line of Azurite's access log: the method, the path past the account, the status
ACCESS = re.compile(r'"([A-Z]+) /[^/ ]+/([^ ]*) HTTP/[\d.]+" (\d{3})')


def e2e_work(months: int, tiles: int) -> tuple[dict[str, float], list[str], dict[str, Any]]:
    """The job both ways: the box over ``tiles`` 1° target tiles, openEO's span of ``months``
    from January 2022 (its end exclusive), and the native API's request for the same."""
    box = {"west": -108.0, "south": 35.2, "east": -108.0 + tiles - 0.5, "north": 35.8}
    end = date(2022 + months // 12, months % 12 + 1, 1)
    span = ["2022-01-01", end.isoformat()]
    last = date.fromordinal(end.toordinal() - 1)
    native = {"region": {"bbox": [box["west"], box["south"], box["east"], box["north"]]}, "start": span[0],
              "end": last.isoformat(), "products": ["MOD13A1"], "layers": {"MOD13A1": [NDVI]},
              "reduce": {"by": "month", "reducer": "max"}}
    return box, span, native


def next_look(began: float) -> None:
    """Wait for the next ``POLL_S`` mark since ``began``."""
    time.sleep(POLL_S - (time.monotonic() - began) % POLL_S)


def openeo_job(stack: LocalStack, box: dict[str, float], span: list[str],
               timeout: float = 3600) -> tuple[dict[str, str], str]:
    """The openEO client's job, as a script runs it, to its results listed: their links by
    file name, and the bagpipe job that ran it."""
    connection = openeo.connect(f"{stack.api_url}/openeo/1.2")
    connection.authenticate_basic("admin", stack.token)
    cube = connection.load_collection("MOD13A1", spatial_extent=box, temporal_extent=span, bands=[NDVI])
    job = cube.aggregate_temporal_period("month", "max").save_result(format="GTiff").create_job(title="bench")
    job.start_job()
    began = time.monotonic()
    while (state := job.status()) not in ("finished", "error", "canceled"):
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"openEO job {job.job_id} still {state} after {timeout:.0f} s")
        next_look(began)
    if state != "finished":
        raise RuntimeError(f"openEO job {job.job_id} ended {state}")
    listed = job.get_results().get_metadata()
    return {name: asset["href"] for name, asset in listed["assets"].items()}, listed["summaries"]["bagpipe:job"][0]


def native_job(stack: LocalStack, body: dict[str, Any], timeout: float = 3600) -> tuple[dict[str, str], str]:
    """The native API's job to its manifest listed: its monthly GeoTIFFs' links by file name
    (named as the openEO results name them), and the job."""
    api = Api(stack.api_url, stack.token)
    job = api.submit(body)["job"]
    began = time.monotonic()
    while (state := api.status(job)["state"]) not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"job {job} still {state} after {timeout:.0f} s")
        next_look(began)
    if state != "SUCCEEDED":
        raise RuntimeError(f"job {job} ended {state}")
    return {blob.rsplit("/", 1)[-1].replace("+", ""): link for task in api.results(job)["tasks"]
            if task["stage"] == AGGREGATE_STAGE for blob, link in task["links"].items()}, job


def storage_kind(path: str, namespace: str) -> str:
    """What a request of Azurite's access log went to: the deployment's ``table``, ``queue``
    or ``blob`` storage, or the imitated archive's granules (``archive``)."""
    resource = unquote(path.split("?")[0].split("/")[0]).split("(")[0]
    if resource.startswith(f"{namespace}-"):
        return "blob" if resource.removeprefix(f"{namespace}-") in names.CONTAINERS else "queue"
    if resource in ("Tables", "$batch") or resource.startswith(namespace):
        return "table"
    return "archive"


def served(log: Path, since: int, until: int) -> Counter[str]:
    """The requests Azurite served between two sizes of its log, by kind."""
    with log.open("rb") as read:
        read.seek(since)
        text = read.read(until - since).decode(errors="replace")
    return Counter(storage_kind(path, NAMESPACE) for _, path, _ in ACCESS.findall(text))


def emptied(clients: Clients) -> None:
    """The deployment's downloaded granules and made tiles deleted: the next job makes them all."""
    for container in (clients.sources, clients.tiles):
        for blob in container.list_blobs():
            container.delete_blob(blob.name)


def pixels(links: dict[str, str]) -> dict[str, np.ndarray]:
    found = {}
    for name, link in links.items():
        with MemoryFile(httpx.get(link, timeout=300).content) as memory, memory.open() as src:
            found[name] = src.read(1)
    return found


def same_pixels(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> bool:
    return sorted(ours) == sorted(theirs) and all(np.array_equal(v, theirs[k]) for k, v in ours.items())


def e2e(months: int, tiles: int, rounds: int, workers: int, slots: int) -> dict[str, Any]:
    """The openEO client's job and the native API's, cold, in interleaved pairs on one stack."""
    box, span, body = e2e_work(months, tiles)
    sides: dict[str, Callable[[LocalStack], tuple[dict[str, str], str]]] = {
        "openeo": lambda stack: openeo_job(stack, box, span), "native": lambda stack: native_job(stack, body)}
    ran: list[dict[str, Any]] = []
    same = []
    with tempfile.TemporaryDirectory() as tmp:
        azurite = Azurite(Path(tmp) / "azurite", access_log=True).start()
        log = azurite.location / "azurite.log"
        try:
            with LocalStack(Path(tmp) / "stack", workers=workers, slots=slots, connection=azurite.connection_string,
                            namespace=NAMESPACE) as stack:
                stack.wait_for_workers()
                clients = clients_for(stack.settings)
                for side in ("openeo", "native"):  # untimed: the archive's granules made, both paths warm
                    sides[side](stack)
                for number in range(rounds):
                    pair = {}
                    for side in ("openeo", "native") if number % 2 == 0 else ("native", "openeo"):
                        emptied(clients)
                        since, began = log.stat().st_size, time.monotonic()
                        pair[side], job = sides[side](stack)
                        wall, counted = time.monotonic() - began, served(log, since, log.stat().st_size)
                        calls = sum(n for kind, n in counted.items() if kind != "archive")
                        row = jobs.get(clients, job)
                        assert row.finished_at is not None
                        inside = (row.finished_at - row.created_at).total_seconds()
                        ran.append({"round": number, "side": side, "files": len(pair[side]), "wall_s": round(wall, 2),
                                    "job_s": round(inside, 2), "around_s": round(wall - inside, 2),
                                    "calls": calls, "by_kind": dict(sorted(counted.items()))})
                        print(f"round {number} {side}: {wall:.1f} s ({inside:.1f} s the job itself), {calls} storage "
                              f"calls {ran[-1]['by_kind']}, {len(pair[side])} files", flush=True)
                    openeo_pixels, native_pixels = pixels(pair["openeo"]), pixels(pair["native"])
                    same.append(same_pixels(openeo_pixels, native_pixels)
                                and any((v != -3000).any() for v in openeo_pixels.values()))
        finally:
            azurite.stop()
    means = {side: {figure: round(statistics.mean(j[figure] for j in ran if j["side"] == side), 2)
                    for figure in ("wall_s", "job_s", "around_s", "calls")} for side in sides}
    return {"e2e": {"months": months, "tiles": tiles, "workers": workers, "slots": slots, "poll_s": POLL_S,
                    "jobs": ran, "means": means},
            "e2e_wall_ratio": round(means["openeo"]["wall_s"] / means["native"]["wall_s"], 3),
            "e2e_calls_ratio": round(means["openeo"]["calls"] / means["native"]["calls"], 3),
            "e2e_around_s": {side: means[side]["around_s"] for side in sides},
            "e2e_same_pixels": all(same)}

# --- processes: bagpipe's executions of openEO's processes beside openeo-processes-dask's ------
ROOT = Path(__file__).resolve().parents[1]
THEIRS_PYTHON = ROOT / ".tools" / "openeo-processes" / "bin" / "python"  # make .tools/openeo-processes/.installed
# its side, in its interpreter (its warning that its machine-learning processes, not measured, are not loaded: off)
THEIRS_RUN = ("import logging, sys; logging.getLogger('openeo_processes_dask').setLevel(logging.ERROR); "
              "from bench.openeo_dask import run; run(sys.argv[1])")
TILE, DAY = "h08v05", date(2022, 7, 12)  # a MODIS tile of coast and land; a summer composite
YEAR = [date(2022, 1, 1) + timedelta(days=16 * k) for k in range(23)]  # MOD13A1's composites of 2022
PIXEL_LAYERS = {"red": "red_reflectance", "nir": "NIR_reflectance", "blue": "blue_reflectance", "ndvi": "NDVI",
                "reliability": "pixel_reliability"}  # the names bench.openeo_dask gives them: MOD13A1's layers


def _element(label: str) -> dict[str, Any]:
    return {"process_id": "array_element", "arguments": {"data": {"from_parameter": "data"}, "label": label}}


def _op(process: str, x: Any, y: Any, result: bool = False) -> dict[str, Any]:
    return {"process_id": process, "arguments": {"x": x, "y": y}} | ({"result": True} if result else {})


def _ref(node: str) -> dict[str, str]:
    return {"from_node": node}


_ND = {"process_graph": {"nir": _element("nir"), "red": _element("red"),
                         "nd": _op("normalized_difference", _ref("nir"), _ref("red"), result=True)}}
_EVI = {"process_graph": {  # 2.5 × (nir − red) / (nir + 6 red − 7.5 blue + 1)
    "nir": _element("nir"), "red": _element("red"), "blue": _element("blue"),
    "d": _op("subtract", _ref("nir"), _ref("red")), "r6": _op("multiply", 6, _ref("red")),
    "b7": _op("multiply", 7.5, _ref("blue")), "s1": _op("add", _ref("nir"), _ref("r6")),
    "s2": _op("subtract", _ref("s1"), _ref("b7")), "s3": _op("add", _ref("s2"), 1),
    "q": _op("divide", _ref("d"), _ref("s3")), "evi": _op("multiply", 2.5, _ref("q"), result=True)}}
_SCALED = {"process_graph": {"l": {"process_id": "linear_scale_range", "arguments": {
    "x": {"from_parameter": "x"}, "inputMin": -0.2, "inputMax": 1, "outputMin": 0, "outputMax": 255}, "result": True}}}
_CLOUDY = {"process_graph": {"g": _op("gt", {"from_parameter": "x"}, 1, result=True)}}
_MASK = {"process_graph": {
    "load": {"process_id": "load_collection", "arguments": {"id": "MOD13A1", "spatial_extent": BOX,
             "temporal_extent": ["2022-01-01", "2023-01-01"], "bands": [NDVI, "500m_16_days_pixel_reliability"]}},
    "ndvi": {"process_id": "filter_bands", "arguments": {"data": _ref("load"), "bands": [NDVI]}},
    "rel": {"process_id": "filter_bands", "arguments": {"data": _ref("load"),
                                                        "bands": ["500m_16_days_pixel_reliability"]}},
    "cloudy": {"process_id": "apply", "arguments": {"data": _ref("rel"), "process": _CLOUDY}},
    "m": {"process_id": "mask", "arguments": {"data": _ref("ndvi"), "mask": _ref("cloudy")}},
    "save": {"process_id": "save_result", "arguments": {"data": _ref("m"), "format": "GTiff"}, "result": True}}}
# per date, in the tile task: the graph, and the layers openeo-processes-dask's side reads
PIXEL_PROCESSES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "ndvi": (_graph(("n", "ndvi", {}), bands=["red", "nir"]), ("red", "nir")),
    "normalized_difference": (_graph(("r", "reduce_dimension", {"dimension": "bands", "reducer": _ND}),
                                     bands=["red", "nir"]), ("red", "nir")),
    "band_math_evi": (_graph(("r", "reduce_dimension", {"dimension": "bands", "reducer": _EVI}),
                             bands=["red", "nir", "blue"]), ("red", "nir", "blue")),
    "linear_scale_range": (_graph(("a", "apply", {"process": _SCALED})), ("ndvi",)),
    "mask": (_MASK, ("ndvi", "reliability")),
}
TEMPORAL_PROCESSES = ("max", "min", "mean", "median", "sd", "count")  # reduce_dimension over t, of NDVI


def tile_data(pixels: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """One real-sized MODIS tile of MOD13A1 as the local stack's imitation of the archives
    synthesizes it (``bagpipe.modis_world``: int16, the product's fill on water, its scale),
    cut to its middle ``pixels`` a side: ``DAY``'s layers by their ``PRODUCT.LAYER`` names, and the
    year's NDVI stack, its cloudy pixels (pixel reliability 3) written as the fill, as a
    product that leaves clouds out stores them (the imitation's MOD13A1 fills only water), so
    that a pixel has from none to all 23 of its dates."""
    product = CATALOG["MOD13A1"]
    cut = slice((product.pixels - pixels) // 2, (product.pixels + pixels) // 2)

    def stored(layer: str, day: date) -> np.ndarray:
        return modis_world.values(product, product.layer(f"500m_16_days_{layer}"), TILE, day)[cut, cut]

    layers = {f"MOD13A1.500m_16_days_{layer}": stored(layer, DAY) for layer in PIXEL_LAYERS.values()}
    fill = product.layer(NDVI).nodata
    stack = np.stack([np.where(stored("pixel_reliability", day) == 3, fill, stored("NDVI", day)).astype(np.int16)
                      for day in YEAR])
    return layers, stack


def _encoding(ref: str) -> Encoding:
    return CATALOG["MOD13A1"].layer(ref.split(".", 1)[1]).encoding


def agreement(ours: np.ndarray, theirs: np.ndarray, out: Encoding) -> dict[str, Any]:
    """Our stored output against theirs (physical values): the share of pixels where both
    have a value and the largest difference there, the pixels only one side has none at, and the share stored alike once
    theirs is encoded as ours is."""
    mine, other = decode(ours, out).astype(np.float64), np.asarray(theirs, np.float64)
    mine_none, other_none = np.isnan(mine), np.isnan(other)
    both = ~mine_none & ~other_none
    encoded = encode(other, out)
    alike = (encoded == ours) | (np.isnan(encoded.astype(np.float64)) & np.isnan(ours.astype(np.float64)))
    return {"with_data": round(float(both.mean()), 4),
            "max_abs_diff": float(np.abs(mine[both] - other[both]).max()) if both.any() else 0.0,
            "nodata_ours_only": int((mine_none & ~other_none).sum()),
            "nodata_theirs_only": int((other_none & ~mine_none).sum()),
            "stored_alike": round(float(alike.mean()), 6)}


def processes(repeat: int, pixels: int) -> dict[str, Any]:
    """Each process both ways on the same tile: ours as the worker runs it, from the stored
    values to the stored output (a tile task's derived layer: ``tilestage.derived_of``'s
    expression over the decoded layers, encoded; a reduction: ``builtins.reduce_stored`` or
    ``reduce_stream`` over the stored stack, as the aggregate stage picks them), and theirs
    on the same path — the same ``decode``, openeo-processes-dask's process (timed in its own
    interpreter: ``bench.openeo_dask``), the same ``encode`` — each the median CPU seconds of
    ``repeat`` runs after one on a corner."""
    if not THEIRS_PYTHON.exists():
        raise SystemExit(f"no {THEIRS_PYTHON}: make .tools/openeo-processes/.installed")
    began = time.monotonic()
    layers, stack = tile_data(pixels)
    print(f"processes: tile {TILE} of MOD13A1, {pixels} × {pixels}, {len(YEAR)} dates, synthesized in "
          f"{time.monotonic() - began:.0f} s", flush=True)
    ndvi = _encoding(f"MOD13A1.{NDVI}")
    corner = (slice(0, 64), slice(0, 64))
    # each process: ours (on given stored inputs), its output's encoding, theirs' decoded inputs
    ours: dict[str, Callable[[Any], np.ndarray]] = {}
    inputs: dict[str, Any] = {}
    outs: dict[str, Encoding] = {}
    work: dict[str, Any] = {}
    for name, (process, reads) in PIXEL_PROCESSES.items():
        derive = graph.compile_graph(process).request.model_dump(mode="json", exclude_none=True)["derive"]
        parsed = next(iter(tilestage.derived_of({"derived": json.dumps(derive["MOD13A1"])}).values()))
        ours[name] = lambda given, parsed=parsed: encode(parsed.evaluate(
            {ref: decode(given[ref], _encoding(ref)) for ref in parsed.names}), parsed.encoding())
        inputs[name] = layers
        outs[name] = parsed.encoding()
        work[name] = {"process": name, "inputs": {key: key for key in reads}}
    for name in TEMPORAL_PROCESSES:
        reduce = graph.compile_graph(_graph(("t", "reduce_dimension", {"dimension": "t", "reducer": _reducer(name)}))
                                     ).request.model_dump(mode="json", exclude_none=True)["reduce"]
        reducer = builtins.Reducer(reduce["reducer"])
        ours[name] = lambda given, reducer=reducer: _reduced(reducer, given, ndvi)
        inputs[name] = stack
        outs[name] = reducer.output_encoding(ndvi)
        work[name] = {"process": name, "inputs": {"stack": "stack"}}
    figures: dict[str, Any] = {}
    results: dict[str, np.ndarray] = {}
    for name, run in ours.items():
        given = inputs[name]
        run({k: v[corner] for k, v in given.items()} if isinstance(given, dict) else given[(slice(None), *corner)])
        results[name] = run(given)
        figures[name] = {"ours_s": round(_median(lambda: run(given), repeat), 4)}  # noqa: B023  # called at once
    # theirs' inputs, by the names bench.openeo_dask gives them: the stored values and their encoding
    stored = {key: (layers[f"MOD13A1.500m_16_days_{layer}"], _encoding(f"MOD13A1.500m_16_days_{layer}"))
              for key, layer in PIXEL_LAYERS.items()} | {"stack": (stack, ndvi)}
    with tempfile.TemporaryDirectory(prefix="bagpipe-processes-") as folder:
        for key, (values, encoding) in stored.items():
            np.save(Path(folder) / f"{key}.npy", decode(values, encoding))
        for name, job in work.items():  # theirs decodes what it reads, as ours does
            reads = [stored[key] for key in job["inputs"]]
            figures[name]["decode_s"] = _median(lambda: [decode(v, e) for v, e in reads], repeat)  # noqa: B023
        (Path(folder) / "work.json").write_text(json.dumps({"repeat": repeat, "processes": work}))
        subprocess.run([str(THEIRS_PYTHON), "-c", THEIRS_RUN, folder], cwd=ROOT, check=True)
        theirs = json.loads((Path(folder) / "theirs.json").read_text())
        for name, found in figures.items():
            result = np.load(Path(folder) / f"{name}.out.npy")
            encoding_s = _median(lambda: encode(result, outs[name]), repeat)  # noqa: B023
            core = theirs["seconds"][name]
            found["theirs_process_s"] = round(core, 4)
            found["theirs_s"] = round(found.pop("decode_s") + core + encoding_s, 4)
            found["ratio"] = round(found["theirs_s"] / found["ours_s"], 3)
            found |= agreement(results[name], result, outs[name])
    return {"processes": figures, "processes_version": f"openeo-processes-dask {theirs['version']}",
            "processes_tile": {"product": "MOD13A1", "tile": TILE, "pixels": pixels, "dates": len(YEAR),
                               "repeat": repeat}}


def _reduced(reducer: builtins.Reducer, stack: np.ndarray, encoding: Encoding) -> np.ndarray:
    """The aggregate stage's built-in reducer over a stored stack (``builtin._builtin``'s)."""
    shape = stack.shape[1:]
    if builtins.on_stored(reducer, encoding):
        return builtins.reduce_stored(reducer, lambda i: stack[i], YEAR, shape, encoding)
    return encode(builtins.reduce_stream(reducer, lambda i, rows: decode(stack[i, rows], encoding), YEAR, shape),
                  reducer.output_encoding(encoding))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=("translation", "e2e", "processes"),
                        default=["translation", "e2e", "processes"])
    parser.add_argument("--repeat", type=int, default=15, help="translation: runs of each graph (the median)")
    parser.add_argument("--months", type=int, default=12, help="e2e: months of 2022, from January")
    parser.add_argument("--tiles", type=int, default=1, help="e2e: 1° target tiles")
    parser.add_argument("--rounds", type=int, default=4, help="e2e: pairs of jobs, each side first in turn")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--pixels", type=int, default=2400, help="processes: the tile's side (a MODIS tile's 2400)")
    parser.add_argument("--process-repeat", type=int, default=3, help="processes: runs of each process (the median)")
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    if "translation" in args.parts:
        figures |= measure(args.repeat)
        for name, found in figures["graphs"].items():
            print(f"{name}: {found['tasks']} tasks, native {found['native_s'] * 1000:.1f} ms, translation "
                  f"{found['translate_s'] * 1000:.1f} ms ({found['ratio']:.1%})", flush=True)
    if "e2e" in args.parts:
        figures |= e2e(args.months, args.tiles, args.rounds, args.workers, args.slots)
        print(f"e2e: openEO {figures['e2e']['means']['openeo']}, native {figures['e2e']['means']['native']}: wall "
              f"{figures['e2e_wall_ratio']}, calls {figures['e2e_calls_ratio']}, same pixels "
              f"{figures['e2e_same_pixels']}", flush=True)
    if "processes" in args.parts:
        figures |= processes(args.process_repeat, args.pixels)
        for name, found in figures["processes"].items():
            print(f"{name}: ours {found['ours_s']:.3f} s, theirs {found['theirs_s']:.3f} s (their process "
                  f"{found['theirs_process_s']:.3f} s), ratio {found['ratio']}; {found['with_data']:.1%} with data, "
                  f"max |diff| "
                  f"{found['max_abs_diff']:.3g}, no data only ours {found['nodata_ours_only']}, only theirs "
                  f"{found['nodata_theirs_only']}, stored alike {found['stored_alike']:.4%}", flush=True)
        print(f"processes: {figures['processes_version']}", flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
