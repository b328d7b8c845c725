"""Reprojection: mosaic a task's MODIS sinusoidal sources and warp them onto one target
tile with GDAL's warper (through rasterio), then write a Cloud-Optimized GeoTIFF.

Pure: local files in, bytes out, no storage — the worker's stage and ``bagpipe run-stage``
run the same code. The cache key names everything the output depends on.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import rasterio
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.io import MemoryFile
from rasterio.merge import merge
from rasterio.warp import reproject
from rio_cogeo.cogeo import cog_translate
from rio_cogeo.profiles import cog_profiles

VERSION = "reproject-1"  # change when the output of the same inputs would change


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


def cache_key(target: Target, product: str, layer: str, input_digests: Sequence[str]) -> str:
    """The content address of a reprojected tile: the stage's version, its parameters and
    the digests of its inputs (in a fixed order)."""
    spec = {"version": VERSION, "product": product, "layer": layer, "crs": target.crs,
            "bounds": [repr(b) for b in target.bounds], "res": repr(target.resolution),
            "resampling": target.resampling, "inputs": sorted(input_digests)}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def mosaic(paths: Sequence[Path]) -> tuple[np.ndarray, Affine, dict]:
    """The sources as one array on their common (sinusoidal) grid, nodata where none has data."""
    datasets = [rasterio.open(p) for p in paths]
    try:
        first = datasets[0]
        for other in datasets[1:]:
            if other.crs != first.crs or other.dtypes[0] != first.dtypes[0]:
                raise ValueError(f"{other.name} does not match {first.name} (CRS or data type)")
        if len(datasets) == 1:
            array, transform = first.read(1), first.transform
        else:
            stacked, transform = merge(datasets, nodata=first.nodata)
            array = stacked[0]
        meta = {"crs": first.crs, "nodata": first.nodata, "dtype": first.dtypes[0],
                "scale": first.scales[0], "offset": first.offsets[0]}
        return array, transform, meta
    finally:
        for d in datasets:
            d.close()


def warp(paths: Sequence[Path], target: Target, tags: dict[str, str] | None = None) -> bytes:
    """The sources reprojected onto the target, as a Cloud-Optimized GeoTIFF (deflate),
    carrying CRS, transform, nodata, scale/offset and tags naming the sources."""
    array, src_transform, meta = mosaic(paths)
    height, width = target.shape
    out = np.full((height, width), meta["nodata"], dtype=meta["dtype"])
    reproject(
        source=array, destination=out,
        src_transform=src_transform, src_crs=meta["crs"], src_nodata=meta["nodata"],
        dst_transform=target.transform, dst_crs=CRS.from_user_input(target.crs), dst_nodata=meta["nodata"],
        resampling=Resampling[target.resampling],
    )
    profile = {"driver": "GTiff", "width": width, "height": height, "count": 1, "dtype": meta["dtype"],
               "crs": CRS.from_user_input(target.crs), "transform": target.transform, "nodata": meta["nodata"]}
    with MemoryFile() as raw:
        with raw.open(**profile) as dst:
            dst.write(out, 1)
            dst.scales, dst.offsets = (meta["scale"],), (meta["offset"],)
            dst.update_tags(SOURCES=",".join(Path(p).name for p in paths), RESAMPLING=target.resampling,
                            BAGPIPE_STAGE=VERSION, **(tags or {}))
        with raw.open() as src, MemoryFile() as cog:
            cog_translate(src, cog.name, cog_profiles.get("deflate"), in_memory=True, quiet=True,
                          overview_resampling="nearest" if target.resampling == "nearest" else "average")
            return cog.read()
