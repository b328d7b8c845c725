"""Reductions on the local stack, against what a scientist would use instead, side by side in
one run on one machine.

``builtin_vs_program``: the same reduction — per MODIS tile, the maximum of MOD10A2's snow
classes over January to mid-February 2022 on the Four Corners (the demo's tiles h08v05 and
h09v05 on their own grid, 2400 × 2400 pixels, 6 dates each) — by the built-in ``max``
(``reduce``) and by the installed program
``max_composite`` (a C program, the fastest a program gets, run in the sandbox from ENVI
inputs), each over the same tiles. The tiles are made first, by a job of no reduction, so
that each side's reductions run alone, on tiles both find ``CACHED``; then ``--rounds``
pairs of jobs, the program first in one round and the built-in first in the next, the
built-in's outputs deleted before each of its jobs so that it computes them again (they are
content-addressed: a second job would find them made). Each side writes its own product:
the program an ENVI raster and a CSV (uncompressed, as it writes them), the built-in a
Cloud-Optimized GeoTIFF (deflate, overviews), each uploaded. Figures: the reduction
attempts' runtimes (their rows' ``runtime_s``, from the claim to the commit on both sides),
as input megapixels (dates × pixels) per second of an attempt and per task, over every
round; the ratio is the program's mean time ÷ the built-in's, and per round.

``monthly_vs_xarray``: a year of MOD13A1 NDVI (23 composites) over a box of ``--tiles``
1° target tiles at 0.005°, the maximum per month: a bagpipe job submitted to the local stack
(2 workers of 4 slots, from submission to SUCCEEDED, its cache empty: cold; the same request
again: warm, every task found made), and ``odc.stac.load`` of the same items from the same
local STAC API, signed by its SAS endpoint, onto the same grid (bilinear NDVI, nearest
pixel reliability, the unreliable masked as bagpipe masks them) then xarray's
``resample(time="1MS").max()``, computed by dask on this machine's cores (cold: the first
load in this process; warm: the second). The imitation's granules are made once before
either runs, so that neither pays for synthesizing them. The ratio is bagpipe's wall time ÷
xarray's, cold; the two results' mean absolute difference is printed beside it.

    python -m bench.science [--tiles 2] [--workers 2] [--slots 4] [--rounds 2]

Last line: one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import odc.stac
import pystac_client
import xarray as xr

from bagpipe.client import Api
from bagpipe.stack import LocalStack
from pipeline.lifecycle import jobs, tasks
from pipeline.lifecycle.status import TaskStatus
from pipeline.modis.access import SasSigner
from pipeline.modis.products import CATALOG
from pipeline.reduction import AGGREGATE_STAGE, REDUCE_STAGE
from pipeline.storage import names
from pipeline.storage.clients import Clients, clients_for

FOUR_CORNERS = {"region": {"tiles": ["h08v05", "h09v05"]}, "start": "2022-01-01", "end": "2022-02-17",
                "products": ["MOD10A2"]}  # on the MODIS tiles' own grid: 2400 × 2400 pixels a tile
SNOW = "MOD10A2.Maximum_Snow_Extent"
NDVI, RELIABILITY = "500m_16_days_NDVI", "500m_16_days_pixel_reliability"


def run(api: Api, body: dict[str, Any], timeout: float = 3600) -> tuple[str, float]:
    """Submit ``body``, wait for it to succeed; (job, wall seconds from submission)."""
    started = time.monotonic()
    job = api.submit(body)["job"]
    while (state := api.status(job)["state"]) not in ("SUCCEEDED", "FAILED", "CANCELLED"):
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{job} still {state} after {timeout:.0f} s")
        time.sleep(0.5)
    if state != "SUCCEEDED":
        raise RuntimeError(f"{job} ended {state}: {api.status(job).get('error')}")
    return job, time.monotonic() - started


def attempts(clients: Clients, job: str, stage: str) -> list[tasks.TaskRow]:
    """The job's tasks of ``stage`` that ran (not found made)."""
    return [r for r in tasks.list_tasks(clients.tasks, jobs.get(clients, job).parts)
            if r.stage == stage and r.status is TaskStatus.SUCCEEDED]


def reduction_figures(rows: list[tasks.TaskRow], megapixels: float) -> dict[str, float]:
    seconds = [r.runtime_s or 0.0 for r in rows]
    return {"tasks": len(rows), "seconds_per_task": round(float(np.mean(seconds)), 3),
            "megapixels_per_s": round(megapixels * len(rows) / sum(seconds), 2)}


def builtin_vs_program(api: Api, clients: Clients, rounds: int = 2) -> dict[str, Any]:
    megapixels = 6 * 2400 * 2400 / 1e6  # dates × pixels of a task
    run(api, FOUR_CORNERS)  # the tiles, made before either side runs
    sides: dict[str, list[tasks.TaskRow]] = {"program": [], "builtin": []}
    ratios = []
    for number in range(rounds):
        ran: dict[str, list[tasks.TaskRow]] = {}
        for side in ("program", "builtin") if number % 2 == 0 else ("builtin", "program"):
            if side == "program":
                job, _ = run(api, FOUR_CORNERS | {"reducer": {"name": "max_composite"}})
                ran[side] = attempts(clients, job, REDUCE_STAGE)
            else:
                job, _ = run(api, FOUR_CORNERS | {"reduce": {"by": "span", "reducer": "max", "inputs": [SNOW]}})
                ran[side] = attempts(clients, job, AGGREGATE_STAGE)
                for row in ran[side]:  # so that the next round's job computes them again
                    for output in row.output_names():
                        clients.tiles.delete_blob(output.removeprefix(names.TILE_OUTPUT_PREFIX))
            sides[side] += ran[side]
        each = {side: reduction_figures(rows, megapixels) for side, rows in ran.items()}
        ratios.append(round(each["program"]["seconds_per_task"] / each["builtin"]["seconds_per_task"], 2))
    program, builtin = (reduction_figures(sides[side], megapixels) for side in ("program", "builtin"))
    return {"program": program, "builtin": builtin, "rounds": ratios,
            "ratio": round(program["seconds_per_task"] / builtin["seconds_per_task"], 1)}


def monthly_request(tiles: int) -> dict[str, Any]:
    box = [-108.0, 35.0, -108.0 + tiles, 36.0]
    return {"region": {"bbox": box}, "grid": {"tile_size": 1.0, "resolution": 0.005},
            "start": "2022-01-01", "end": "2022-12-31", "products": ["MOD13A1"],
            "reduce": {"by": "month", "reducer": "max", "inputs": [f"MOD13A1.{NDVI}"]}}


def xarray_monthly(stack: LocalStack, box: list[float]) -> tuple[xr.DataArray, float]:
    """The monthly maximum NDVI as a scientist computes it with odc-stac and xarray; (its
    values, wall seconds)."""
    started = time.monotonic()
    signer = SasSigner(stack.planetary.sas_url)
    found = pystac_client.Client.open(stack.planetary.stac_url).search(
        collections=[CATALOG["MOD13A1"].stac_collection], bbox=box, datetime="2022-01-01/2022-12-31")
    items = list(found.items())
    for item in items:
        for asset in item.assets.values():
            asset.href = signer.sign(asset.href)
    loaded = odc.stac.load(items, bands=[NDVI, RELIABILITY], crs="EPSG:4326", resolution=0.005, bbox=box,
                           groupby="solar_day", chunks={"latitude": 200, "longitude": 200},
                           resampling={NDVI: "bilinear", RELIABILITY: "nearest"})
    ndvi = loaded[NDVI]
    usable = (ndvi >= -2000) & (ndvi <= 10000) & (loaded[RELIABILITY] >= 0) & (loaded[RELIABILITY] <= 1)
    monthly = (ndvi.where(usable) * 0.0001).resample(time="1MS").max().compute()
    return monthly, time.monotonic() - started


def bagpipe_monthly(clients: Clients, job: str) -> dict[str, np.ndarray]:
    """The job's monthly maxima by month (YYYY-MM), as one array per month over its tiles."""
    from rasterio.io import MemoryFile

    found: dict[str, list[tuple[float, float, np.ndarray]]] = {}
    for row in attempts(clients, job, AGGREGATE_STAGE):
        (output,) = row.output_names()
        data = clients.tiles.download_blob(output.removeprefix(names.TILE_OUTPUT_PREFIX)).readall()
        with MemoryFile(data) as memory, memory.open() as src:
            stored = src.read(1, masked=True).astype("float64")  # its nodata masked, then its scale and offset
            values = (stored * src.scales[0] + src.offsets[0]).filled(np.nan)
            found.setdefault(row.parameters()["group"], []).append((src.bounds.left, src.bounds.top, values))
    return {month: np.hstack([v for _, _, v in sorted(tiles)]) for month, tiles in found.items()}


def monthly_vs_xarray(api: Api, clients: Clients, stack: LocalStack, tiles: int) -> dict[str, Any]:
    body = monthly_request(tiles)
    box = body["region"]["bbox"]
    xarray_monthly(stack, box)  # the imitation makes its granules once, before either is timed
    job, cold = run(api, body)
    _, warm = run(api, body)
    xarray_values, xarray_cold = xarray_monthly(stack, box)
    _, xarray_warm = xarray_monthly(stack, box)
    ours = bagpipe_monthly(clients, job)
    differences = []
    for index, month in enumerate(xarray_values.time.dt.strftime("%Y-%m").values):
        if str(month) in ours and ours[str(month)].shape == xarray_values[index].shape:
            differences.append(np.nanmean(np.abs(ours[str(month)] - xarray_values[index].values)))
    return {"tiles": tiles, "bagpipe_cold_s": round(cold, 1), "bagpipe_warm_s": round(warm, 1),
            "xarray_cold_s": round(xarray_cold, 1), "xarray_warm_s": round(xarray_warm, 1),
            "months_compared": len(differences),
            "mean_abs_difference": round(float(np.mean(differences)), 4) if differences else None,
            "ratio": round(cold / xarray_cold, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiles", type=int, default=2, help="1° target tiles of the monthly job")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of builtin_vs_program's jobs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LocalStack(Path(tmp) / "stack", workers=args.workers,
                                                          slots=args.slots) as stack:
        api = Api(stack.api_url, stack.token)
        clients = clients_for(stack.settings)
        versus_program = builtin_vs_program(api, clients, args.rounds)
        print(f"builtin_vs_program: the built-in max {versus_program['builtin']['seconds_per_task']} s a task "
              f"({versus_program['builtin']['megapixels_per_s']} MP/s), the program "
              f"{versus_program['program']['seconds_per_task']} s ({versus_program['program']['megapixels_per_s']} "
              f"MP/s): {versus_program['ratio']}x (by round {versus_program['rounds']})", flush=True)
        versus_xarray = monthly_vs_xarray(api, clients, stack, args.tiles)
        print(f"monthly_vs_xarray: bagpipe {versus_xarray['bagpipe_cold_s']} s cold, {versus_xarray['bagpipe_warm_s']}"
              f" s warm; odc-stac + xarray {versus_xarray['xarray_cold_s']} s cold, {versus_xarray['xarray_warm_s']} s"
              f" warm: {versus_xarray['ratio']} (mean |difference| {versus_xarray['mean_abs_difference']} NDVI over "
              f"{versus_xarray['months_compared']} months)", flush=True)
    print(json.dumps({"builtin_vs_program": versus_program, "monthly_vs_xarray": versus_xarray}))


if __name__ == "__main__":
    main()
