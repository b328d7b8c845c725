"""The gather that writes a cube (``cube``): one CF netCDF file or Zarr store of a product's
layer over the job's region and dates (over the tile tasks that made it), or of a
reduction's outputs over its groups (over its reduction tasks), a tile and date at a time
(``pipeline.science.cubes``): memory holds one tile, whatever the cube's size. The tiles'
grid, encoding and dates come from the tiles themselves; a (tile, date) the catalog had no
data for is fill. Content-addressed by its tiles: an identical request finds it made.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import numpy as np
import rasterio
from affine import Affine

from pipeline import planning, stages
from pipeline.failures import FailureClass, StageFailure
from pipeline.lifecycle.status import ENDED_WELL, MADE
from pipeline.reduction import CUBE_GATHER, gather
from pipeline.science import cubes
from pipeline.stages import StageContext
from pipeline.storage import names

VERSION = "cube-1"  # change when the cube of the same tiles would change


def _variable_of(blob: str, stage: str, layer: str) -> str | None:
    """The variable a gathered output belongs to (None: not this cube's): a tile's layer,
    or a reduction's output (its name less group and tile)."""
    stem = blob.rsplit("/", 1)[-1].removesuffix(".tif")
    if not blob.endswith(".tif"):
        return None
    if stage == "aggregate":
        return ".".join(stem.split(".")[:-2])
    return stem.split(".")[1] if stem.split(".")[1] == layer else None


@stages.stage(CUBE_GATHER)
def cube(ctx: StageContext) -> None:
    """One cube of the job's tiles (a layer) or reductions (each output a variable)."""
    params = ctx.params
    rows = gather.gathered(ctx)
    failed = [r.task for r in rows if r.status not in ENDED_WELL]
    if failed and params.get("on_failure", "fail") == "fail":
        raise StageFailure(FailureClass.DEPENDENCY_FAILED, f"{len(failed)} of its tiles' tasks failed "
                           f"(first: {failed[0]})")
    placed: list[tuple[str, date, str, str]] = []  # (variable, date, blob, target tile)
    for row in rows:
        if row.status not in MADE:
            continue
        found = row.parameters()
        day = date.fromisoformat(found.get("start") or found["date"])
        several = "," in found.get("tile", "")
        for place in planning.places_of(found.get("tile", "")):  # a batch's tile task: each target tile's own
            for output in planning.outputs_of(row.output_names(), place, several):
                blob = output.removeprefix(names.TILE_OUTPUT_PREFIX)
                name = _variable_of(blob, row.stage, params["layer"])
                if name is not None:
                    placed.append((name, day, blob, place))
    if not placed:
        ctx.no_data = True
        return
    form = params["format"]
    key = hashlib.sha256(json.dumps([VERSION, form, params["name"], sorted(placed, key=str)], default=str).encode()
                         ).hexdigest()
    file_name = f"{params['name']}{cubes.SUFFIX[form]}"

    def write(folder: Path) -> None:
        # each tile's grid, and each variable's encoding, from one file of it (the same on every date)
        headers = {(name, tile): _header(ctx, blob, folder / "header.tif")
                   for name, tile, blob in {(n, t, b) for n, _, b, t in sorted(placed, key=lambda p: p[2])}}
        grids = {tile: (h.transform, h.shape) for (_, tile), h in headers.items()}
        first = next(iter(headers.values()))
        layout = cubes.layout_of(first.crs, list(grids.values()), [d for _, d, _, _ in placed])
        variables = []
        for name in sorted({n for n, _, _, _ in placed}):
            one = next(h for (n, _), h in headers.items() if n == name)
            variables.append(cubes.Variable(name, one.dtype, one.nodata, one.scale, one.offset, one.unit,
                                            one.title or name))
        index = {d: i for i, d in enumerate(layout.dates)}
        sink = cubes.open_sink(form, folder / file_name, layout, variables,
                               {"title": f"{params['product']} {params['name']}", "source": "bagpipe",
                                "bagpipe_stage": VERSION})
        try:
            for number, (name, day, blob, _) in enumerate(sorted(placed, key=lambda p: (p[1], p[2]))):
                path = folder / "tile.tif"
                path.write_bytes(ctx.clients.transfers.download(ctx.clients.tiles, blob)[0])
                with rasterio.open(path) as src:
                    row, col = layout.offset(src.transform)
                    sink.write(name, index[day], row, col, np.asarray(src.read(1)))
                ctx.progress((number + 1) / len(placed))
        finally:
            sink.close()

    gather.publish(ctx, key, {file_name: file_name}, write)


@dataclass(frozen=True)
class Header:
    """A tile's grid and encoding, as its file says."""

    crs: str
    transform: Affine
    shape: tuple[int, int]
    dtype: str
    nodata: float
    scale: float
    offset: float
    unit: str
    title: str


def _header(ctx: StageContext, blob: str, path: Path) -> Header:
    """A tile's grid and encoding, from its file ."""
    path.write_bytes(ctx.clients.transfers.download(ctx.clients.tiles, blob)[0])
    with rasterio.open(path) as src:
        found = Header(src.crs.to_wkt(), src.transform, (src.height, src.width), src.dtypes[0],
                       src.nodata if src.nodata is not None else float("nan"), src.scales[0], src.offsets[0],
                       src.units[0] or "", src.descriptions[0] or "")
    path.unlink()
    return found
