"""The tile task's stage ("modis"): collection then reprojection of one (batch of target
tiles, date, product), each step's output cached on its own, one output per target tile and
requested layer.

The planner has already found the granules (``granules`` param: by MODIS tile, the granule
id and its files' hrefs) and, for a task of several target tiles (``pipeline.modis.batches``),
which of them each one reads (``planning.places``: each target tile as a task of it alone
would have it). A task whose (tiles, date) the catalog does not have ends NO_DATA: missing
data is data; a target tile of a batch with none makes nothing. The others collect their
files in parallel, each fetched once for the whole batch (from its archive, or read from
the ``sources`` cache) — a COG per layer and per quality layer where the catalog has them,
else the granule's HDF4 file — and warp each layer of each target tile, from that tile's own
granules, into a content-addressed blob in ``tiles``: the same pixels and the same name
whatever batch it was warped in, so a tile some earlier request already made is not warped
again, and a task whose every tile was made ends ``CACHED`` without touching a raster. A
request whose region is a polygon has its tiles clipped to it: a pixel whose centre is
outside is nodata, in the tile and in all made from it, and the polygon's digest is part of
the tile's content address.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import rasterio.shutil
import shapely
from pyproj import Transformer
from rasterio.features import geometry_mask
from rasterio.io import MemoryFile

from pipeline import planning, stages
from pipeline.failures import FailureClass, StageFailure
from pipeline.modis import TILE_STAGE, collection, reprojection, synthetic
from pipeline.modis.granules import HDF, Granule, from_param
from pipeline.modis.grid import TILE_SIZE
from pipeline.modis.products import CATALOG, Product
from pipeline.modis.targets import NATIVE, SINUSOIDAL_PROJ4
from pipeline.science import expressions, rasters, vectors
from pipeline.science.encoding import decode, encode
from pipeline.stages import StageContext
from pipeline.storage import cache, names


def target_of(params: dict[str, str], layer: str | None = None) -> reprojection.Target:
    """The warp target a tile task's parameters describe (resampled as ``layer`` wants)."""
    product = CATALOG[params["product"]]
    spec = product.layer(layer) if layer else product.default
    west, south, east, north = (float(b) for b in params["bounds"].split(","))
    bounds = (west, south, east, north)
    if params["crs"] == NATIVE:
        return reprojection.Target(SINUSOIDAL_PROJ4, bounds, TILE_SIZE / product.pixels, spec.resampling)
    return reprojection.Target(params["crs"], bounds, float(params["res"]), spec.resampling)


def layers_of(params: dict[str, str]) -> list[str]:
    product = CATALOG[params["product"]]
    return [name for name in params.get("layers", "").split(",") if name] or [product.default.name]


def files_for(granule: Granule, product: Product, layer: str) -> dict[str, list[str]]:
    """The granule's files a layer needs (key → the layers read from it): the layer's and its
    quality layer's COGs if the catalog lists both, else the HDF4 file holding them."""
    spec = product.layer(layer)
    wanted = [layer] + ([spec.masked_by] if spec.masked_by else [])
    listed = dict(granule.files)
    if all(name in listed for name in wanted):
        return {name: [name] for name in wanted}
    if HDF in listed:
        return {HDF: wanted}
    raise StageFailure(FailureClass.BAD_SOURCE, f"{granule.id}: the catalog lists no file holding {layer}")


def inputs_of(granules: list[Granule], product: Product, layer: str) -> list[tuple[str, str]]:
    """The files a layer of a tile is made from: (granule id, file key) each."""
    return [(g.id, key) for g in granules for key in files_for(g, product, layer)]


def tile_name(params: dict[str, str], layer: str, digests: dict[tuple[str, str], str]) -> str:
    """The content-addressed name in ``tiles`` of a tile task's ``layer``, from the MD5s
    (hex) of its cached source files (``digests``, by granule id and file key): what the
    stage makes, and what the planner looks for to settle a task already made."""
    product = CATALOG[params["product"]]
    target = target_of(params, layer)
    inputs = inputs_of(from_param(params["granules"]), product, layer)
    key = reprojection.cache_key(target, product.name, layer, [digests[item] for item in inputs])
    if params.get("clip"):  # clipped to a polygon: another content (the polygon's digest in its address)
        key = hashlib.sha256(f"{key}:clip:{params['clip']}".encode()).hexdigest()
    return names.tile_blob(key, product.name, layer, params["tile"], params["date"])


def clipped(data: bytes, geometry: dict[str, Any]) -> bytes:
    """A tile's COG with every pixel whose centre lies outside a lon/lat polygon set to its
    nodata (its encoding, tags and layout kept)."""
    polygon = vectors.polygon(geometry)
    with MemoryFile(data) as memory, memory.open() as src:
        values = src.read(1)
        crs = src.crs
        if not crs.is_geographic or crs.to_epsg() != 4326:
            move = Transformer.from_crs("EPSG:4326", crs, always_xy=True)
            polygon = shapely.transform(polygon, lambda xy: np.column_stack(move.transform(xy[:, 0], xy[:, 1])))
        outside = geometry_mask([polygon], out_shape=values.shape, transform=src.transform)
        values[outside] = src.nodata
        profile = src.profile | {"driver": "GTiff"}
        tags, scales, offsets, units = src.tags(), src.scales, src.offsets, src.units
        description = src.descriptions[0]
        with MemoryFile() as raw:
            with raw.open(**{k: v for k, v in profile.items() if k not in ("blockxsize", "blockysize", "tiled",
                                                                             "compress", "interleave")}) as dst:
                dst.write(values, 1)
                dst.scales, dst.offsets, dst.units = scales, offsets, units
                if description:
                    dst.set_band_description(1, description)
                dst.update_tags(**tags, CLIPPED="1")
            with raw.open() as made, MemoryFile() as cog:
                rasterio.shutil.copy(made, cog.name, driver="COG", compress="DEFLATE", blocksize=512)
                return bytes(cog.read())


def source_blobs(params: dict[str, str]) -> dict[tuple[str, str], str]:
    """The cached files in ``sources`` a tile task reads, by (granule id, file key)."""
    product = CATALOG[params["product"]]
    granules = {g.id: g for g in from_param(params["granules"])}
    return {(gid, key): collection.source_blob(product, granules[gid], key)
            for layer in layers_of(params) for gid, key in inputs_of(list(granules.values()), product, layer)}


PLACES_AT_ONCE = 4  # target tiles of a batch warped and stored at once (GDAL and uploads release the GIL)


@stages.stage(TILE_STAGE)
def modis(ctx: StageContext) -> None:
    params = ctx.params
    product = CATALOG[params["product"]]
    if "granules" not in params:
        raise StageFailure(FailureClass.USER_CODE, "the task was planned without a catalog search")
    places = [(place, own) for place in planning.places(params) if (own := from_param(place["granules"]))]
    granules = list({g.id: g for _, own in places for g in own}.values())
    if not granules:
        ctx.no_data = True  # the catalog has none of its (tile, date)s: ocean, or an outage
        return
    layers = layers_of(params)
    needs = {(g.id, layer): files_for(g, product, layer) for g in granules for layer in layers}
    files: dict[tuple[str, str], list[str]] = {}  # (granule, key) -> every layer read from it
    for (granule_id, _), keys in needs.items():
        for key, read in keys.items():
            files.setdefault((granule_id, key), [])
            files[(granule_id, key)] += [name for name in read if name not in files[(granule_id, key)]]
    by_id = {g.id: g for g in granules}
    owner = f"{ctx.part}/{ctx.task}"
    region = stages.kept_document(ctx.clients, params["clip"])["geometry"] if params.get("clip") else None

    def clip(data: bytes) -> bytes:
        return clipped(data, region) if region is not None else data

    def collect(item: tuple[str, str], want_data: bool) -> cache.Cached:
        granule_id, key = item
        return collection.collect(ctx.clients, product, by_id[granule_id], key, files[item], want_data, owner,
                                  retry=ctx.attempt > 1)

    with ThreadPoolExecutor(len(files)) as pool:  # their digests name the outputs: no bytes needed yet
        found = dict(zip(files, pool.map(lambda item: collect(item, False), files), strict=True))

    with tempfile.TemporaryDirectory(prefix="bagpipe-") as tmp:
        local: dict[tuple[str, str], Path] = {}
        fetching = threading.Lock()

        def sources(layer: str, reading: list[Granule]) -> list[reprojection.Source]:
            """The layer's sources of ``reading`` on local disk (each fetched once per task, in parallel)."""
            with fetching:
                items = [(g.id, key) for g in reading for key in needs[(g.id, layer)] if (g.id, key) not in local]
                with ThreadPoolExecutor(max(1, len(items))) as pool:  # those just fetched are in hand already
                    got = list(pool.map(lambda item: found[item] if found[item].data is not None else
                                        collect(item, True), items))
                for item, source in zip(items, got, strict=True):
                    path = Path(tmp, f"{len(local)}-{source.name.rsplit('/', 1)[-1]}")
                    path.write_bytes(source.data or b"")
                    local[item] = path
            return [reprojection.Source(g.id, {key: local[(g.id, key)] for key in needs[(g.id, layer)]})
                    for g in reading]

        digests = {item: found[item].md5.hex() for item in found}

        def place(view: dict[str, str], own: list[Granule]) -> tuple[list[str], bool]:
            """One target tile's outputs, made from its own granules ``own``: their names, and
            whether every one was made already."""
            outputs, cached, made_as = [], True, {}
            for layer in layers:
                target = target_of(view, layer)
                name = tile_name(view, layer, digests)
                made = cache.ensure(
                    ctx.clients.transfers, ctx.clients.tiles, name,
                    lambda layer=layer, target=target: clip(reprojection.warp(  # type: ignore[misc]  # bound defaults
                        sources(layer, own), product, layer, target,
                        tags={"DATE": view["date"], "TARGET_TILE": view["tile"]} | synthetic_tag(own))),
                    "image/tiff", want_data=False, owner=owner, tidy=ctx.attempt > 1)
                cached = cached and not made.made
                made_as[layer] = name
                outputs.append(names.TILE_OUTPUT_PREFIX + name)
            for name, blob in derived_names(view, made_as).items():
                made = cache.ensure(ctx.clients.transfers, ctx.clients.tiles, blob,
                                    lambda name=name: derive(ctx, view, name, made_as),  # type: ignore[misc]
                                    "image/tiff", want_data=False, owner=owner, tidy=ctx.attempt > 1)
                cached = cached and not made.made
                outputs.append(names.TILE_OUTPUT_PREFIX + blob)
            return outputs, cached

        with ThreadPoolExecutor(min(PLACES_AT_ONCE, len(places)), thread_name_prefix="place") as pool:
            ended = list(pool.map(lambda args: place(*args), places))
        for outputs, _ in ended:
            ctx.outputs += outputs
        ctx.cached = all(cached for _, cached in ended)


def synthetic_tag(granules: list[Granule]) -> dict[str, str]:
    """The tag that says a product was made from a synthetic granule (the local stack's
    imitation), if one of ``granules`` is: it says so in its file and its STAC item."""
    return {synthetic.TAG: "true"} if any(g.synthetic for g in granules) else {}


def derived_of(params: dict[str, str]) -> dict[str, expressions.Expression]:
    """A tile task's derived layers: name → its expression over the product's layers."""
    return {name: expressions.parse(text) for name, text in json.loads(params.get("derived") or "{}").items()}


def derived_names(params: dict[str, str], made_as: dict[str, str]) -> dict[str, str]:
    """The content-addressed names in ``tiles`` of a tile task's derived layers, given the
    names of the layers it made (``made_as``): what the stage makes, and what the planner
    looks for to settle a task made already."""
    found = {}
    for name, parsed in derived_of(params).items():
        inputs = {ref: made_as[ref.split(".", 1)[1]] for ref in parsed.names}
        blob = json.dumps([expressions.VERSION, str(parsed), inputs], sort_keys=True)
        key = hashlib.sha256(blob.encode()).hexdigest()
        found[name] = names.tile_blob(key, params["product"], name, params["tile"], params["date"])
    return found


def derive(ctx: StageContext, params: dict[str, str], name: str, made_as: dict[str, str]) -> bytes:
    """A derived layer: its expression over the physical values of the layers it reads (the
    tiles just made), float32, NaN where any of them has no value."""
    product = CATALOG[params["product"]]
    parsed = derived_of(params)[name]
    with tempfile.TemporaryDirectory(prefix="bagpipe-derive-") as folder:
        values: dict[str, np.ndarray] = {}
        grid: rasters.Grid | None = None
        for ref in parsed.names:
            layer = ref.split(".", 1)[1]
            path = Path(folder, f"{layer}.tif")
            path.write_bytes(ctx.clients.transfers.download(ctx.clients.tiles, made_as[layer])[0])
            grid = grid or rasters.Grid.of(path)
            values[ref] = decode(rasters.read(path), product.layer(layer).encoding)
    assert grid is not None  # an expression reads at least one layer (checked at submission)
    out = parsed.encoding()
    return rasters.write_cog([encode(parsed.evaluate(values), out)], grid, out, [name],
                             {"PRODUCT": product.name, "LAYER": name, "EXPRESSION": str(parsed), "DATE": params["date"],
                              "TARGET_TILE": params["tile"], "BAGPIPE_STAGE": expressions.VERSION}
                             | synthetic_tag(from_param(params["granules"])))
