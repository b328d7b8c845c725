"""Reprojection: warp one layer of a task's MODIS sinusoidal sources onto one target tile
with GDAL's warper (through rasterio), then write a Cloud-Optimized GeoTIFF.

**No seam at a MODIS tile's edge.** The MODIS tiles of a product share one pixel lattice
(tile h's first column is pixel h × 2400 of the plane's, at 500 m), so the windows of the
sources a target needs are laid on it as one mosaic and warped once: a kernel wider than a
pixel (bilinear, cubic, average) reads the pixels across a MODIS tile's edge as it reads any
others, and the target is GDAL's warp of the mosaic of its sources (``rio warp`` of it,
``tests/test_seams.py``). A target's sources are the MODIS tiles within the kernel's reach
of its footprint (``TargetTile.reads``: :data:`PAD` source pixels), not only those it
covers. Sources that do not touch on the lattice (a target across ±180° reads h00 and h35)
are warped apart, the first with data winning at each pixel.

**Kernel width: one source pixel** (:data:`KERNEL`: GDAL's ``XSCALE=1``, ``YSCALE=1``).
GDAL widens a kernel when it downsamples, by a factor it estimates for each chunk it warps
from the chunk's size and its source window's; that window is clipped to the source, so the
same target pixel warped from a window of a granule or from the whole mosaic (or as part of
a larger target) would be computed with different kernels. At one pixel a target pixel's
value depends only on where it lies: bilinear reads the 2 × 2 source pixels around its
centre, cubic the 4 × 4. A target far coarser than MODIS's pixel (a decimation rather than a
reprojection) wants ``average``, which GDAL computes over each target pixel's footprint
whatever the kernel width.

Memory follows the target tile, never the spread of its sources: each source is read only
where the target needs it (a window of at most one tile), and a target touching h00 and h35
(across the antimeridian) holds two tile windows, not the 86,400-pixel-wide box around them
(``bench/antimeridian.py``).

The product catalog, not the file, owns the encoding: values outside the layer's valid
range, its fill value and pixels its quality layer calls unusable are masked at native
resolution before the warp; the output carries the catalog's fill, scale (multiply
convention), offset and unit. A source declaring another encoding (a different data type,
or a scale that is neither the catalog's nor, HDF's divide-by convention, its reciprocal)
is refused.

Pure: local files in, bytes out, no storage — the worker's stage and ``bagpipe run-stage``
run the same code. The cache key names everything the output depends on.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import rasterio
import rasterio.shutil
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.io import MemoryFile
from rasterio.warp import reproject, transform_bounds
from rasterio.windows import Window

from pipeline.modis import hdf, quality, ranged
from pipeline.modis.granules import HDF
from pipeline.modis.grid import RADIUS, X_MIN, Y_MAX
from pipeline.modis.products import Layer, Product
from pipeline.modis.targets import REACH_PIXELS, is_modis_sinusoidal

VERSION = "reproject-3"  # change when the output of the same inputs would change
KERNEL = {"XSCALE": "1", "YSCALE": "1"}  # GDAL's warp options: a kernel one source pixel wide
KERNELS = ("bilinear", "cubic", "cubic_spline", "lanczos")  # the resamplings whose width KERNEL sets
PAD = REACH_PIXELS  # source pixels read around the target's footprint (lanczos reaches 3)
LATTICE_TOLERANCE = 1e-6  # of a pixel: a source whose first pixel is this close to the MODIS lattice is on it
HALF_PLANE = math.pi * RADIUS  # half the sinusoidal plane's width: a footprint wider crosses ±180°


@dataclass(frozen=True)
class Target:
    """Where to warp to: a CRS, bounds in it (west, south, east, north) and a pixel size."""

    crs: str
    bounds: tuple[float, float, float, float]
    resolution: float
    resampling: str = "nearest"

    @property
    def shape(self) -> tuple[int, int]:
        west, south, east, north = self.bounds
        return (max(1, math.ceil(round((north - south) / self.resolution, 6))),
                max(1, math.ceil(round((east - west) / self.resolution, 6))))

    @property
    def transform(self) -> Affine:
        west, _, _, north = self.bounds
        return Affine(self.resolution, 0.0, west, 0.0, -self.resolution, north)


@dataclass(frozen=True)
class Source:
    """One granule: its id and its files — a COG per layer (a STAC catalog's assets) on
    local disk or read by ranges where it lies (a point task's), or one HDF4 file on local
    disk holding every layer (key :data:`HDF`)."""

    granule: str
    files: dict[str, Path | ranged.Remote] = field(default_factory=dict)


class EncodingMismatch(ValueError):
    """A source file whose encoding contradicts the product catalog's."""


@dataclass
class _Raster:
    """One layer of one source: its grid, its declared encoding and a windowed read."""

    transform: Affine
    crs: CRS
    width: int
    height: int
    dtype: str
    scale: float | None
    read: Callable[[int, int, int, int], np.ndarray]  # (row, col, rows, cols) -> stored values
    prefetch: Callable[[list[ranged.Window]], None] = lambda windows: None  # the windows about to be read
    block: tuple[int, int] = (512, 512)  # the rows and columns of its blocks (an HDF4 file's: a fair guess)


@contextmanager
def _opened(source: Source, layer: str) -> Iterator[_Raster]:
    file = source.files.get(layer)
    if file is not None:
        remote = file if isinstance(file, ranged.Remote) else None
        with ranged.opened(remote) if remote is not None else rasterio.open(file) as raster:
            def read(row: int, col: int, rows: int, cols: int) -> np.ndarray:
                return np.asarray(raster.read(1, window=Window(col, row, cols, rows)))

            def prefetch(windows: list[ranged.Window]) -> None:
                if remote is not None:
                    ranged.prefetch(remote, raster, windows)
            yield _Raster(raster.transform, raster.crs, raster.width, raster.height, raster.dtypes[0],
                          raster.scales[0], read, prefetch, raster.block_shapes[0])
    elif isinstance(whole := source.files.get(HDF), Path):
        with hdf.Granule(whole) as granule:
            grid = granule.grid_of(layer)
            yield _Raster(grid.transform, CRS.from_proj4(grid.crs), grid.width, grid.height,
                          str(granule.dtype(layer)), granule.scale(layer),
                          lambda row, col, rows, cols: granule.read(layer, (row, col, rows, cols)))
    else:
        raise KeyError(f"{source.granule}: no file holds layer {layer!r}")


opened = _opened  # a source's layer, read by windows (the point stage reads its sites' so)


def check_encoding(layer: Layer, dtype: str, scale: float | None, name: str) -> None:
    """Refuse a source whose data type or declared scale contradicts the catalog."""
    if dtype != layer.dtype:
        raise EncodingMismatch(f"{name}: {layer.name} is {dtype}, the product's encoding is {layer.dtype}")
    if scale is None or math.isclose(scale, 1.0) or math.isclose(scale, layer.scale, rel_tol=1e-6):
        return
    if math.isclose(1.0 / scale, layer.scale, rel_tol=1e-6):
        return  # HDF's divide-by convention (MOD13: scale_factor 10000 for 0.0001)
    raise EncodingMismatch(f"{name}: {layer.name} declares scale {scale:g}; the product's is {layer.scale:g}")


def _window(raster: _Raster, target: Target) -> tuple[int, int, int, int] | None:
    """The (row, col, rows, cols) of the source the target's footprint covers, padded and
    clipped to the source; None if they do not meet."""
    try:
        xmin, ymin, xmax, ymax = transform_bounds(CRS.from_user_input(target.crs), raster.crs, *target.bounds,
                                                  densify_pts=21)
    except Exception:  # a target the source's CRS cannot express: let the warper decide on the whole tile
        return 0, 0, raster.height, raster.width
    if not all(map(math.isfinite, (xmin, ymin, xmax, ymax))):
        return 0, 0, raster.height, raster.width
    inverse = ~raster.transform
    cols, rows = zip(*(inverse * (x, y) for x in (xmin, xmax) for y in (ymin, ymax)), strict=True)
    col0, col1 = max(0, math.floor(min(cols)) - PAD), min(raster.width, math.ceil(max(cols)) + PAD)
    if xmax - xmin > HALF_PLANE:  # the target crosses ±180°: its edge samples miss the globe's edge
        col0, col1 = 0, raster.width
    row0, row1 = max(0, math.floor(min(rows)) - PAD), min(raster.height, math.ceil(max(rows)) + PAD)
    if col0 >= col1 or row0 >= row1:
        return None
    return row0, col0, row1 - row0, col1 - col0


def masked_values(source: Source, layer: Layer, window: tuple[int, int, int, int], raster: _Raster,
                  masks: bool = True) -> np.ndarray:
    """The layer's stored values in the window, with the fill value wherever they are outside
    the valid range, are fill, or the quality layer calls them unusable."""
    values = np.asarray(raster.read(*window))
    good = (values >= layer.valid[0]) & (values <= layer.valid[1])
    if layer.nodata is not None:
        good &= values != layer.nodata
    if masks and layer.masked_by:
        with _opened(source, layer.masked_by) as qa:
            good &= quality.usable(layer.masked_by, np.asarray(qa.read(*window)))
    return np.where(good, values, layer.fill).astype(layer.dtype)


def _on_lattice(raster: _Raster) -> tuple[float, int, int] | None:
    """The source's pixel size and its first pixel's (row, col) on the MODIS lattice of that
    size — the sinusoidal plane, its first pixel at the plane's north-west corner — or None
    for a raster off it (another CRS, a rotation, not aligned)."""
    if not is_modis_sinusoidal(raster.crs.to_dict()):
        return None
    t = raster.transform
    size = t.a
    if t.b or t.d or size <= 0 or not math.isclose(-t.e, size, rel_tol=1e-9):
        return None
    col, row = (t.c - X_MIN) / size, (Y_MAX - t.f) / size
    if abs(col - round(col)) > LATTICE_TOLERANCE or abs(row - round(row)) > LATTICE_TOLERANCE:
        return None
    return size, round(row), round(col)


@dataclass
class _Part:
    """One source's masked window: its transform, CRS, values and (size, row, col) on the
    MODIS lattice (None: off it)."""

    transform: Affine
    crs: CRS
    values: np.ndarray
    place: tuple[float, int, int] | None

    def touches(self, other: _Part) -> bool:
        """Whether both lie on one lattice and overlap or share an edge or a corner there."""
        if self.place is None or other.place is None or self.place[0] != other.place[0]:
            return False
        (_, r0, c0), (_, r1, c1) = self.place, other.place
        (h0, w0), (h1, w1) = self.values.shape, other.values.shape
        return bool(r0 <= r1 + h1 and r1 <= r0 + h0 and c0 <= c1 + w1 and c1 <= c0 + w0)


def _mosaics(parts: list[_Part], layer: Layer) -> list[_Part]:
    """The windows as mosaics to warp: those that touch on the MODIS lattice, directly or
    through others, laid in one (the earlier source's pixel where two have data), each other
    one alone; in the order of their first window."""
    groups: list[list[int]] = []
    for index, part in enumerate(parts):
        joined = [g for g in groups if any(parts[i].touches(part) for i in g)]
        groups = [g for g in groups if g not in joined] + [sorted([index, *(i for g in joined for i in g)])]
    found = []
    for group in sorted(groups):
        if len(group) == 1:
            found.append(parts[group[0]])
            continue
        placed = [(parts[i], parts[i].place) for i in group]
        row0 = min(p[1] for _, p in placed if p)
        col0 = min(p[2] for _, p in placed if p)
        rows = max(p[1] + part.values.shape[0] for part, p in placed if p) - row0
        cols = max(p[2] + part.values.shape[1] for part, p in placed if p) - col0
        mosaic = np.full((rows, cols), layer.fill, dtype=layer.dtype)
        for part, place in placed:
            assert place is not None  # touching parts lie on the lattice
            into = mosaic[place[1] - row0:place[1] - row0 + part.values.shape[0],
                          place[2] - col0:place[2] - col0 + part.values.shape[1]]
            empty = into == layer.fill
            into[empty] = part.values[empty]
        first = parts[group[0]]
        assert first.place is not None
        transform = first.transform * Affine.translation(col0 - first.place[2], row0 - first.place[1])
        found.append(_Part(transform, first.crs, mosaic, (first.place[0], row0, col0)))
    return found


def warp_array(sources: Sequence[Source], layer: Layer, target: Target, masks: bool = True) -> np.ndarray:
    """The layer of the sources on the target grid (the layer's fill where none has data):
    each source's window masked at native resolution, the windows that touch on the MODIS
    lattice warped as one mosaic at a kernel of one source pixel."""
    parts = []
    for source in sources:
        with _opened(source, layer.name) as raster:
            check_encoding(layer, raster.dtype, raster.scale, source.granule)
            window = _window(raster, target)
            if window is None:
                continue
            row, col = window[0], window[1]
            lattice = _on_lattice(raster)
            parts.append(_Part(raster.transform * Affine.translation(col, row), raster.crs,
                               masked_values(source, layer, window, raster, masks),
                               (lattice[0], lattice[1] + row, lattice[2] + col) if lattice else None))
    dst_crs = CRS.from_user_input(target.crs)
    out = np.full(target.shape, layer.fill, dtype=layer.dtype)
    mosaics = _mosaics(parts, layer)
    del parts
    options = KERNEL if target.resampling in KERNELS else {}
    part = np.empty_like(out) if len(mosaics) > 1 else out
    for mosaic in mosaics:
        part.fill(layer.fill)
        reproject(source=mosaic.values, destination=part, src_transform=mosaic.transform, src_crs=mosaic.crs,
                  src_nodata=layer.fill, dst_transform=target.transform, dst_crs=dst_crs,
                  dst_nodata=layer.fill, resampling=Resampling[target.resampling], **options)
        if part is not out:
            empty = out == layer.fill
            out[empty] = part[empty]
    return out


def warp(sources: Sequence[Source], product: Product, layer: str, target: Target,
         tags: dict[str, str] | None = None, masks: bool = True) -> bytes:
    """One layer of the sources reprojected onto the target, as a Cloud-Optimized GeoTIFF
    (deflate) carrying CRS, transform, the catalog's fill, scale, offset and unit, and tags
    naming the granules it was made from."""
    spec = product.layer(layer)
    out = warp_array(sources, spec, target, masks)
    height, width = target.shape
    profile = {"driver": "GTiff", "width": width, "height": height, "count": 1, "dtype": spec.dtype,
               "crs": CRS.from_user_input(target.crs), "transform": target.transform, "nodata": spec.fill}
    with MemoryFile() as raw:
        with raw.open(**profile) as dst:
            dst.write(out, 1)
            dst.scales, dst.offsets = (spec.scale,), (spec.offset,)
            if spec.unit:
                dst.units = (spec.unit,)
            dst.set_band_description(1, spec.name)
            dst.update_tags(SOURCES=",".join(s.granule for s in sources), PRODUCT=product.name, LAYER=spec.name,
                            VALID_RANGE=f"{spec.valid[0]:g},{spec.valid[1]:g}", RESAMPLING=target.resampling,
                            QUALITY_MASK=spec.masked_by if masks and spec.masked_by else "none",
                            BAGPIPE_STAGE=VERSION, **(tags or {}))
        del out
        with raw.open() as src, MemoryFile() as cog:  # GDAL's COG driver keeps the unit, which rio-cogeo drops
            rasterio.shutil.copy(src, cog.name, driver="COG", compress="DEFLATE", blocksize=512,
                                 overview_resampling="nearest" if target.resampling == "nearest" else "average")
            return bytes(cog.read())


def cache_key(target: Target, product: str, layer: str, input_digests: Sequence[str], masks: bool = True) -> str:
    """The content address of a reprojected tile: the stage's version, its parameters and
    the digests of its inputs (in a fixed order)."""
    spec = {"version": VERSION, "product": product, "layer": layer, "crs": target.crs,
            "bounds": [repr(b) for b in target.bounds], "res": repr(target.resolution),
            "resampling": target.resampling, "masks": masks, "inputs": sorted(input_digests)}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
