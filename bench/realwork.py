"""Real work at the speed of the machine: bagpipe against what a scientist would run instead.

The job: MOD13A1 NDVI from 1 January 2022 over a box of the south-western United States
(MODIS tiles h08v05 and h09v05; on bagpipe's default grid, 1° tiles at 0.005°, 12 target
tiles), every date's NDVI on the target grid and the per-pixel maximum over the span
(``reduce``: span, ``max``); two months by default (4 composites, 60 tasks: a run of a few
minutes), a year with ``--months 12`` (23 composites, 288 tasks). Made twice, side by side
on one machine, from the same local STAC API (the Planetary Computer imitation) and the same
blob storage (Azurite behind it):

- **bagpipe**: the local stack (``bagpipe.stack.LocalStack``), ``--workers`` × ``--slots``;
  *cold* in a deployment of its own (nothing cached: every granule fetched, every tile
  warped), then *warm* (the same request again: the tiles in the cache);
- **xarray**: what Planetary Computer's notebooks do — ``pystac-client`` finds the items,
  ``odc.stac.load`` reads them on the MODIS grid (the same windowed COG reads a scientist's
  notebook makes), the pixels the product's quality layer calls unusable masked (as bagpipe
  masks them, before the warp), ``odc.geo``'s reproject onto the same lon/lat grid
  (bilinear, the same kernel width), and ``max`` over time — on dask with ``--threads``
  threads, in a process of its own (timed from after its imports).

Each round runs xarray, bagpipe cold, bagpipe warm, xarray again: interleaved pairs (cold
with the xarray run before it, warm with the one after). Before any is timed, every file the
job reads is made once by the imitation (it makes a file on its first read), so neither pays
for the world's synthesis. Wall times are bagpipe's job row's (created to finished) and
xarray's own; CPU is every process of each side (bagpipe: its workers' process trees, the
benchmark's process — API, control loop, the imitation — and Azurite; xarray: its process,
the imitation's and Azurite). The outputs are compared pixel for pixel: every date's tiles
and the maxima, against xarray's, in stored units (NDVI × 10,000) — everywhere, and within
three pixels of the h08v05/h09v05 edge, where a warp that sees one granule at a time makes a
seam.

    python -m bench.realwork [--rounds 2] [--months 2] [--workers 2] [--slots 2] [--threads 2]

Last line: one JSON object — ``cold_ratio`` and ``warm_ratio`` (bagpipe's wall ÷ xarray's,
the median pair), ``cpu_ratio`` (bagpipe's CPU ÷ xarray's, cold), ``finish_share`` (the
share of bagpipe's cold job after its last task's commit: the finisher's), ``seam_max_diff``
(the largest difference within three pixels of the MODIS tile edge, NDVI), and the figures
behind them.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil  # type: ignore[import-untyped]

from bagpipe.azurite import Azurite
from bagpipe.planetary import Planetary
from bagpipe.stack import LocalStack
from pipeline.lifecycle import attempts, jobs
from pipeline.lifecycle.status import JobState
from pipeline.modis.grid import TILE_SIZE, X_MIN, Tile
from pipeline.modis.products import CATALOG, periods
from pipeline.modis.reprojection import KERNEL  # bagpipe's kernel width, one source pixel: xarray's warp too
from pipeline.storage.clients import Clients

PRODUCT, LAYER = "MOD13A1", "500m_16_days_NDVI"
BOX = (-112.0, 34.0, -108.0, 37.0)  # west, south, east, north: MODIS tiles h08v05 and h09v05
RESOLUTION = 0.005  # bagpipe's default grid: 1° tiles of 200 × 200
SEAM = Tile(9, 5)  # its west edge is the edge between the job's two MODIS tiles
SEAM_PIXELS = 3  # "near the seam": within this many target pixels of it
TIMEOUT_S = 1800.0
POLL_S = 0.2


def request_of(months: int) -> dict[str, Any]:
    end = date(2022, 1, 1) + timedelta(days=round(months * 365 / 12) - 1)
    return {"region": {"bbox": list(BOX)}, "start": "2022-01-01", "end": min(end, date(2022, 12, 31)).isoformat(),
            "products": [PRODUCT], "reduce": {"by": "span", "reducer": "max"}, "email": "bench@example.org"}


# --- CPU, by process ---------------------------------------------------------------------------

def cpu_of(pids: list[int]) -> float:
    """CPU seconds of the processes ``pids`` and of the children they have waited for."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def sessions(roots: list[int]) -> list[int]:
    """Every process of the sessions ``roots`` lead (a worker, its fork server, its stages)."""
    found = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getsid(process.pid) in roots:
                found.append(process.pid)
        except OSError:
            continue
    return found


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Meter:
    """CPU seconds of each side's processes over a stretch of time."""

    def __init__(self, azurite: Azurite, workers: list[int] | None = None) -> None:
        assert azurite.process is not None
        self.azurite, self.workers = azurite.process.pid, workers or []

    def read(self) -> dict[str, float]:
        return {"azurite": cpu_of([self.azurite]), "workers": cpu_of(sessions(self.workers)), "benchmark": own_cpu()}

    @staticmethod
    def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: round(after[k] - before[k], 2) for k in before}


# --- the files, made once ----------------------------------------------------------------------

def materialize(planetary: Planetary, request: dict[str, Any]) -> int:
    """Make every file the job reads (the imitation makes one on its first read), so that
    no timed run pays for synthesizing the world."""
    product = CATALOG[PRODUCT]
    items = [planetary.item(product, tile, day) for tile in ("h08v05", "h09v05")
             for day in periods(product, date.fromisoformat(request["start"]), date.fromisoformat(request["end"]))]
    token = planetary.token(*_container_of(items[0]["assets"][LAYER]["href"]))["token"]
    hrefs = [item["assets"][name]["href"] for item in items for name in (LAYER, product.layer(LAYER).masked_by)]
    with httpx.Client(timeout=120) as http, ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda href: http.get(f"{href}?{token}", headers={"Range": "bytes=0-0"}).raise_for_status(),
                      hrefs))
    return len(hrefs)


def _container_of(href: str) -> tuple[str, str]:
    account, container = httpx.URL(href).path.strip("/").split("/")[:2]
    return account, container


# --- bagpipe ------------------------------------------------------------------------------------

def bagpipe_job(stack: LocalStack, body: dict[str, Any], meter: Meter) -> dict[str, Any]:
    """Submit the request and wait for its job: its wall time (the job row's), the share of
    it after its last task's commit, and the CPU each part spent."""
    clients = Clients(stack.settings)
    http = httpx.Client(base_url=stack.api_url, timeout=60, headers=stack.headers)
    before = meter.read()
    job = http.post("/api/jobs", json=body).raise_for_status().json()["job"]
    give_up = time.monotonic() + TIMEOUT_S
    row = jobs.get(clients, job)
    while not row.state.finished:
        if time.monotonic() > give_up:
            raise TimeoutError(f"job {job} did not finish within {TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)
        row = jobs.get(clients, job)
    spent = Meter.spent(before, meter.read())
    if row.state is not JobState.SUCCEEDED:
        raise RuntimeError(f"job {job} ended {row.state.value}: {row.error}")
    assert row.finished_at is not None
    wall = (row.finished_at - row.created_at).total_seconds()
    ended = [a.ended_at for a in attempts.list_attempts(clients.tasks, row.parts, "ended_at", "outcome")
             if a.ended_at and a.outcome in ("SUCCEEDED", "CACHED", "NO_DATA")]
    last = max(ended, default=row.created_at)
    counts = http.get(f"/api/jobs/{job}").json()["counts"]
    return {"job": job, "wall_s": round(wall, 2), "cpu_s": round(sum(spent.values()), 2), "cpu": spent,
            "after_last_commit_s": round((row.finished_at - last).total_seconds(), 2),
            "finish_share": round((row.finished_at - last).total_seconds() / wall, 3), "counts": counts}


def bagpipe_outputs(stack: LocalStack, job: str) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The job's products on the region's grid: each date's NDVI and the maximum (stored values)."""
    from pipeline.lifecycle import results
    from pipeline.modis import layout

    clients = Clients(stack.settings)
    manifest = results.manifest(clients, job)
    assert manifest is not None
    height, width = region_shape()
    fill = CATALOG[PRODUCT].layer(LAYER).fill
    dates: dict[str, np.ndarray] = {}
    maximum = np.full((height, width), fill, dtype="int16")
    for task in manifest["tasks"]:
        west, _, _, north = layout.numbers(task["bounds"])
        row, col = round((BOX[3] - north) / RESOLUTION), round((west - BOX[0]) / RESOLUTION)
        for output in task["outputs"]:
            if not output.endswith(".tif"):
                continue
            array = _read(clients, *results.locate(clients, output))
            if layout.is_reduction(task):
                into = maximum
            else:
                into = dates.setdefault(task["date"], np.full((height, width), fill, dtype="int16"))
            into[row:row + array.shape[0], col:col + array.shape[1]] = array
    return dates, maximum


def _read(clients: Clients, container: str, blob: str) -> np.ndarray:
    from rasterio.io import MemoryFile

    data, _ = clients.transfers.download(clients.blob_service.get_container_client(container), blob)
    with MemoryFile(data) as memory, memory.open() as raster:
        return np.asarray(raster.read(1))


def region_shape() -> tuple[int, int]:
    return round((BOX[3] - BOX[1]) / RESOLUTION), round((BOX[2] - BOX[0]) / RESOLUTION)


# --- xarray -------------------------------------------------------------------------------------

def xarray_run(stac_url: str, sas_url: str, body: dict[str, Any], threads: int, out: Path | None,
               meter: Meter) -> dict[str, Any]:
    """The same products by pystac-client, odc-stac and xarray on dask, in a process of its
    own: its wall time and CPU (its own, timed from after its imports, with the imitation's
    and Azurite's meanwhile)."""
    before = meter.read()
    args = {"stac": stac_url, "sas": sas_url, "start": body["start"], "end": body["end"], "threads": threads,
            "out": str(out) if out else ""}
    done = subprocess.run([sys.executable, "-m", "bench.realwork", "--xarray", json.dumps(args)],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode:
        raise RuntimeError(f"the xarray run failed:\n{done.stderr[-4000:]}")
    spent = Meter.spent(before, meter.read())
    found = json.loads(done.stdout.strip().splitlines()[-1])
    cpu = {"xarray": found["cpu_s"], "azurite": spent["azurite"], "benchmark": spent["benchmark"]}
    return {"wall_s": found["wall_s"], "cpu_s": round(sum(cpu.values()), 2), "cpu": cpu, "items": found["items"]}


def xarray_child(args: dict[str, Any]) -> None:
    """The xarray side, as a scientist's notebook runs it (``--xarray``)."""
    import dask
    import odc.geo.xr  # the .odc accessor
    import odc.stac
    import pystac_client
    import rasterio
    import xarray as xr
    from odc.geo.geobox import GeoBox

    from pipeline.modis import quality
    from pipeline.modis.targets import SINUSOIDAL_PROJ4

    dask.config.set(scheduler="threads", num_workers=args["threads"])
    started, cpu = time.perf_counter(), own_cpu()
    product = CATALOG[PRODUCT]
    layer = product.layer(LAYER)
    catalog = pystac_client.Client.open(args["stac"])
    items = [item for item in catalog.search(collections=[str(product.stac_collection)], bbox=list(BOX),
                                             datetime=f"{args['start']}/{args['end']}").items()
             if item.id.startswith(f"{PRODUCT}.") and item.properties["start_datetime"][:10] >= args["start"]]
    print(f"searched {time.perf_counter() - started:.2f}", file=sys.stderr)
    tokens: dict[str, str] = {}
    for item in items:
        for asset in item.assets.values():
            account, container = _container_of(asset.href)
            if container not in tokens:
                tokens[container] = httpx.get(f"{args['sas']}/{account}/{container}").json()["token"]
            asset.href = f"{asset.href}?{tokens[container]}"
    native = TILE_SIZE / product.pixels
    lonlat = GeoBox.from_bbox(BOX, crs="EPSG:4326", resolution=RESOLUTION)
    margin = 8 * native  # the kernel's reach past the region's footprint
    x0, y0, x1, y1 = rasterio.warp.transform_bounds("EPSG:4326", SINUSOIDAL_PROJ4, *BOX, densify_pts=101)
    x0 = X_MIN + np.floor((x0 - margin - X_MIN) / native) * native
    x1 = X_MIN + np.ceil((x1 + margin - X_MIN) / native) * native
    y0, y1 = np.floor((y0 - margin) / native) * native, np.ceil((y1 + margin) / native) * native
    grid = GeoBox.from_bbox((x0, y0, x1, y1), crs=SINUSOIDAL_PROJ4, resolution=native)
    with rasterio.Env(GDAL_DISABLE_READDIR_ON_OPEN="EMPTY_DIR", GDAL_HTTP_MERGE_CONSECUTIVE_RANGES="YES"):
        loaded = odc.stac.load(items, bands=[LAYER, layer.masked_by], geobox=grid, groupby="solar_day",
                               resampling="nearest", chunks={"x": 2048, "y": 2048}, fail_on_error=True)
        values, qa = loaded[LAYER], loaded[layer.masked_by]
        good = (values >= layer.valid[0]) & (values <= layer.valid[1]) & (values != layer.nodata)
        good &= xr.apply_ufunc(lambda codes: quality.usable(layer.masked_by, codes), qa, dask="parallelized",
                               output_dtypes=[bool])
        masked = values.where(good, layer.fill).astype(layer.dtype)
        masked.attrs["nodata"] = layer.fill
        warped = masked.odc.reproject(lonlat, resampling="bilinear", dst_nodata=layer.fill, **KERNEL)
        highest = warped.where(warped != layer.fill).max("time").fillna(layer.fill).astype(layer.dtype)
        print(f"planned {time.perf_counter() - started:.2f}", file=sys.stderr)
        dates, maximum = dask.compute(warped, highest)  # type: ignore[attr-defined,no-untyped-call]
        print(f"computed {time.perf_counter() - started:.2f}", file=sys.stderr)
    result = {"wall_s": round(time.perf_counter() - started, 2), "cpu_s": round(own_cpu() - cpu, 2),
              "items": len(items)}
    if args["out"]:
        days = [str(np.datetime_as_string(t, unit="D")) for t in dates.time.values]
        np.savez(args["out"], days=np.array(days), dates=dates.values, maximum=maximum.values)
    print(json.dumps(result))


# --- the comparison -----------------------------------------------------------------------------

def seam_mask() -> np.ndarray:
    """The target pixels within SEAM_PIXELS of the edge between h08v05 and h09v05."""
    height, width = region_shape()
    lon = BOX[0] + (np.arange(width) + 0.5) * RESOLUTION
    lat = BOX[3] - (np.arange(height) + 0.5) * RESOLUTION
    from pipeline.modis.grid import RADIUS

    x = np.radians(lon)[None, :] * RADIUS * np.cos(np.radians(lat))[:, None]
    edge = X_MIN + SEAM.h * TILE_SIZE
    step = np.radians(RESOLUTION) * RADIUS * np.cos(np.radians(lat))[:, None]
    return np.asarray(np.abs(x - edge) <= SEAM_PIXELS * step)


def compare(ours: tuple[dict[str, np.ndarray], np.ndarray], theirs_file: Path) -> dict[str, Any]:
    """bagpipe's products against xarray's, in NDVI: the largest difference where both
    have a value, near the seam and elsewhere, and the pixels only one has a value at."""
    scale, fill = CATALOG[PRODUCT].layer(LAYER).scale, CATALOG[PRODUCT].layer(LAYER).fill
    found = np.load(theirs_file)
    theirs = dict(zip((str(d) for d in found["days"]), found["dates"], strict=True))
    near = seam_mask()
    worst = {"seam": 0, "elsewhere": 0, "one_sided": 0, "pixels": 0}
    pairs = [(ours[0].get(day), array) for day, array in theirs.items()] + [(ours[1], found["maximum"])]
    for mine, other in pairs:
        if mine is None:
            worst["one_sided"] += int((other != fill).sum())
            continue
        both = (mine != fill) & (other != fill)
        diff = np.abs(mine.astype(int) - other.astype(int))
        worst["seam"] = max(worst["seam"], int(diff[both & near].max(initial=0)))
        worst["elsewhere"] = max(worst["elsewhere"], int(diff[both & ~near].max(initial=0)))
        worst["one_sided"] += int(((mine != fill) != (other != fill)).sum())
        worst["pixels"] += int(both.sum())
    return {"dates": len(theirs), "seam_max_diff": round(worst["seam"] * scale, 4),
            "max_diff_elsewhere": round(worst["elsewhere"] * scale, 4),
            "pixels_compared": worst["pixels"], "pixels_one_sided": worst["one_sided"]}


# --- the run ------------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--months", type=int, default=2, help="the span, from 1 January 2022")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="xarray's dask threads")
    parser.add_argument("--xarray", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.xarray:
        xarray_child(json.loads(args.xarray))
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    body = request_of(args.months)
    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bagpipe-realwork-") as tmp:
        home = Path(tmp)
        azurite = Azurite(home / "azurite").start()
        try:
            with Planetary(azurite.connection_string) as planetary:
                made = materialize(planetary, body)
                print(f"{made} files made by the imitation before timing", file=sys.stderr)
                meter = Meter(azurite)
                for index in range(args.rounds):
                    first = xarray_run(planetary.stac_url, planetary.sas_url, body, args.threads,
                                       home / "xarray.npz" if index == 0 else None, meter)
                    print(f"round {index + 1}: xarray {first['wall_s']} s", file=sys.stderr)
                    with LocalStack(home / f"stack{index}", workers=args.workers, slots=args.slots,
                                    connection=azurite.connection_string, namespace=f"real{index}",
                                    overrides={"tile_stage": "modis"}) as stack:
                        stack.wait_for_workers()
                        with_workers = Meter(azurite, [p.pid for p in stack.worker_processes])
                        cold = bagpipe_job(stack, body, with_workers)
                        print(f"round {index + 1}: bagpipe cold {cold['wall_s']} s", file=sys.stderr)
                        compared = compare(bagpipe_outputs(stack, cold["job"]), home / "xarray.npz") \
                            if index == 0 else None
                        warm = bagpipe_job(stack, body, with_workers)
                        print(f"round {index + 1}: bagpipe warm {warm['wall_s']} s", file=sys.stderr)
                    second = xarray_run(planetary.stac_url, planetary.sas_url, body, args.threads, None, meter)
                    print(f"round {index + 1}: xarray {second['wall_s']} s", file=sys.stderr)
                    rounds.append({"xarray_cold": first, "bagpipe_cold": cold, "bagpipe_warm": warm,
                                   "xarray_warm": second, **({"compared": compared} if compared else {})})
        finally:
            azurite.stop()
    report(rounds, body, args)


def report(rounds: list[dict[str, Any]], body: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"{'round':>5} {'xarray s':>9} {'cold s':>8} {'ratio':>6} {'cold CPU':>9} {'xarray CPU':>11}"
          f" {'warm s':>7} {'xarray s':>9} {'ratio':>6} {'after last commit s':>20}")
    for i, r in enumerate(rounds, 1):
        cold, warm, x1, x2 = r["bagpipe_cold"], r["bagpipe_warm"], r["xarray_cold"], r["xarray_warm"]
        print(f"{i:>5} {x1['wall_s']:>9} {cold['wall_s']:>8} {cold['wall_s'] / x1['wall_s']:>6.2f}"
              f" {cold['cpu_s']:>9} {x1['cpu_s']:>11} {warm['wall_s']:>7} {x2['wall_s']:>9}"
              f" {warm['wall_s'] / x2['wall_s']:>6.2f} {cold['after_last_commit_s']:>20}")
    compared = rounds[0]["compared"]
    print(f"outputs against xarray's ({compared['dates']} dates and the maximum): largest difference "
          f"{compared['max_diff_elsewhere']} NDVI, {compared['seam_max_diff']} within {SEAM_PIXELS} px of the "
          f"MODIS tile edge; {compared['pixels_one_sided']} of {compared['pixels_compared']} pixels valid on one "
          "side only")
    med = statistics.median
    print(json.dumps({
        "cold_ratio": round(med(r["bagpipe_cold"]["wall_s"] / r["xarray_cold"]["wall_s"] for r in rounds), 3),
        "warm_ratio": round(med(r["bagpipe_warm"]["wall_s"] / r["xarray_warm"]["wall_s"] for r in rounds), 3),
        "cpu_ratio": round(med(r["bagpipe_cold"]["cpu_s"] / r["xarray_cold"]["cpu_s"] for r in rounds), 3),
        "finish_share": round(med(r["bagpipe_cold"]["finish_share"] for r in rounds), 3),
        "seam_max_diff": compared["seam_max_diff"], "max_diff_elsewhere": compared["max_diff_elsewhere"],
        "pixels_one_sided": compared["pixels_one_sided"],
        "tasks": sum(rounds[0]["bagpipe_cold"]["counts"].values()),
        "workers": args.workers, "slots": args.slots, "threads": args.threads, "request": body,
        "rounds": rounds,
    }))


if __name__ == "__main__":
    main()
