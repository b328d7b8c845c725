"""The rasters the built-in work reads and writes: target tiles as Cloud-Optimized GeoTIFFs,
each band's encoding (data type, nodata, scale, offset, unit) in the file itself, as GDAL,
rasterio, xarray and odc-stac read it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import rasterio.errors
import rasterio.shutil
from affine import Affine
from rasterio.io import MemoryFile

from pipeline.science.encoding import Encoding

COLORMAP_TAG = "BAGPIPE_COLORMAP"  # the colour ramp a raster's maker declared (pipeline.science.ramps)


@dataclass(frozen=True)
class Grid:
    """Where a tile's pixels are: its CRS (as rasterio holds it), transform and shape."""

    crs: Any
    transform: Affine
    shape: tuple[int, int]

    @classmethod
    def of(cls, path: Path) -> Grid:
        with rasterio.open(path) as src:
            return cls(src.crs, src.transform, (src.height, src.width))


def read(path: Path, rows: slice | None = None, band: int = 1) -> np.ndarray:
    """A band's stored values (a block of ``rows`` of it, if given)."""
    with rasterio.open(path) as src:
        if rows is None:
            return np.asarray(src.read(band))
        window = ((rows.start or 0, min(rows.stop or src.height, src.height)), (0, src.width))
        return np.asarray(src.read(band, window=window))


def tags(path: Path) -> dict[str, str]:
    """A raster's dataset tags."""
    with rasterio.open(path) as src:
        return dict(src.tags())


def write_cog(bands: Sequence[np.ndarray], grid: Grid, encoding: Encoding, names: Sequence[str],
              tags: dict[str, str], categorical: bool = False) -> bytes:
    """Stored ``bands`` (in ``encoding``'s type) as one Cloud-Optimized GeoTIFF (deflate,
    512-pixel blocks) with the encoding's nodata, scale, offset and unit on every band, each
    band named, and ``tags``."""
    height, width = grid.shape
    profile = {"driver": "GTiff", "width": width, "height": height, "count": len(bands), "dtype": encoding.dtype,
               "crs": grid.crs, "transform": grid.transform, "nodata": encoding.fill}
    with MemoryFile() as raw:
        with raw.open(**profile) as dst:
            for index, (band, name) in enumerate(zip(bands, names, strict=True), start=1):
                dst.write(band.astype(encoding.dtype, copy=False), index)
                dst.set_band_description(index, name)
            dst.scales, dst.offsets = (encoding.scale,) * len(bands), (encoding.offset,) * len(bands)
            if encoding.unit:
                dst.units = (encoding.unit,) * len(bands)
            dst.update_tags(**tags)
        with raw.open() as src, MemoryFile() as cog:
            rasterio.shutil.copy(src, cog.name, driver="COG", compress="DEFLATE", blocksize=512,
                                 overview_resampling="nearest" if categorical else "average")
            return bytes(cog.read())


def declare(path: Path, unit: str, colormap: str) -> bool:
    """Write a raster's declared ``unit`` on its bands that have none and its colour ramp
    in its :data:`COLORMAP_TAG` tag (a reducer's ``output``), so that its STAC item and its
    overview say them; a unit the file's maker set is kept. True if the file changed; a
    file GDAL cannot read as a raster is left as it is. The file may no longer be a
    Cloud-Optimized GeoTIFF afterwards (:func:`make_cog` rewrites it)."""
    if not unit and not colormap:
        return False
    try:
        with rasterio.open(path, "r+") as dst:
            units = tuple(found or unit for found in dst.units)
            changed = units != dst.units or bool(colormap and dst.tags().get(COLORMAP_TAG) != colormap)
            if units != dst.units:
                dst.units = units
            if colormap and dst.tags().get(COLORMAP_TAG) != colormap:
                dst.update_tags(**{COLORMAP_TAG: colormap})
    except rasterio.errors.RasterioError:
        return False
    return changed


def make_cog(path: Path) -> bool:
    """Rewrite the GeoTIFF at ``path`` as a Cloud-Optimized GeoTIFF (deflate, 512-pixel
    blocks, overviews where it is large enough; its bands, nodata, scales, units and tags
    kept) unless it is one already, by rio-cogeo's strict check (its IFDs before its data,
    tiled, overviews where needed): a program's raster is published as every other product
    is, streamable by range reads. True if it was rewritten; a file GDAL cannot read as a
    raster is left as it is."""
    from rio_cogeo.cogeo import cog_validate

    rewritten = path.with_name(path.name + ".cog")
    try:
        valid, _, _ = cog_validate(str(path), strict=True, quiet=True)
        if valid:
            return False
        with rasterio.open(path) as src:
            rasterio.shutil.copy(src, str(rewritten), driver="COG", compress="DEFLATE", blocksize=512)
    except rasterio.errors.RasterioError:
        rewritten.unlink(missing_ok=True)
        return False
    rewritten.replace(path)
    return True
