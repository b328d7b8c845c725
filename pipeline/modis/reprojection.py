"""Reprojection: warp one layer of a task's MODIS sinusoidal sources onto one target tile
with GDAL's warper (through rasterio), then write a Cloud-Optimized GeoTIFF.

Each source is read only where the target needs it (a window of one granule, at most one
tile) and warped into an array of the target's own shape; the first source with data at a
pixel wins. Peak memory follows the target tile, never the spread of its sources: a target
touching h00 and h35 (across the antimeridian) holds two tile windows in turn, not the
86,400-pixel-wide box around them (``bench/antimeridian.py``).

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

from pipeline.modis import hdf, quality
from pipeline.modis.granules import HDF
from pipeline.modis.grid import RADIUS
from pipeline.modis.products import Layer, Product

VERSION = "reproject-2"  # change when the output of the same inputs would change
PAD = 2  # source pixels read around the target's footprint (bilinear needs its neighbours)
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
    """One granule on local disk: its id and its files — a COG per layer (a STAC catalog's
    assets) or one HDF4 file holding every layer (key :data:`HDF`)."""

    granule: str
    files: dict[str, Path] = field(default_factory=dict)


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


@contextmanager
def _opened(source: Source, layer: str) -> Iterator[_Raster]:
    if layer in source.files:
        with rasterio.open(source.files[layer]) as raster:
            def read(row: int, col: int, rows: int, cols: int) -> np.ndarray:
                return np.asarray(raster.read(1, window=Window(col, row, cols, rows)))
            yield _Raster(raster.transform, raster.crs, raster.width, raster.height, raster.dtypes[0],
                          raster.scales[0], read)
    elif HDF in source.files:
        with hdf.Granule(source.files[HDF]) as granule:
            grid = granule.grid_of(layer)
            yield _Raster(grid.transform, CRS.from_proj4(grid.crs), grid.width, grid.height,
                          str(granule.dtype(layer)), granule.scale(layer),
                          lambda row, col, rows, cols: granule.read(layer, (row, col, rows, cols)))
    else:
        raise KeyError(f"{source.granule}: no file holds layer {layer!r}")


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


def warp_array(sources: Sequence[Source], layer: Layer, target: Target, masks: bool = True) -> np.ndarray:
    """The layer of the sources on the target grid (the layer's fill where none has data)."""
    dst_crs = CRS.from_user_input(target.crs)
    out = np.full(target.shape, layer.fill, dtype=layer.dtype)
    part = np.empty_like(out)
    for source in sources:
        with _opened(source, layer.name) as raster:
            check_encoding(layer, raster.dtype, raster.scale, source.granule)
            window = _window(raster, target)
            if window is None:
                continue
            values = masked_values(source, layer, window, raster, masks)
            row, col = window[0], window[1]
            part.fill(layer.fill)
            reproject(source=values, destination=part,
                      src_transform=raster.transform * Affine.translation(col, row), src_crs=raster.crs,
                      src_nodata=layer.fill, dst_transform=target.transform, dst_crs=dst_crs,
                      dst_nodata=layer.fill, resampling=Resampling[target.resampling])
            del values
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
