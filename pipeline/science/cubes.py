"""Cubes: one array (time, y, x) of a layer over a job's region and dates, written a tile
and date at a time so that memory holds one tile, whatever the cube's size.

Two formats, both laid out as the CF conventions (1.8) have it, which ``xarray`` decodes
with no extra step: a netCDF-4 file (through ``h5netcdf``) or a Zarr store (format 2, the
one every Zarr reader opens, kept as a zip file). Each holds

- ``time`` (days since 1970-01-01: a composite's first day, or a group's), ``y`` and ``x``
  (pixel centres, in the grid's CRS, with their standard names and units);
- a grid-mapping variable ``spatial_ref`` with the CRS as CF attributes and as WKT
  (``crs_wkt``, ``spatial_ref``: GDAL's and rioxarray's), which every data variable names
  (``grid_mapping``);
- the data variable, stored as the tiles store it (their data type), with ``_FillValue``,
  ``scale_factor``, ``add_offset`` and ``units``: decoded, it equals the tiles' COGs
  decoded, pixel for pixel; chunked by tile and date (one chunk per tile per date).
"""

from __future__ import annotations

import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Protocol

import h5netcdf
import numpy as np
import zarr
from affine import Affine
from pyproj import CRS

EPOCH = date(1970, 1, 1)
CONVENTIONS = "CF-1.8"


@dataclass(frozen=True)
class Layout:
    """Where a cube's pixels are: the grid's CRS (WKT), the transform of its top-left
    pixel, its shape, its tiles' shape (its chunks), and its dates."""

    crs: str
    transform: Affine
    shape: tuple[int, int]  # rows, columns
    chunk: tuple[int, int]
    dates: tuple[date, ...]

    def offset(self, transform: Affine) -> tuple[int, int]:
        """The row and column in the cube of a tile's top-left pixel (its ``transform``)."""
        col, row = ~self.transform * (transform.c, transform.f)
        return round(row), round(col)


def layout_of(crs: str, tiles: Sequence[tuple[Affine, tuple[int, int]]], dates: Sequence[date]) -> Layout:
    """The layout covering tiles of one grid (each its transform and shape)."""
    first = tiles[0][0]
    xres, yres = first.a, first.e
    west = min(t.c for t, _ in tiles)
    north = max(t.f for t, _ in tiles)
    east = max(t.c + shape[1] * xres for t, shape in tiles)
    south = min(t.f + shape[0] * yres for t, shape in tiles)
    rows, cols = round((south - north) / yres), round((east - west) / xres)
    return Layout(crs, Affine(xres, 0.0, west, 0.0, yres, north), (rows, cols), tiles[0][1], tuple(sorted(set(dates))))


@dataclass(frozen=True)
class Variable:
    """A data variable: its name, stored data type, fill, scale, offset, unit and long name."""

    name: str
    dtype: str
    fill: float
    scale: float = 1.0
    offset: float = 0.0
    unit: str = ""
    title: str = ""

    def attributes(self) -> dict[str, Any]:
        found: dict[str, Any] = {"grid_mapping": "spatial_ref", "long_name": self.title or self.name}
        if self.scale != 1.0 or self.offset != 0.0:
            found |= {"scale_factor": np.float64(self.scale), "add_offset": np.float64(self.offset)}
        if self.unit:
            found["units"] = self.unit
        return found


def coordinates(layout: Layout) -> dict[str, tuple[np.ndarray, dict[str, Any]]]:
    """``time``, ``y`` and ``x`` with their CF attributes, and the grid mapping's."""
    crs = CRS.from_user_input(layout.crs)
    t = layout.transform
    x = t.c + (np.arange(layout.shape[1]) + 0.5) * t.a
    y = t.f + (np.arange(layout.shape[0]) + 0.5) * t.e
    if crs.is_geographic:
        xa = {"standard_name": "longitude", "long_name": "longitude", "units": "degrees_east", "axis": "X"}
        ya = {"standard_name": "latitude", "long_name": "latitude", "units": "degrees_north", "axis": "Y"}
    else:
        unit = crs.axis_info[0].unit_name if crs.axis_info else "metre"
        xa = {"standard_name": "projection_x_coordinate", "long_name": "x", "units": "m" if unit == "metre" else unit,
              "axis": "X"}
        ya = {"standard_name": "projection_y_coordinate", "long_name": "y", "units": xa["units"], "axis": "Y"}
    days = np.asarray([(d - EPOCH).days for d in layout.dates], np.int32)
    time = {"standard_name": "time", "long_name": "time", "units": f"days since {EPOCH.isoformat()}",
            "calendar": "standard", "axis": "T"}
    return {"time": (days, time), "y": (y, ya), "x": (x, xa)}


def grid_mapping(layout: Layout) -> dict[str, Any]:
    crs = CRS.from_user_input(layout.crs)
    t = layout.transform
    found = {k: v for k, v in crs.to_cf().items() if v is not None}
    return found | {"spatial_ref": crs.to_wkt(), "GeoTransform": f"{t.c} {t.a} {t.b} {t.f} {t.d} {t.e}"}


class Sink(Protocol):
    """Where a cube's tiles are written, one tile and date at a time."""

    def write(self, name: str, time: int, row: int, col: int, values: np.ndarray) -> None: ...

    def close(self) -> None: ...


class NetCDF:
    """A CF netCDF-4 cube (``h5netcdf``)."""

    def __init__(self, path: Path, layout: Layout, variables: Sequence[Variable], attributes: dict[str, Any]) -> None:
        self.file = h5netcdf.File(path, "w")
        rows, cols = layout.shape
        self.file.dimensions = {"time": len(layout.dates), "y": rows, "x": cols}
        for name, (values, attrs) in coordinates(layout).items():
            variable = self.file.create_variable(name, (name,), data=values)
            variable.attrs.update(attrs)
        mapping = self.file.create_variable("spatial_ref", (), dtype="int32")
        mapping.attrs.update(grid_mapping(layout))
        self.variables = {}
        for one in variables:
            made = self.file.create_variable(one.name, ("time", "y", "x"), dtype=one.dtype,
                                             chunks=(1, min(layout.chunk[0], rows), min(layout.chunk[1], cols)),
                                             fillvalue=np.asarray(one.fill, one.dtype), compression="gzip",
                                             compression_opts=4, shuffle=True)
            made.attrs.update(one.attributes())
            self.variables[one.name] = made
        self.file.attrs.update({"Conventions": CONVENTIONS, **attributes})

    def write(self, name: str, time: int, row: int, col: int, values: np.ndarray) -> None:
        height, width = values.shape
        self.variables[name][time, row:row + height, col:col + width] = values

    def close(self) -> None:
        self.file.close()


class Zarr:
    """A CF Zarr store (format 2: ``_ARRAY_DIMENSIONS``, ``fill_value`` as ``_FillValue``),
    in a zip file."""

    def __init__(self, path: Path, layout: Layout, variables: Sequence[Variable], attributes: dict[str, Any]) -> None:
        self.store = zarr.storage.ZipStore(path, mode="w", compression=zipfile.ZIP_STORED)
        self.group = zarr.open_group(self.store, mode="w", zarr_format=2)
        rows, cols = layout.shape
        for name, (values, attrs) in coordinates(layout).items():
            array = self.group.create_array(name, shape=values.shape, dtype=values.dtype, chunks=values.shape,
                                            fill_value=None)
            array[:] = values
            array.attrs.update({**attrs, "_ARRAY_DIMENSIONS": [name]})
        mapping = self.group.create_array("spatial_ref", shape=(), dtype="int32", fill_value=None)
        mapping.attrs.update({**_plain(grid_mapping(layout)), "_ARRAY_DIMENSIONS": []})
        self.arrays = {}
        for one in variables:
            array = self.group.create_array(one.name, shape=(len(layout.dates), rows, cols), dtype=one.dtype,
                                            chunks=(1, min(layout.chunk[0], rows), min(layout.chunk[1], cols)),
                                            fill_value=np.asarray(one.fill, one.dtype).item())
            array.attrs.update({**_plain(one.attributes()), "_ARRAY_DIMENSIONS": ["time", "y", "x"]})
            self.arrays[one.name] = array
        self.group.attrs.update({"Conventions": CONVENTIONS, **attributes})

    def write(self, name: str, time: int, row: int, col: int, values: np.ndarray) -> None:
        height, width = values.shape
        self.arrays[name][time, row:row + height, col:col + width] = values

    def close(self) -> None:
        self.store.close()


def _plain(attributes: dict[str, Any]) -> dict[str, Any]:
    """Attributes as JSON holds them (numpy scalars as Python numbers)."""
    return {k: v.item() if isinstance(v, np.generic) else v for k, v in attributes.items()}


def open_sink(form: str, path: Path, layout: Layout, variables: Sequence[Variable],
              attributes: dict[str, Any]) -> Sink:
    """A netCDF (``netcdf``) or Zarr (``zarr``) cube's writer."""
    if form == "netcdf":
        return NetCDF(path, layout, variables, attributes)
    if form == "zarr":
        return Zarr(path, layout, variables, attributes)
    raise ValueError(f"no cube format {form!r}")


SUFFIX = {"netcdf": ".nc", "zarr": ".zarr.zip"}

