"""bagpipe's runtime of openEO Python UDFs: the program of a ``run_udf`` bundle (copied into
it as ``bagpipe_udf.py``, ``pipeline.reduction.udf``), run in the sandbox as any reducer's
program is, with the worker's interpreter. It imports nothing of bagpipe (the sandbox reads
only the interpreter's libraries and the bundle), only numpy, rasterio, xarray and openeo.

It reads ``task.json`` (every input's dates and GeoTIFFs, by ``PRODUCT.LAYER``, and each
input's encoding), loads the group's tiles as one ``xarray.DataArray`` with dimensions
``(t, bands, y, x)`` — ``t`` the dates, ``bands`` the layers' names, ``y`` and ``x`` the
pixels' centres in the grid's CRS; each value decoded as bagpipe's built-ins read it (stored
× scale + offset, NaN for the fill, outside the valid range or a date with no tile) —,
wraps it as openEO's ``XarrayDataCube`` with the UDF's ``context`` in a ``UdfData``, and
calls the UDF through ``openeo.udf.run_code.run_udf_code`` (openEO's own dispatch:
``apply_datacube``, ``apply_hypercube``, ``apply_timeseries``, a function of ``UdfData``).

What it returns is written as the reduction's outputs, a float32 GeoTIFF per band (NaN its
no data) on the tile's grid: reducing over t (``reduce_dimension``, ``aggregate_temporal_period``)
the result has no ``t`` (or one label), ``BAND.tif``; applied over t (``apply_dimension``)
it keeps ``t``, ``BAND.DATE.tif`` (or ``BAND.N.tif`` if its labels are not dates). A result
of other dimensions, or another grid, is an error of the UDF: it exits 1 saying why, as an
exception in the UDF does (its traceback on stderr, which its attempt's log keeps).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import rasterio
import xarray
from openeo.udf.run_code import run_udf_code
from openeo.udf.udf_data import UdfData
from openeo.udf.xarraydatacube import XarrayDataCube

HERE = Path(__file__).resolve().parent
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class UdfResultError(Exception):
    """What the UDF returned cannot be written as the reduction's outputs."""


def decoded(path: str, encoding: dict[str, Any] | None) -> np.ndarray:
    """A tile's values as bagpipe's built-ins read them (``pipeline.science.encoding.decode``):
    stored × scale + offset, NaN where the stored value is the fill, outside the valid range
    or not finite; float32 for types of up to 16 bits, float64 for wider."""
    with rasterio.open(path) as src:
        stored = src.read(1)
        nodata = src.nodata
    found = encoding or {"nodata": nodata, "scale": 1.0, "offset": 0.0}
    kind = np.float32 if stored.dtype.itemsize <= 2 else np.float64
    good = np.ones(stored.shape, bool)
    fill = found.get("nodata")
    if fill is not None and not (isinstance(fill, float) and np.isnan(fill)):
        good &= stored != fill
    if stored.dtype.kind == "f":
        good &= np.isfinite(stored)
    valid = found.get("valid")
    if valid:
        with np.errstate(invalid="ignore"):
            good &= (stored >= valid[0]) & (stored <= valid[1])
    values = stored.astype(kind)
    if found.get("scale", 1.0) != 1.0:
        values *= kind(found["scale"])
    if found.get("offset", 0.0) != 0.0:
        values += kind(found["offset"])
    values[~good] = np.nan
    return np.asarray(values)


def cube_of(task: dict[str, Any]) -> tuple[xarray.DataArray, dict[str, Any]]:
    """The group's tiles as a DataArray (t, bands, y, x), and the grid's profile."""
    by_input: dict[str, dict[str, list[str]]] = task["by_input"]
    aliases: dict[str, str] = task.get("aliases") or {}
    encodings: dict[str, Any] = task.get("encodings") or {}
    days: list[str] = sorted({day for found in by_input.values() for day in found["dates"]})
    first = next(f for found in by_input.values() for f in found["files"])
    with rasterio.open(first) as src:
        height, width, transform, crs = src.height, src.width, src.transform, src.crs
    kind = np.float32
    planes: list[list[np.ndarray | None]] = []
    for ref, found in by_input.items():
        dated = dict(zip(found["dates"], found["files"], strict=True))
        encoding = encodings.get(aliases.get(ref, ref))
        row: list[np.ndarray | None] = [decoded(dated[d], encoding) if d in dated else None for d in days]
        kind = np.result_type(kind, *(p.dtype for p in row if p is not None)).type
        planes.append(row)
    values = np.full((len(days), len(by_input), height, width), np.nan, kind)
    for b, row in enumerate(planes):
        for t, plane in enumerate(row):
            if plane is not None:
                values[t, b] = plane
    xs = transform.c + transform.a * (np.arange(width) + 0.5)
    ys = transform.f + transform.e * (np.arange(height) + 0.5)
    bands = [ref.split(".", 1)[-1] for ref in by_input]
    array = xarray.DataArray(values, dims=("t", "bands", "y", "x"), name="data",
                             coords={"t": np.array(days, dtype="datetime64[ns]"), "bands": bands, "y": ys, "x": xs},
                             attrs={"crs": str(crs)})
    return array, {"height": height, "width": width, "transform": transform, "crs": crs}


def outputs_of(result: xarray.DataArray, mode: str, shape: tuple[int, int],
               default_band: str) -> list[tuple[str, np.ndarray]]:
    """The UDF's result as (file name, 2-D plane) pairs; UdfResultError if it is not a
    result over t on the tile's grid."""
    dims = {str(d) for d in result.dims}
    if not {"y", "x"} <= dims or (result.sizes["y"], result.sizes["x"]) != shape:
        raise UdfResultError(f"the UDF returned dimensions {dict(result.sizes)}: a result keeps the tile's y and x "
                             f"({shape[0]} × {shape[1]})")
    extra = dims - {"t", "bands", "y", "x"}
    if extra:
        raise UdfResultError(f"the UDF returned dimensions {sorted(extra)} besides t, bands, y and x")
    if mode == "reduce" and "t" in dims:
        if result.sizes["t"] != 1:
            raise UdfResultError(f"a reducer over t returns no t dimension (or one label); the UDF returned "
                                 f"{result.sizes['t']}")
        result = result.isel(t=0, drop=True)
    if "bands" not in result.dims:
        result = result.expand_dims(bands=[default_band])
    if "t" not in result.dims:
        if mode == "apply":
            raise UdfResultError("a process applied over t keeps the t dimension; the UDF returned none")
        result = result.expand_dims(t=[None])
    result = result.transpose("t", "bands", "y", "x")
    found = []
    for t, label in enumerate(result.coords["t"].values if "t" in result.coords else range(result.sizes["t"])):
        when = "" if mode == "reduce" else (
            str(label.astype("datetime64[D]")) if isinstance(label, np.datetime64) else str(label))
        for b, band in enumerate(result.coords["bands"].values if "bands" in result.coords else
                                 range(result.sizes["bands"])):
            name = _SAFE.sub("_", str(band)) + (f".{_SAFE.sub('_', when)}" if when else "")
            found.append((f"{name}.tif", np.asarray(result.values[t, b], np.float32)))
    if len({name for name, _ in found}) != len(found):
        raise UdfResultError("the UDF returned two bands (or dates) of one name")
    return found


def main(task_path: str) -> None:
    task = json.loads(Path(task_path).read_text())
    spec = json.loads((HERE / "udf.json").read_text())
    code = (HERE / "udf.py").read_text()
    array, grid = cube_of(task)
    data = UdfData(datacube_list=[XarrayDataCube(array)], user_context=spec.get("context") or {})
    result = run_udf_code(code, data).get_datacube_list()
    if not result:
        raise UdfResultError("the UDF returned no data cube")
    refs = list(task["by_input"])
    default = refs[0].split(".", 1)[-1] if len(refs) == 1 else "result"
    outputs = Path(task["outputs_dir"])
    profile = {"driver": "GTiff", "count": 1, "dtype": "float32", "nodata": float("nan"), "compress": "deflate",
               **grid}
    for name, plane in outputs_of(result[0].get_array(), spec["mode"], (grid["height"], grid["width"]), default):
        with rasterio.open(outputs / name, "w", **profile) as dst:
            dst.write(plane, 1)


if __name__ == "__main__":
    main(sys.argv[1])
