"""openEO's Python UDFs (``run_udf``) as reducer bundles, run in the sandbox exactly as an
uploaded reducer's program is.

A UDF's code travels with its job's process graph. When the graph is compiled, the code is
checked without running it (:func:`problem`: Python's syntax, and an entry point openEO's
UDF conventions dispatch to — ``apply_datacube`` or ``apply_hypercube`` of ``cube`` and
``context``, ``apply_timeseries`` of ``series`` and ``context``, or a function of one
``UdfData``), then made into a bundle (:func:`bundle`): ``reducer.json``, the code
(``udf.py``), how it is applied and its ``context`` (``udf.json``) and bagpipe's UDF runtime
(``bagpipe_udf.py``, the file ``udf_runtime.py`` beside this one: it loads a group's tiles
as openEO's ``XarrayDataCube`` and calls the UDF through the ``openeo`` package's own
dispatch). The bundle is content-addressed as an upload is (``bundles``): the same code,
context and runtime are the same digest, stored once and unpacked once per worker.
"""

from __future__ import annotations

import ast
import json
import platform
from importlib import metadata
from pathlib import Path
from typing import Any

from pipeline.reduction import bundles

RUNTIME = "Python"  # the one runtime, as GET /udf_runtimes names it
NAME = "run_udf"  # the bundle's reducer: what a failure's message names
RUNTIME_FILE = Path(__file__).with_name("udf_runtime.py")
# what a UDF may import besides the standard library: the sandbox's interpreter has them
LIBRARIES = ("numpy", "xarray", "pandas", "scipy", "shapely", "pyproj", "rasterio", "openeo")
MODES = ("reduce", "apply")  # over t: the dimension reduced away (reduce_dimension), or kept (apply_dimension)
# the entry points openeo.udf.run_code.run_udf_code dispatches to: their parameters, and the
# annotations (last part of their name) its dispatch looks for on the data parameter and the return
ENTRY_POINTS = {"apply_datacube": ("cube", ("XarrayDataCube", "DataCube", "DataArray")),
                "apply_hypercube": ("cube", ("XarrayDataCube", "DataCube")),
                "apply_timeseries": ("series", ("Series",))}
# an annotation given as a string matches only by the class's full name (``run_code._get_annotation_str``)
FULL_NAMES = {"XarrayDataCube": "openeo.udf.xarraydatacube.XarrayDataCube",
              "DataCube": "openeo_udf.api.datacube.DataCube", "DataArray": "xarray.core.dataarray.DataArray",
              "Series": "pandas.core.series.Series", "UdfData": "openeo.udf.udf_data.UdfData"}
MANIFEST = {
    "name": NAME,
    "description": "An openEO Python UDF over a target tile's group of dates (bagpipe's UDF runtime)",
    "argv": ["{python}", "{here}/bagpipe_udf.py", "{task}"],
    "outputs": ["*.tif"],
    "timeout_s": 600,
    "limits": {"cpu_s": 600, "memory_mb": 4096, "file_mb": 512, "open_files": 256, "processes": 16},
    "env": {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
}


def python_version() -> str:
    """The runtime's version as openEO names one: the interpreter's major.minor."""
    major, minor, _ = platform.python_version_tuple()
    return f"{major}.{minor}"


def runtimes() -> dict[str, Any]:
    """``GET /udf_runtimes``: the Python runtime, its version and the libraries a UDF may import."""
    libraries = {}
    for name in LIBRARIES:
        try:
            libraries[name] = {"version": metadata.version(name)}
        except metadata.PackageNotFoundError:
            continue
    version = python_version()
    return {RUNTIME: {
        "title": f"Python {version}", "type": "language", "default": version,
        "description": "A Python UDF runs per target tile and group of dates in bagpipe's sandbox (no network, "
                       "no secrets): apply_datacube(cube: XarrayDataCube, context: dict) -> XarrayDataCube gets the "
                       "group's tiles as an xarray DataArray with dimensions (t, bands, y, x), no data as NaN; "
                       "apply_timeseries(series: pandas.Series, context: dict) -> pandas.Series each pixel's.",
        "versions": {version: {"libraries": libraries}},
    }}


def problem(code: str) -> str:
    """Why ``code`` is no Python UDF bagpipe can run, found without running it ("" if none):
    a syntax error (its line), or no entry point that openEO's dispatch calls."""
    try:
        tree = ast.parse(code, "udf")
    except SyntaxError as exc:
        return f"a syntax error at line {exc.lineno}: {exc.msg}"
    except ValueError as exc:  # a NUL byte
        return f"not Python source: {exc}"
    if any(isinstance(node, ast.ImportFrom) and node.module == "__future__" and
           any(alias.name == "annotations" for alias in node.names) for node in tree.body):
        return ("from __future__ import annotations makes the entry point's annotations strings, by which "
                "openEO's dispatch does not find it: remove it")
    found = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        params = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
        wanted = ENTRY_POINTS.get(node.name)
        if wanted is None:
            if len(params) == 1 and _named(node.args.args[0].annotation if node.args.args else None, ("UdfData",)):
                return ""  # a generic UDF of the whole UdfData
            continue
        data, kinds = wanted
        if data not in params or "context" not in params:
            found.append(f"{node.name} takes ({', '.join(params)}), not ({data}, context)")
            continue
        annotation = next(a.annotation for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)
                          if a.arg == data)
        if not (_named(annotation, kinds) and _named(node.returns, kinds)):
            found.append(f"{node.name}'s {data} and its return must be annotated {' or '.join(kinds)} (openEO "
                         "finds the entry point by its annotations)")
            continue
        return ""
    why = f": {'; '.join(found)}" if found else ""
    return ("no entry point: define apply_datacube(cube: XarrayDataCube, context: dict) -> XarrayDataCube (or "
            f"apply_timeseries(series: pandas.Series, context: dict) -> pandas.Series){why}")


def _named(annotation: ast.expr | None, kinds: tuple[str, ...]) -> bool:
    """Whether an annotation names one of ``kinds`` as openEO's dispatch matches it: an
    expression by the class it names (``xarray.DataArray``, ``XarrayDataCube``), a string by
    the class's full name (``"pandas.core.series.Series"``)."""
    if annotation is None:
        return False
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return annotation.value in {FULL_NAMES[kind] for kind in kinds}
    return ast.unparse(annotation).rsplit(".", 1)[-1] in kinds


def bundle(code: str, context: Any, mode: str) -> bundles.Bundle:
    """The reducer bundle that runs ``code`` (checked by :func:`problem`) with ``context``,
    over t (``mode``: ``reduce`` or ``apply``)."""
    assert mode in MODES
    spec = json.dumps({"mode": mode, "dimension": "t", "context": context}, sort_keys=True).encode()
    return bundles.from_files([
        (bundles.MANIFEST, json.dumps(MANIFEST, indent=1).encode(), False),
        ("bagpipe_udf.py", RUNTIME_FILE.read_bytes(), False),
        ("udf.py", code.encode(), False),
        ("udf.json", spec, False),
    ])
