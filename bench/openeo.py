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

    python -m bench.openeo [--parts translation e2e] [--repeat N] [--months 12] [--tiles 1]
        [--rounds 4] [--workers 1] [--slots 2]

Last line: JSON, per graph its tasks, ``native_s`` (validate, keep, plan), ``translate_s``
(compile) and ``ratio`` (translate over native); ``worst_ratio`` over the graphs, and
``first_compile_s``; with ``e2e``, ``e2e`` (every job's figures, and the means of each side)
with ``e2e_wall_ratio`` and ``e2e_calls_ratio`` (the openEO jobs' mean over the native jobs'
mean), ``e2e_around_s`` (each side's mean) and ``e2e_same_pixels``. The goal (issue 46): the
translation costs under 5 % of the native work.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import numpy as np
import openeo
from rasterio.io import MemoryFile

from bagpipe.azurite import Azurite
from bagpipe.client import Api
from bagpipe.stack import LocalStack
from pipeline.lifecycle import jobs
from pipeline.reduction import AGGREGATE_STAGE
from pipeline.requests import application, vectors
from pipeline.requests.request import JobRequest
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", nargs="+", choices=("translation", "e2e"), default=["translation", "e2e"])
    parser.add_argument("--repeat", type=int, default=15, help="translation: runs of each graph (the median)")
    parser.add_argument("--months", type=int, default=12, help="e2e: months of 2022, from January")
    parser.add_argument("--tiles", type=int, default=1, help="e2e: 1° target tiles")
    parser.add_argument("--rounds", type=int, default=4, help="e2e: pairs of jobs, each side first in turn")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--slots", type=int, default=2)
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
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
