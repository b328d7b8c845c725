"""Sites sampled on a product's own grid: the point task and the gather of its tables.

- A **point task** (``points``) per (MODIS tile holding sites, date, product) reads the
  granule's files its layers need by windows — the pixel holding each of its sites and, if
  asked, the 3 × 3 or 5 × 5 window around it — with no reprojection. A COG in blob storage
  (a STAC catalog's asset) is read where it lies, by byte ranges: its header and the blocks
  its sites' windows fall in, fetched before they are read (``pipeline.modis.ranged``), not
  the whole file, and nothing is cached in ``sources``; a missing file or a busy store fails
  the task as a whole fetch would (``access.Access.ranged``). An HDF4 file (NASA's archive)
  is fetched whole into the ``sources`` cache, as a tile task fetches it. Each site gets a
  row per layer: its value (physical: stored × scale + offset), its quality code and the
  code's fields as the user guide names them, whether the product's masking rule calls it
  usable, and the mean and count of the usable pixels of its window (a window at the tile's
  edge is cut there). A pixel of fill or outside the valid range (the sea, a gap) is a row that says
  ``no data``, as is every site of a (tile, date) the catalog has no granule of. A derived
  layer (``derive``) is its expression over the site's values. The rows are one Parquet
  part in ``tiles``, content-addressed by what they are made of (the code's version, the
  sites' digest, the window, the layers and the source files' MD5s: storage's Content-MD5
  of a file read by ranges, else its ETag).

The gather of the parts into the job's one table is ``pipeline.reduction.gather``'s.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline import stages
from pipeline.failures import FailureClass, StageFailure
from pipeline.modis import POINT_STAGE, collection, quality, ranged, reprojection
from pipeline.modis.access import BlobFile, access_for
from pipeline.modis.granules import HDF, Granule, from_param
from pipeline.modis.grid import locate
from pipeline.modis.products import CATALOG, Layer, Product
from pipeline.modis.targets import is_modis_sinusoidal
from pipeline.modis.tilestage import derived_of, files_for, layers_of
from pipeline.science import tables, vectors
from pipeline.science.tables import SITES
from pipeline.science.vectors import Site
from pipeline.stages import StageContext
from pipeline.storage import cache, names

VERSION = "points-1"  # change when the rows of the same inputs would change


def sites_in(sites: list[Site], tile: str, pixels: int) -> list[tuple[Site, int, int]]:
    """The sites in MODIS tile ``tile``, each with its pixel's row and column on the
    product's grid of ``pixels`` per side."""
    found = []
    for one in sites:
        where, row, col = locate(one.lon, one.lat, pixels)
        if where.name == tile:
            found.append((one, row, col))
    return found


class _Rows:
    """A part's rows, column by column."""

    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {name: [] for name in SITES.names}

    def add(self, **values: Any) -> None:
        for name in SITES.names:
            self.columns[name].append(values.get(name))

    def table(self) -> pa.Table:
        return pa.table(self.columns, schema=SITES)


def _flags(layer: str, code: int) -> str:
    """A quality code's fields as the user guide names their values."""
    found = []
    for field in quality.fields_of(layer):
        value = int(field.of(np.asarray(code)))
        found.append(f"{field.name}={field.meanings.get(value, str(value))}")
    return "; ".join(found)


def _boxes(placed: list[tuple[Site, int, int]], half: int, size: int) -> list[ranged.Window]:
    """Each site's window (row, col, rows, cols), cut at the tile's edge, its pixel in the
    middle unless cut."""
    found = []
    for _, row, col in placed:
        row0, col0 = max(0, row - half), max(0, col - half)
        found.append((row0, col0, min(size, row + half + 1) - row0, min(size, col + half + 1) - col0))
    return found


def _read(raster: Any, boxes: list[ranged.Window]) -> list[np.ndarray]:
    """The stored values of each box, its blocks fetched first (all at once, where the file is
    remote). The boxes inside one block are cut from one read of the part of the block they
    span (a read costs far more than its pixels: a thousand sites are a few dozen reads, not
    a thousand); a box across a block's edge is read alone."""
    raster.prefetch(boxes)
    height, width = raster.block
    inside: dict[tuple[int, int], list[int]] = {}
    found: dict[int, np.ndarray] = {}
    for number, (row, col, rows, cols) in enumerate(boxes):
        block = (row // height, col // width)
        if ((row + rows - 1) // height, (col + cols - 1) // width) == block:
            inside.setdefault(block, []).append(number)
        else:
            found[number] = np.asarray(raster.read(row, col, rows, cols))
    for numbers in inside.values():
        row0 = min(boxes[n][0] for n in numbers)
        col0 = min(boxes[n][1] for n in numbers)
        row1 = max(boxes[n][0] + boxes[n][2] for n in numbers)
        col1 = max(boxes[n][1] + boxes[n][3] for n in numbers)
        values = np.asarray(raster.read(row0, col0, row1 - row0, col1 - col0))
        for n in numbers:
            row, col, rows, cols = boxes[n]
            found[n] = values[row - row0:row - row0 + rows, col - col0:col - col0 + cols]
    return [found[n] for n in range(len(boxes))]


def _check_grid(raster: Any, product: Product, granule: str) -> None:
    """Refuse a file off the product's own grid, where the sites' pixels were placed."""
    if (raster.height, raster.width) != (product.pixels, product.pixels) or \
            not is_modis_sinusoidal(raster.crs.to_dict()):
        raise reprojection.EncodingMismatch(f"{granule}: not on {product.name}'s grid of {product.pixels} pixels "
                                            "in the MODIS sinusoidal projection")


def _valid(layer: Layer, values: np.ndarray) -> np.ndarray:
    good = (values >= layer.valid[0]) & (values <= layer.valid[1])
    if layer.nodata is not None:
        good &= values != layer.nodata
    return np.asarray(good)


def sample(source: reprojection.Source, product: Product, layers: list[str], derived: dict[str, Any],
           placed: list[tuple[Site, int, int]], window: int, day: str, tile: str) -> pa.Table:
    """The rows of the sites ``placed`` (with their pixels) in one granule's files."""
    rows = _Rows()
    half = window // 2
    values: dict[str, list[float]] = {}  # per layer ref: each site's physical value (NaN: none), for derived layers
    means: dict[str, list[np.ndarray]] = {}
    for name in layers:
        layer = product.layer(name)
        with reprojection.opened(source, name) as raster:
            reprojection.check_encoding(layer, raster.dtype, raster.scale, source.granule)
            _check_grid(raster, product, source.granule)
            stored = _read(raster, _boxes(placed, half, raster.height))
        codes: list[np.ndarray | None] = [None] * len(placed)
        if layer.masked_by:
            with reprojection.opened(source, layer.masked_by) as qa:
                _check_grid(qa, product, source.granule)
                codes = [*_read(qa, _boxes(placed, half, qa.height))]
        ref = f"{product.name}.{name}"
        values[ref], means[ref] = [], []
        for (site, row, col), block, qa_block in zip(placed, stored, codes, strict=True):
            centre = (row - max(0, row - half), col - max(0, col - half))
            good = _valid(layer, block)
            usable = good & quality.usable(layer.masked_by, qa_block) if qa_block is not None else good
            physical = np.where(good, block.astype(np.float64) * layer.scale + layer.offset, np.nan)
            means[ref].append(np.where(usable, physical, np.nan))
            value = float(physical[centre])
            code = int(qa_block[centre]) if qa_block is not None else None
            ok = bool(good[centre])
            values[ref].append(value if ok and bool(usable[centre]) else np.nan)
            count = int(usable.sum())
            rows.add(site=site.id, lon=site.lon, lat=site.lat, product=product.name, layer=name,
                     date=np.datetime64(day, "D").astype(object), value=value if ok else None, unit=layer.unit,
                     quality=code, quality_flags=_flags(layer.masked_by, code) if code is not None else None,
                     usable=bool(usable[centre]) if ok else False,
                     window_mean=float(np.nanmean(means[ref][-1])) if window > 1 and count else None,
                     window_count=count if window > 1 else None,
                     status="ok" if ok and usable[centre] else ("unusable" if ok else "no data"),
                     tile=tile, row=row, col=col, granule=source.granule)
    for name, parsed in derived.items():
        unit = parsed.encoding().unit
        result = parsed.evaluate({ref: np.asarray(v, np.float64) for ref, v in values.items()})
        windowed = None
        if window > 1:
            windowed = [parsed.evaluate({ref: blocks[i] for ref, blocks in means.items()}) for i in range(len(placed))]
        for i, (site, row, col) in enumerate(placed):
            value = float(result[i])
            found = bool(np.isfinite(value))
            near = windowed[i] if windowed is not None else None
            near_count = int(np.isfinite(near).sum()) if near is not None else None
            rows.add(site=site.id, lon=site.lon, lat=site.lat, product=product.name, layer=name,
                     date=np.datetime64(day, "D").astype(object), value=value if found else None, unit=unit,
                     usable=found, window_mean=float(np.nanmean(near)) if near is not None and near_count else None,
                     window_count=near_count, status="ok" if found else "no data", tile=tile, row=row, col=col,
                     granule=source.granule)
    return rows.table()


def no_data(product: Product, layers: list[str], derived: dict[str, Any], placed: list[tuple[Site, int, int]],
            day: str, tile: str) -> pa.Table:
    """The rows of sites whose (tile, date) the catalog has no granule of: no data each."""
    rows = _Rows()
    for name in [*layers, *derived]:
        unit = product.layer(name).unit if name in product.layer_names else ""
        for site, row, col in placed:
            rows.add(site=site.id, lon=site.lon, lat=site.lat, product=product.name, layer=name,
                     date=np.datetime64(day, "D").astype(object), unit=unit, usable=False, status="no data",
                     tile=tile, row=row, col=col)
    return rows.table()


def content_key(params: dict[str, str], digests: list[str]) -> str:
    """A part's content address: the code's version, what is sampled and the source files'
    MD5s (none for a (tile, date) without a granule)."""
    spec = [VERSION, params["product"], params["tile"], params["date"], layers_of(params),
            params.get("derived", ""), params["sites"], params["window"], sorted(digests)]
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()


@stages.stage(POINT_STAGE)
def points(ctx: StageContext) -> None:
    """One point task: its sites' rows from one granule (or, with none, rows of no data)."""
    params = ctx.params
    product = CATALOG[params["product"]]
    if "granules" not in params:
        raise StageFailure(FailureClass.USER_CODE, "the task was planned without a catalog search")
    sites = vectors.sites_from(stages.kept_document(ctx.clients, params["sites"]))
    placed = sites_in(sites, params["tile"], product.pixels)
    layers, derived = layers_of(params), derived_of(params)
    granules = from_param(params["granules"])
    owner = f"{ctx.part}/{ctx.task}"
    name = f"{product.name}.{params['tile']}.{params['date']}.sites.parquet"
    if not granules:
        blob = names.table_blob(content_key(params, []), name)
        _made(ctx, blob, lambda: tables.to_parquet(no_data(product, layers, derived, placed, params["date"],
                                                           params["tile"])), owner)
        return
    (granule,) = granules[:1]
    files = _files(granule, product, layers)
    access = access_for(ctx.clients.settings)
    remote = {key: access.ranged(granule.href(key)) if key != HDF else None for key in files}
    if all(remote.values()):
        _sampled_by_ranges(ctx, params, product, granule, {k: r for k, r in remote.items() if r}, placed, name, owner)
        return

    def collect(key: str, want: bool) -> cache.Cached:
        return collection.collect(ctx.clients, product, granule, key, files[key], want, owner, retry=ctx.attempt > 1)

    found = {key: collect(key, False) for key in files}
    blob = names.table_blob(content_key(params, [f.md5.hex() for f in found.values()]), name)

    def make() -> bytes:
        with tempfile.TemporaryDirectory(prefix="bagpipe-points-") as folder:
            local: dict[str, Path | ranged.Remote] = {}
            for key in files:
                got = found[key] if found[key].data is not None else collect(key, True)
                path = Path(folder, f"{key}.bin")
                path.write_bytes(got.data or b"")
                local[key] = path
            ctx.progress(0.5)
            return _sampled(reprojection.Source(granule.id, local), params, product, placed)

    _made(ctx, blob, make, owner)


def _sampled_by_ranges(ctx: StageContext, params: dict[str, str], product: Product, granule: Granule,
                       remote: dict[str, BlobFile], placed: list[tuple[Site, int, int]], name: str,
                       owner: str) -> None:
    """A granule's COGs in blob storage, read where they lie by the blocks holding the sites
    (not fetched whole into the ``sources`` cache: a task wants a few blocks of each, and the
    peers read no more); its part named by the files' identities (the MD5s storage keeps)."""
    blob = names.table_blob(content_key(params, [r.identity for r in remote.values()]), name)

    def make() -> bytes:
        files: dict[str, Path | ranged.Remote] = {key: ranged.Remote(r.url, r.size, r.read)
                                                  for key, r in remote.items()}
        try:
            return _sampled(reprojection.Source(granule.id, files), params, product, placed)
        except reprojection.EncodingMismatch as exc:
            raise StageFailure(FailureClass.BAD_SOURCE, str(exc)) from None

    _made(ctx, blob, make, owner)


def _sampled(source: reprojection.Source, params: dict[str, str], product: Product,
             placed: list[tuple[Site, int, int]]) -> bytes:
    return tables.to_parquet(sample(source, product, layers_of(params), derived_of(params), placed,
                                    window=int(params["window"]), day=params["date"], tile=params["tile"]))


def _files(granule: Granule, product: Product, layers: list[str]) -> dict[str, list[str]]:
    """The granule's files the layers need (key → the layers read from it)."""
    found: dict[str, list[str]] = {}
    for layer in layers:
        for key, read in files_for(granule, product, layer).items():
            found.setdefault(key, [])
            found[key] += [name for name in read if name not in found[key]]
    return found


def _made(ctx: StageContext, blob: str, make: Any, owner: str) -> None:
    made = cache.ensure(ctx.clients.transfers, ctx.clients.tiles, blob, make, "application/vnd.apache.parquet",
                        want_data=False, owner=owner, tidy=ctx.attempt > 1)
    ctx.outputs.append(names.TILE_OUTPUT_PREFIX + blob)
    ctx.cached = not made.made
