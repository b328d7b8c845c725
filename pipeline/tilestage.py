"""The tile task's stage ("modis"): collection then reprojection of one (target tile, date,
product), each step's output cached on its own.

The sources are collected in parallel (each fetched once from its feed, or read from the
``sources`` cache); the reprojected tile is content-addressed in ``tiles``, so a tile some
earlier request already made ends the task ``CACHED`` without touching a raster.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

from pipeline import cache, collection, names, reprojection, stages
from pipeline.grid import TILE_SIZE
from pipeline.products import CATALOG
from pipeline.stages import StageContext
from pipeline.targets import NATIVE, SINUSOIDAL_PROJ4


def target_of(params: dict[str, str]) -> reprojection.Target:
    """The warp target a tile task's parameters describe."""
    layer = CATALOG[params["product"]].layer
    bounds = tuple(float(b) for b in params["bounds"].split(","))
    if params["crs"] == NATIVE:
        return reprojection.Target(SINUSOIDAL_PROJ4, bounds, TILE_SIZE / layer.pixels, layer.resampling)  # type: ignore[arg-type]
    return reprojection.Target(params["crs"], bounds, float(params["res"]), layer.resampling)  # type: ignore[arg-type]


@stages.stage("modis")
def modis(ctx: StageContext) -> None:
    params = ctx.params
    product, day = params["product"], date.fromisoformat(params["date"])
    tiles = params["sources"].split(",")
    owner = f"{ctx.job}/{ctx.task}"

    def collect(tile: str, want_data: bool) -> cache.Cached:
        return collection.collect(ctx.clients, product, tile, day, want_data, owner, retry=ctx.attempt > 1)

    with ThreadPoolExecutor(len(tiles)) as pool:  # their digests name the output: no bytes needed yet
        found = list(pool.map(lambda tile: collect(tile, False), tiles))
    target = target_of(params)
    key = reprojection.cache_key(target, product, CATALOG[product].layer.name, [f.md5.hex() for f in found])

    def make() -> bytes:
        with tempfile.TemporaryDirectory(prefix="bagpipe-") as tmp:
            paths = []
            with ThreadPoolExecutor(len(tiles)) as pool:  # those just fetched are in hand already
                sources = list(pool.map(lambda pair: pair[1] if pair[1].data is not None else collect(pair[0], True),
                                        zip(tiles, found, strict=True)))
            for source in sources:
                path = Path(tmp, source.name.rsplit("/", 1)[-1])
                path.write_bytes(source.data or b"")
                paths.append(path)
            return reprojection.warp(paths, target, tags={"PRODUCT": product, "DATE": params["date"],
                                                           "TARGET_TILE": params["tile"]})

    name = names.tile_blob(key, product, params["tile"], params["date"])
    made = cache.ensure(ctx.clients.transfers, ctx.clients.tiles, name, make, "image/tiff", want_data=False,
                        owner=owner, tidy=ctx.attempt > 1)
    ctx.cached = not made.made
    ctx.outputs.append(names.TILE_OUTPUT_PREFIX + name)
