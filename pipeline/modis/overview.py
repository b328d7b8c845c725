"""A finished job's overview images: per layer and date of its tiles (the latest
``MAX_DATES`` of each layer) and per raster its reductions left, every tile of the job laid
on one lon/lat image of its whole region (nearest neighbour, at most ``LONGEST`` pixels a
side; a region across ±180° one image across it, its bounds' west above their east, as
GeoJSON gives such a box), coloured for its layer (``pipeline.modis.quicklook``; a reduction's
raster in the unit and on the colour ramp its file declares). Each is stored twice under
``products/{job}/overview/``: the bare image the portal lays on its map (``*.map.png``),
and the picture with its legend that the email links to (``*.png``).

Made by the job's finisher, before the manifest that lists them; a finisher that takes
over makes them again (same names, same content). A raster that cannot be read is left
out of its overview (logged); a storage error fails the completion, which is retried.

An overview of reprojected tiles only is a function of their content addresses (its
members' names) and of how it is drawn: it is cached under that key
(``names.overview_cache_blob``, in products, touched at each reuse so that products'
retention keeps it while it is used), so a repeat of a request copies its overviews rather
than reading every tile and drawing them again. A reduction's rasters are the job's own
and its overviews are always drawn.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError
from rasterio.errors import RasterioError
from rasterio.io import MemoryFile
from rasterio.transform import Affine, from_bounds
from rasterio.warp import Resampling, reproject

from pipeline.lifecycle import results
from pipeline.modis import layout, quicklook
from pipeline.modis.products import CATALOG
from pipeline.modis.targets import lonlat_bounds
from pipeline.science import rasters
from pipeline.storage import cache, names, packing
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)
MAX_DATES = 12  # per layer: the latest dates get an overview (a decade of daily data would be thousands)
LONGEST = 1024  # pixels on an overview's longer side
COPIES_AT_ONCE = 8  # cached overviews copied into a job at once
DRAWN_AT_ONCE = min(4, os.cpu_count() or 1)  # overviews drawn at once (the warps and PNG encoding free the GIL)
MARGIN = 2  # canvas pixels a raster's window of an overview reaches past its lon/lat box
Group = tuple[str, str, str, str]  # product, layer (or a reduction's file stem), first date, last date ("": a tile)
# how an overview is drawn, in its cache key: a change to the drawing (colours, legend,
# canvas, resampling) takes a new one, so no cached overview outlives the code that drew it
DRAWING = 3


def groups_of(clients: Clients, entries: list[dict[str, Any]]) -> dict[Group, list[tuple[dict[str, Any], str]]]:
    """The job's rasters by what their overview shows (tiles by layer and date, a
    reduction's by file and span), the latest ``MAX_DATES`` dates of each layer."""
    found: dict[Group, list[tuple[dict[str, Any], str]]] = {}
    for task in entries:
        for output in task["outputs"]:
            name = output.rsplit("/", 1)[-1]
            if not name.endswith(".tif"):
                continue
            if layout.waits(task):  # a reduction's, a climatology's: over its group of dates
                start, end = layout.dates(task)
                key = (layout.folder(task), layout.output_name(task, name), start.isoformat(), end.isoformat())
            else:  # a reprojected tile: product.layer.date.tile.tif
                key = (task["product"], layout.output_name(task, name), task["date"], "")
            found.setdefault(key, []).append((task, output))
    latest: dict[tuple[str, str], list[str]] = {}
    for product, layer, first, last in found:
        if not last:
            latest.setdefault((product, layer), []).append(first)
    keep = {(p, layer, d) for (p, layer), days in latest.items() for d in sorted(days)[-MAX_DATES:]}
    return {k: v for k, v in sorted(found.items()) if k[3] or (k[0], k[1], k[2]) in keep}


def _layer(product: str, name: str) -> Any:
    try:
        return CATALOG[product].layer(name)
    except KeyError:
        return None  # a reduction's own raster


def cache_key(key: Group, members: list[tuple[dict[str, Any], str]]) -> str | None:
    """The content address of the group's overview: its group, its members (reprojected
    tiles, named by their own content addresses) and how it is drawn; None when a member is
    not a cached tile (a reduction's raster), whose name says nothing of its content."""
    outputs = sorted(output for _, output in members)
    if not all(output.startswith(names.TILE_OUTPUT_PREFIX) for output in outputs):
        return None
    boxes = sorted(str(task["bounds"]) + "|" + str(task["crs"]) for task, _ in members)
    said = json.dumps([DRAWING, LONGEST, list(key), outputs, boxes], separators=(",", ":"))
    return hashlib.sha256(said.encode()).hexdigest()


def _span(key: Group) -> str:
    """The dates an overview shows, as its names and its caption give them."""
    return f"{key[2]}_{key[3]}" if key[3] else key[2]


def _stored(clients: Clients, job: str, key: Group, drawn: dict[str, Any], images: dict[str, bytes]) -> dict[str, Any]:
    """The overview's two images written into the job's products; its manifest entry."""
    product, name, first, last = key
    stem = f"{product}.{name}.{_span(key)}"
    picture, bare = names.overview_blob(job, f"{stem}.png"), names.overview_blob(job, f"{stem}.map.png")
    clients.transfers.upload(clients.products, picture, images["picture"], "image/png")
    clients.transfers.upload(clients.products, bare, images["map"], "image/png")
    return {"product": product, "layer": name, "date": first, "last": last or None, "bounds": tuple(drawn["bounds"]),
            "picture": picture, "map": bare, "unit": drawn["unit"], "legend": drawn["legend"],
            "tiles": drawn["tiles"]}


def _cached(clients: Clients, address: str) -> tuple[dict[str, Any], dict[str, bytes]] | None:
    """A cached overview (its description and images), touched; None if there is none."""
    blob = names.overview_cache_blob(address)
    try:
        data, _ = clients.transfers.download(clients.products, blob)
        cache.touch(clients.products, blob)
    except ResourceNotFoundError:
        return None
    found = json.loads(data)
    return found, {image: base64.b64decode(found.pop(image)) for image in ("picture", "map")}


def _cache(clients: Clients, address: str, drawn: dict[str, Any], images: dict[str, bytes]) -> None:
    """Keep a drawn overview for the next job of the same tiles. Only a saving: a write
    that fails (or finds another finisher's, the same content) changes nothing."""
    entry = drawn | {image: base64.b64encode(data).decode() for image, data in images.items()}
    try:
        clients.transfers.upload(clients.products, names.overview_cache_blob(address), json.dumps(entry).encode(),
                                 "application/json", overwrite=False)
    except ResourceExistsError:
        pass
    except AzureError as exc:
        log.info("overview %s not cached: %s", address, exc)


def _rasters(clients: Clients, members: list[tuple[dict[str, Any], str]]) -> list[tuple[str, bytes]]:
    """The members' rasters: the small ones read at once (``packing.read_small``, each
    checked against its MD5), a larger one by the ordinary download."""
    outputs = [packing.Output(output, *results.locate(clients, output)) for _, output in members]
    small = packing.read_small(clients, outputs)
    found = []
    for output in outputs:
        data = small.get(output.name)
        if data is None:
            container = clients.tiles if output.container == clients.tiles.container_name else clients.products
            data, _ = clients.transfers.download(container, output.blob)
        found.append((output.name, data))
    return found


def copied(clients: Clients, job: str, key: Group, address: str | None) -> dict[str, Any] | None:
    """The overview copied from the cache into the job's products, if the same tiles were
    drawn before (``address``: its ``cache_key``, None for a group not all cached tiles);
    else None."""
    hit = _cached(clients, address) if address else None
    return _stored(clients, job, key, *hit) if hit else None


def render(clients: Clients, job: str, key: Group, members: list[tuple[dict[str, Any], str]],
           address: str | None) -> dict[str, Any]:
    """One overview drawn: the group's rasters warped onto one lon/lat canvas, stored as
    images, and kept in the cache under ``address`` (its ``cache_key``) if it has one."""
    drawn, images = draw(clients, job, key, members)
    if address:
        _cache(clients, address, drawn, images)
    return _stored(clients, job, key, drawn, images)


def draw(clients: Clients, job: str, key: Group,
         members: list[tuple[dict[str, Any], str]]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The group's overview drawn: its description (bounds, unit, legend, tiles) and its
    two images (the picture with its legend, the bare map). Each raster is warped into the
    window of the canvas its lon/lat box covers (with a margin of ``MARGIN`` pixels), not
    onto the whole canvas: a tile is a few hundredths of an overview, and a warp onto the
    whole canvas walks every pixel of it."""
    product, name = key[:2]
    boxes = {output: lonlat_bounds(task["crs"], task["bounds"]) for task, output in members}
    bounds = region_box(list(boxes.values()))
    shape = quicklook.canvas_shape(bounds, LONGEST)
    canvas: np.ndarray | None = None
    nodata, scale, offset, unit, colormap = 0.0, 1.0, 0.0, "", ""  # the first raster read sets them
    for output, data in _rasters(clients, members):
        # the canvas in the raster's own longitudes: a turn west for one east of ±180° on a canvas past 180°
        shift = 360.0 * round(((bounds[0] + bounds[2]) / 2 - _middle(boxes[output])) / 360.0)
        transform = from_bounds(bounds[0] - shift, bounds[1], bounds[2] - shift, bounds[3], shape[1], shape[0])
        try:  # the raster read whole, then warped as an array: rasterio's warps from open datasets
            with MemoryFile(data) as memory, memory.open() as src:  # now and then lost their geotransform
                values, crs, source, src_nodata = src.read(1), src.crs, src.transform, src.nodata
                if canvas is None:
                    fill = np.nan if src.dtypes[0][0] == "f" else 0.0
                    nodata = float(src.nodata) if src.nodata is not None else fill
                    canvas = np.full(shape, nodata, dtype=src.dtypes[0])
                    scale, offset = src.scales[0], src.offsets[0]
                    unit, colormap = src.units[0] or "", src.tags().get(rasters.COLORMAP_TAG, "")
            rows, cols = _window(boxes[output], transform, shape)
            if rows.start >= rows.stop or cols.start >= cols.stop:
                continue  # outside the canvas (a box the region's does not hold: none)
            part = np.full((rows.stop - rows.start, cols.stop - cols.start), nodata, dtype=canvas.dtype)
            reproject(values, part, src_transform=source, src_crs=crs, src_nodata=src_nodata,
                      dst_transform=transform * Affine.translation(cols.start, rows.start), dst_crs="EPSG:4326",
                      dst_nodata=nodata, resampling=Resampling.nearest)
        except RasterioError as exc:
            log.warning("job %s: %s left out of its overview: %s", job, output, exc)
            continue
        window = canvas[rows, cols]
        empty = np.isnan(window) if np.isnan(nodata) else window == nodata
        window[empty] = part[empty]
    if canvas is None:
        raise RasterioError(f"no raster of {product} {name} could be read")
    layer = _layer(product, name)
    valid = canvas[~(np.isnan(canvas) if np.isnan(nodata) else canvas == nodata)]
    style = quicklook.style_for(layer, valid.astype("float64") * scale + offset, name, unit, colormap)
    rgba = quicklook.colorize(canvas, style, nodata, scale, offset)
    images = {"picture": quicklook.picture(rgba, style, f"{product} {name} {_span(key)}", bounds),
              "map": quicklook.png(rgba)}
    west, south, east, north = bounds
    drawn = {"bounds": [west, south, east - 360.0 if east > 180.0 else east, north], "unit": style.unit,
             "legend": quicklook.legend_json(style), "tiles": len(members)}
    return drawn, images


def _window(box: tuple[float, float, float, float], transform: Affine, shape: tuple[int, int]) -> tuple[slice, slice]:
    """The rows and columns of the canvas (``transform``, ``shape``) that a raster whose
    lon/lat box is ``box`` can cover, ``MARGIN`` pixels wider each side (the box is its
    outline's, densified: a curved edge may pass a little beyond it); every column for a
    box across ±180°."""
    west, south, east, north = box
    left, top = ~transform * (west, north)
    right, bottom = ~transform * (east, south)
    rows = slice(max(0, math.floor(top) - MARGIN), min(shape[0], math.ceil(bottom) + MARGIN))
    if east < west:
        return rows, slice(0, shape[1])
    return rows, slice(max(0, math.floor(left) - MARGIN), min(shape[1], math.ceil(right) + MARGIN))


def _middle(box: tuple[float, float, float, float]) -> float:
    """The middle longitude of a lon/lat box (west > east: across ±180°, past 180°)."""
    west, _, east, _ = box
    return (west + (east if east >= west else east + 360.0)) / 2


def region_box(boxes: list[tuple[float, float, float, float]]) -> tuple[float, float, float, float]:
    """The smallest lon/lat box holding ``boxes`` (each west > east when across ±180°): the
    turn of the Earth less the widest stretch of longitude none of them covers, its east
    past 180° when it crosses ±180° (so that it is drawn as one image of the region, not of
    the world between its two sides)."""
    spans = sorted((w, e if e >= w else e + 360.0) for w, _, e, _ in boxes)
    joined: list[list[float]] = []
    for west, east in spans:
        if joined and west <= joined[-1][1]:
            joined[-1][1] = max(joined[-1][1], east)
        else:
            joined.append([west, east])
    gaps = [(joined[i + 1][0] - joined[i][1], i) for i in range(len(joined) - 1)]
    widest = max(gaps, default=(-1.0, 0))
    south, north = min(b[1] for b in boxes), max(b[3] for b in boxes)
    if joined[0][0] + 360.0 - joined[-1][1] >= widest[0]:  # nothing is missing across ±180°
        return joined[0][0], south, joined[-1][1], north
    return joined[widest[1] + 1][0], south, joined[widest[1]][1] + 360.0, north


def build(clients: Clients, job: str, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The job's overviews (reductions first: a span's summary is the best first look).
    Those drawn before are copied from the cache, :data:`COPIES_AT_ONCE` at a time (a
    read, a touch and two writes each); the others are drawn :data:`DRAWN_AT_ONCE` at a
    time."""
    groups = sorted(groups_of(clients, entries).items(), key=lambda kv: (not kv[0][3], kv[0]))
    addresses = [cache_key(key, members) for key, members in groups]
    with ThreadPoolExecutor(COPIES_AT_ONCE, thread_name_prefix="overview-copy") as pool:
        found = list(pool.map(lambda group, address: copied(clients, job, group[0], address), groups, addresses))

    def made(group: tuple[Group, list[tuple[dict[str, Any], str]]], address: str | None,
             done: dict[str, Any] | None) -> dict[str, Any] | None:
        key, members = group
        try:
            return done or render(clients, job, key, members, address)
        except RasterioError as exc:
            log.warning("job %s: no overview of %s: %s", job, key, exc)
            return None

    with ThreadPoolExecutor(DRAWN_AT_ONCE, thread_name_prefix="overview-draw") as pool:
        return [one for one in pool.map(made, groups, addresses, found) if one is not None]
