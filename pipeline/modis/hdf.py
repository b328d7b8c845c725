"""HDF4-EOS granules (NASA's archive format) read with pyhdf: a layer is the SDS of its name,
georeferenced by its grid's corners in ``StructMetadata.0`` (``UpperLeftPointMtrs`` /
``LowerRightMtrs``, the GCTP sinusoidal sphere of ``ProjParams``). rasterio's wheels have no
HDF4 driver; what is read here is an array with its transform and CRS, which the warp takes
as it takes a GeoTIFF's.

A layer is asked for by its catalog name (Planetary Computer's asset key); NASA names some
SDS with spaces where the key has underscores (``500m 16 days NDVI``, ``Burn Date``), and
either name finds it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from affine import Affine
from pyhdf.error import HDF4Error
from pyhdf.SD import SD, SDC

_GROUP = re.compile(r"GROUP=GRID_\d+(.*?)END_GROUP=GRID_\d+", re.S)
_FIELD = re.compile(r'DataFieldName="([^"]+)"')
_PAIR = re.compile(r"(UpperLeftPointMtrs|LowerRightMtrs)=\(([-\d.eE+]+),([-\d.eE+]+)\)")
_DIM = re.compile(r"\b([XY]Dim)=(\d+)")
_PROJ = re.compile(r"Projection=(\w+)")
_SPHERE = re.compile(r"ProjParams=\(([-\d.eE+]+)")


class NotModisGrid(ValueError):
    """The file is HDF4 but not a MODIS sinusoidal grid bagpipe can georeference."""


@dataclass(frozen=True)
class Grid:
    """One HDF-EOS grid: its size, corners (sinusoidal metres) and the fields it holds."""

    width: int
    height: int
    upper_left: tuple[float, float]
    lower_right: tuple[float, float]
    radius: float
    fields: tuple[str, ...]

    @property
    def transform(self) -> Affine:
        (x0, y0), (x1, y1) = self.upper_left, self.lower_right
        return Affine((x1 - x0) / self.width, 0.0, x0, 0.0, (y1 - y0) / self.height, y0)

    @property
    def crs(self) -> str:
        """The sinusoidal projection on the grid's own sphere (MODIS's: ``pipeline.modis.targets.SINUSOIDAL_PROJ4``)."""
        return f"+proj=sinu +lon_0=0 +x_0=0 +y_0=0 +R={self.radius!r} +units=m +no_defs"


def grids(struct: str) -> list[Grid]:
    """The grids that ``StructMetadata.0`` (ODL text) describes."""
    found = []
    for body in _GROUP.findall(struct):
        corners = {m[1]: (float(m[2]), float(m[3])) for m in _PAIR.finditer(body)}
        dims = {m[1]: int(m[2]) for m in _DIM.finditer(body)}
        projection, sphere = _PROJ.search(body), _SPHERE.search(body)
        if len(corners) != 2 or len(dims) != 2 or not projection or projection[1] != "GCTP_SNSOID" or not sphere:
            raise NotModisGrid("the grid is not a MODIS sinusoidal grid")
        found.append(Grid(dims["XDim"], dims["YDim"], corners["UpperLeftPointMtrs"], corners["LowerRightMtrs"],
                          float(sphere[1]), tuple(_FIELD.findall(body))))
    return found


class Granule:
    """An open HDF4-EOS file; use as a context manager."""

    def __init__(self, path: Path) -> None:
        try:
            self._sd = SD(str(path), SDC.READ)
        except HDF4Error as exc:
            raise NotModisGrid(f"not an HDF4 file ({exc})") from None
        struct = self._sd.attributes().get("StructMetadata.0")
        if not isinstance(struct, str):
            self.close()
            raise NotModisGrid("no StructMetadata.0: not HDF-EOS")
        self.grids = grids(struct)

    def grid_of(self, layer: str) -> Grid:
        return self._field(layer)[0]

    def _field(self, layer: str) -> tuple[Grid, str]:
        """The grid holding a layer and the layer's SDS name in the file."""
        for grid in self.grids:
            for name in grid.fields:
                if layer in (name, name.replace(" ", "_")):
                    return grid, name
        raise KeyError(f"the granule has no layer {layer!r}")

    def dtype(self, layer: str) -> np.dtype:
        found: np.dtype[Any] = self._select(layer).get(start=(0, 0), count=(1, 1)).dtype
        return found

    def scale(self, layer: str) -> float | None:
        """The SDS's own ``scale_factor`` attribute, if it has one."""
        value = self._select(layer).attributes().get("scale_factor")
        return float(value) if value is not None else None

    def read(self, layer: str, window: tuple[int, int, int, int] | None = None) -> np.ndarray:
        """The layer's stored values; ``window``: (row, col, rows, cols) of it only."""
        sds = self._select(layer)
        if window is None:
            return np.asarray(sds.get())
        row, col, rows, cols = window
        return np.asarray(sds.get(start=(row, col), count=(rows, cols)))

    def _select(self, layer: str) -> Any:  # pyhdf's SDS: untyped
        _, name = self._field(layer)
        try:
            return self._sd.select(name)
        except HDF4Error as exc:
            raise KeyError(f"the granule's layer {layer!r} cannot be read ({exc})") from None

    def close(self) -> None:
        self._sd.end()

    def __enter__(self) -> Granule:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
