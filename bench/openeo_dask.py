"""openeo-processes-dask's side of ``bench.openeo``'s ``processes`` part: the same processes
on the same decoded arrays, by that package's implementations, timed in its own interpreter.

It runs in the virtualenv ``.tools/openeo-processes`` (``make .tools/openeo-processes/.installed``,
``requirements-processes.txt``), not in the project's: the package's processes cannot be
imported without its ``implementations`` extra (every release's ``data_model`` imports
``dask_geopandas``, and the package's ``__init__`` imports every process), which bagpipe's
runtime does not carry. So this module imports nothing of the project's, only numpy, xarray,
openeo-processes-dask and the parser whose ``ParameterReference`` its processes resolve.

``bench.openeo`` writes the arrays (``.npy``, decoded: float32, NaN where there is no value)
and a ``work.json`` into a folder and runs ``run(folder)`` here; each process is run once on a
corner of its arrays (untimed: the first call's imports), then ``repeat`` times whole, its
result a numpy-backed xarray computed at once (no dask, nothing lazy); its median CPU seconds
go to ``theirs.json`` and its last result to ``<name>.out.npy``.

The processes are called as openeo-pg-parser-networkx's graph calls them: a cube process
(``ndvi``, ``reduce_dimension``, ``apply``, ``mask``) with its child process as a callable
that resolves its parameters (``core.process`` over a ``ParameterReference``), the band math
of a reducer over ``bands`` as the nodes of its child graph (``array_element`` then the
arithmetic), each the package's own implementation.
"""

from __future__ import annotations

import importlib.metadata
import json
import statistics
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from openeo_pg_parser_networkx.pg_schema import ParameterReference
from openeo_processes_dask.process_implementations import _max as maximum
from openeo_processes_dask.process_implementations import _min as minimum
from openeo_processes_dask.process_implementations import (
    add,
    apply,
    array_element,
    count,
    divide,
    gt,
    linear_scale_range,
    mask,
    mean,
    median,
    multiply,
    ndvi,
    normalized_difference,
    reduce_dimension,
    sd,
    subtract,
)
from openeo_processes_dask.process_implementations.core import process

Arrays = dict[str, np.ndarray]
WARM = 64  # the corner (pixels a side) of the untimed first run


def _bands(arrays: Arrays, names: tuple[str, ...]) -> xr.DataArray:
    """One date's cube of the given bands (as ``load_collection`` names them: common names)."""
    first = arrays[names[0]]
    return xr.DataArray(np.stack([arrays[n] for n in names]), dims=("bands", "y", "x"),
                        coords={"bands": list(names), "y": np.arange(first.shape[0]),
                                "x": np.arange(first.shape[1])})


def _plane(values: np.ndarray) -> xr.DataArray:
    return xr.DataArray(values, dims=("y", "x"), coords={"y": np.arange(values.shape[0]),
                                                          "x": np.arange(values.shape[1])})


def _band_math(formula: Callable[[Callable[[str], Any]], Any]) -> Callable[..., Any]:
    """A reducer over ``bands``: the child graph's nodes, its bands picked by ``array_element``."""
    def reducer(data: np.ndarray, axis: int | None = None, dim_labels: Any = None, **_: Any) -> Any:
        return formula(lambda label: array_element(data, label=label, axis=axis, dim_labels=dim_labels))
    return reducer


def _evi(band: Callable[[str], Any]) -> Any:
    """2.5 × (nir − red) / (nir + 6 red − 7.5 blue + 1), node by node."""
    nir, red, blue = band("nir"), band("red"), band("blue")
    below = add(subtract(add(nir, multiply(6, red)), multiply(7.5, blue)), 1)
    return multiply(2.5, divide(subtract(nir, red), below))


def _child(implementation: Callable[..., Any], parameter: str, **arguments: Any) -> Callable[..., Any]:
    """A child process as the parser passes it: the implementation, its parameter a reference."""
    return partial(process(implementation), **{parameter: ParameterReference(from_parameter=parameter)}, **arguments)


def _masked(arrays: Arrays) -> xr.DataArray:
    """mask(NDVI, apply(pixel_reliability, gt(x, 1)))."""
    cloudy = apply(_plane(arrays["reliability"]), process=_child(gt, "x", y=1))
    return mask(_plane(arrays["ndvi"]), cloudy)


def _over_time(implementation: Callable[..., Any], nodata: bool = True) -> Callable[[Arrays], xr.DataArray]:
    def reduced(arrays: Arrays) -> xr.DataArray:
        values = arrays["stack"]
        cube = xr.DataArray(values, dims=("t", "y", "x"), coords={
            "t": np.datetime64("2022-01-01") + np.arange(values.shape[0]) * np.timedelta64(16, "D"),
            "y": np.arange(values.shape[1]), "x": np.arange(values.shape[2])})
        extra = {"ignore_nodata": True} if nodata else {}
        return reduce_dimension(cube, reducer=_child(implementation, "data", **extra), dimension="t")
    return reduced


PROCESSES: dict[str, Callable[[Arrays], xr.DataArray]] = {
    "ndvi": lambda a: ndvi(_bands(a, ("red", "nir"))),
    "normalized_difference": lambda a: reduce_dimension(
        _bands(a, ("red", "nir")), reducer=_band_math(lambda band: normalized_difference(band("nir"), band("red"))),
        dimension="bands"),
    "band_math_evi": lambda a: reduce_dimension(_bands(a, ("red", "nir", "blue")), reducer=_band_math(_evi),
                                                dimension="bands"),
    "linear_scale_range": lambda a: apply(_plane(a["ndvi"]), process=_child(
        linear_scale_range, "x", inputMin=-0.2, inputMax=1, outputMin=0, outputMax=255)),
    "mask": _masked,
    "max": _over_time(maximum),
    "min": _over_time(minimum),
    "mean": _over_time(mean),
    "median": _over_time(median),
    "sd": _over_time(sd),
    "count": _over_time(count, nodata=False),
}


def _corner(arrays: Arrays) -> Arrays:
    return {name: values[..., :WARM, :WARM] for name, values in arrays.items()}


def run(folder: str) -> None:
    """Each process of ``work.json`` on its arrays: ``theirs.json`` (median CPU seconds, the
    package's version) and each last result."""
    where = Path(folder)
    work = json.loads((where / "work.json").read_text())
    found: dict[str, Any] = {"version": importlib.metadata.version("openeo-processes-dask"), "seconds": {}}
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy's all-NaN slices: their answer is NaN, as meant
    for name, job in work["processes"].items():
        arrays = {key: np.load(where / f"{file}.npy") for key, file in job["inputs"].items()}
        compute = PROCESSES[job["process"]]
        np.asarray(compute(_corner(arrays)).values)
        seconds, result = [], np.empty(0)
        for _ in range(work["repeat"]):
            began = time.process_time()
            result = np.asarray(compute(arrays).values)
            seconds.append(time.process_time() - began)
        found["seconds"][name] = statistics.median(seconds)
        np.save(where / f"{name}.out.npy", result)
        del arrays, result
    (where / "theirs.json").write_text(json.dumps(found))
