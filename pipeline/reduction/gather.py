"""What every gather does (``planning.TaskPlan.after_all``: one task after every other of
its job, joining what tasks of every partition made), and the gather of a job's sites.

A gather reads the rows of the tasks it joins (its ``over`` ranges, across the job's
partitions), refuses to join a set with a part missing (a task that failed for good: a
``dependency_failed`` failure), and writes its files into a work folder on local disk, a
part at a time, then uploads each in bounded memory (``Transfers.upload_file``, at most
:data:`IN_FLIGHT` bytes in flight), into
``tiles`` under a content address of what it joined: an identical request finds them there
and ends the gather ``CACHED``.

The sites' gather (``sites``) streams the point tasks' Parquet parts
(``pipeline.modis.points``) into one CSV and one GeoParquet file, a point geometry per row,
units in the columns' metadata, and, for a request asking ``output.format`` json, a third:
the values as openEO's time series JSON (``Timeseries``).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from azure.core.exceptions import HttpResponseError

from pipeline import stages
from pipeline.failures import FailureClass, StageFailure
from pipeline.lifecycle import jobs, tasks
from pipeline.lifecycle.status import MADE
from pipeline.reduction import SITES_GATHER
from pipeline.science import tables, vectors
from pipeline.science.tables import SITES
from pipeline.stages import StageContext
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.storage.transfer import MiB

VERSION = "gather-1"  # change when the files of the same parts would change
# bytes of a file's blocks in flight as a gather uploads it: a transfer plan's for a large
# object (up to 256 MiB) would be most of a worker's memory beside the gather's own, and
# the SDK holds each block more than once while it sends it (a cube's gather peaked 35 MB
# higher at 32 MiB than at 16: two 8 MiB blocks at a time near storage, one of 16 far)
IN_FLIGHT = 16 * MiB
CONTENT_TYPES = {".csv": "text/csv", ".parquet": "application/vnd.apache.parquet", ".nc": "application/netcdf",
                 ".json": "application/json", ".zip": "application/zip"}


def gathered(ctx: StageContext) -> list[tasks.TaskRow]:
    """The rows of the tasks a gather joins (its ``over`` ranges, in every partition of its
    job), in sequence order."""
    parts = jobs.get(ctx.clients, ctx.job).parts
    return [row for first, count in tasks.ranges_of(ctx.params["over"])
            for row in tasks.list_tasks(ctx.clients.tasks, parts, first, count)]


def parts_of(ctx: StageContext, rows: list[tasks.TaskRow]) -> list[str]:
    """The blobs in ``tiles`` of the gathered tasks' parts; a ``dependency_failed`` failure
    if one of them ended without its part (failed for good)."""
    failed = [row.task for row in rows if row.status not in MADE]
    if failed:
        raise StageFailure(FailureClass.DEPENDENCY_FAILED, f"{len(failed)} of the tasks it joins failed "
                           f"(first: {failed[0]})")
    return [o.removeprefix(names.TILE_OUTPUT_PREFIX) for row in rows for o in row.output_names()]


def publish(ctx: StageContext, key: str, outputs: dict[str, str], write: Any) -> None:
    """Name the gather's outputs (``outputs``: file name in the work folder → blob name
    under ``key`` in ``tiles``), made by ``write(folder)`` into a work folder and uploaded
    in bounded memory, unless every one is there already (the task then ends CACHED). Two
    gathers making the same outputs at once both make them; the second upload stands down."""
    blobs = {name: names.table_blob(key, blob) for name, blob in outputs.items()}
    if all(cache_exists(ctx.clients, blob) for blob in blobs.values()):
        ctx.cached = True
    else:
        with tempfile.TemporaryDirectory(prefix="bagpipe-gather-") as folder:
            write(Path(folder))
            for name, blob in blobs.items():
                upload_once(ctx.clients, Path(folder, name), blob)
    ctx.outputs += [names.TILE_OUTPUT_PREFIX + blob for blob in blobs.values()]


def cache_exists(clients: Clients, blob: str) -> bool:
    return bool(clients.tiles.get_blob_client(blob).exists())


def upload_once(clients: Clients, path: Path, blob: str) -> None:
    """Upload a gather's file unless another gather uploaded the same content meanwhile."""
    try:
        clients.transfers.upload_file(clients.tiles, blob, path,
                                      CONTENT_TYPES.get(path.suffix, "application/octet-stream"), overwrite=False,
                                      in_flight=IN_FLIGHT)
    except HttpResponseError as exc:
        if exc.status_code not in (409, 412):
            raise


@stages.stage(SITES_GATHER)
def sites_table(ctx: StageContext) -> None:
    """The job's sites' rows in one CSV and one GeoParquet file, and, asked for (``series``:
    the layers in their order), the same values as openEO's time series JSON."""
    rows = gathered(ctx)
    blobs = parts_of(ctx, rows)
    series = [r for r in ctx.params.get("series", "").split(",") if r]
    key = hashlib.sha256(json.dumps([VERSION, SITES_GATHER, sorted(blobs)] + ([series] if series else []))
                         .encode()).hexdigest()
    outputs = {"sites.csv": "sites.csv", "sites.parquet": "sites.parquet"} | (
        {"sites.json": "sites.json"} if series else {})

    def write(folder: Path) -> None:
        timeseries = Timeseries([s.id for s in vectors.sites_from(stages.kept_document(ctx.clients, ctx.params[
            "sites"]))], series) if series else None
        with tables.Writer(folder / "sites.csv", folder / "sites.parquet", SITES, points=("lon", "lat")) as out:
            for number, blob in enumerate(blobs):
                part = tables.from_parquet(ctx.clients.transfers.download(ctx.clients.tiles, blob)[0])
                out.write(part)
                if timeseries is not None:
                    timeseries.add(part)
                ctx.progress((number + 1) / max(1, len(blobs)))
        if timeseries is not None:
            timeseries.write(folder / "sites.json")

    publish(ctx, key, outputs, write)


class Timeseries:
    """The sites' values as openEO's time series JSON, the shape ``aggregate_spatial`` at
    points returns and the openEO clients read (the Python client's
    ``timeseries_json_to_pandas``): ``{"2022-07-04T00:00:00Z": [[a value per layer] per site,
    in the sites' order], …}``, the dates in order, a value none where the site has no data
    (or a layer no row on that date, as a product's dates are not another's). Held as a
    float array per date (sites × layers), 8 bytes a value."""

    def __init__(self, sites: list[str], layers: list[str]) -> None:
        self.sites = {site: number for number, site in enumerate(sites)}
        self.layers = {layer: number for number, layer in enumerate(layers)}
        self.dates: dict[str, np.ndarray] = {}

    def add(self, part: pa.Table) -> None:
        columns = part.select(["site", "product", "layer", "date", "value"]).to_pydict()
        for site, product, layer, day, value in zip(*columns.values(), strict=True):
            band = self.layers.get(f"{product}.{layer}")
            if band is None:
                continue
            when = f"{day.isoformat()}T00:00:00Z"
            if when not in self.dates:
                self.dates[when] = np.full((len(self.sites), len(self.layers)), np.nan)
            if value is not None:
                self.dates[when][self.sites[site], band] = value

    def write(self, path: Path) -> None:
        with path.open("w") as out:
            out.write("{")
            for number, when in enumerate(sorted(self.dates)):
                values = [[None if np.isnan(v) else float(v) for v in site] for site in self.dates[when].tolist()]
                out.write(("," if number else "") + json.dumps(when) + ":" + json.dumps(values, allow_nan=False))
            out.write("}")
