"""The openEO test suite (``openeo-test-suite``, PyPI) run against bagpipe: a pytest plugin
loaded into the suite's own run (``-p tests.openeo_suite``, in the virtualenv ``make setup``
makes for it, ``.tools/openeo``), and the folder it reads its specifications from.

- **Offline**: the suite's STAC checks (``stac-validator``) fetch extension schemas from the
  web, which the machines that run the tests do not reach: they are served from local copies
  (``tests/stac_offline.py``), as for the STAC API's validators.
- **Basic authentication for the API compliance module**: its bearer token comes from an OIDC
  sign-in only; bagpipe's local stack signs in with basic authentication (a personal API
  token), so the token is the client's ``basic//TOKEN`` of ``OPENEO_AUTH_BASIC_PASSWORD``.
- **A process runner of bagpipe's own** (``--runner bagpipe``): the suite picks its runners
  by name in its own conftest, so this plugin puts bagpipe's where the name ``dask`` looks for
  its runner. It runs each individual process test in this process through bagpipe's
  implementations: the per-pixel processes as the compiler writes them into an expression
  (``pipeline.web.openeo.pixels``) evaluated by ``pipeline.science.expressions``, the
  reducers over time by ``pipeline.science.builtins``, ``quantiles`` by the zones'
  percentiles' rule (``builtins.weighted_quantile``, every pixel weighted 1). A test bagpipe's model cannot state —
  strings, booleans or labeled arrays as data, data cubes given as JSON, infinities (a raster
  holds none: a non-finite value is no value), a reducer that keeps no-data — is skipped,
  saying why.
- **Its folder** (:func:`lay_out`): as the suite's git submodules lay it out, the served
  specifications beside their tests (``tests/fixtures/openeo``), the API's OpenAPI document,
  and bagpipe's own payload examples for the compliance module.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import types
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.science import builtins, expressions  # noqa: E402
from pipeline.web.openeo import pixels  # noqa: E402
from tests import stac_offline  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "openeo"
SPECS = ROOT / "pipeline" / "web" / "openeo" / "specs"
REDUCERS = {"min": "min", "max": "max", "mean": "mean", "median": "median", "sum": "sum", "count": "count",
            "sd": "std", "first": "first", "last": "last"}


def lay_out(folder: Path) -> Path:
    """The folder the suite runs in: ``assets/processes`` (the specifications bagpipe serves and
    their tests), ``assets/openeo-api/openapi.yaml`` and the payload examples."""
    processes = folder / "assets" / "processes"
    shutil.copytree(FIXTURES / "processes" / "tests", processes / "tests", dirs_exist_ok=True)
    # the suite (0.2.2) opens a test's external references beside the specification, not the test
    shutil.copytree(FIXTURES / "processes" / "tests" / "assets", processes / "assets", dirs_exist_ok=True)
    for spec in SPECS.glob("*.json"):
        shutil.copy(spec, processes / spec.name)
    api = folder / "assets" / "openeo-api"
    api.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / "openeo-api" / "openapi.yaml", api / "openapi.yaml")
    shutil.copytree(FIXTURES / "payload_examples",
                    folder / "src" / "openeo_test_suite" / "tests" / "general" / "payload_examples", dirs_exist_ok=True)
    return folder


class NotHere(Exception):
    """A test bagpipe's implementations cannot state (the runner skips it)."""


class BagpipeRunner:
    """The suite's ``ProcessTestRunner`` interface over bagpipe's implementations."""

    def __init__(self, backend: str) -> None:
        self.backend = backend.rstrip("/")

    def list_processes(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = requests.get(f"{self.backend}/processes", timeout=60).json()["processes"]
        return found

    def execute(self, id: str, arguments: dict[str, Any]) -> Any:
        try:
            if id in REDUCERS:
                return self._reduce(id, arguments)
            if id == "quantiles":
                return self._quantiles(arguments)
            if id in pixels.PROCESSES:
                return self._pixel(id, arguments)
        except NotHere as why:
            pytest.skip(str(why))
        pytest.skip(f"{id} runs on a job's tiles, not on values given as JSON (tests/test_openeo_client.py runs it)")

    def _pixel(self, process: str, arguments: dict[str, Any]) -> Any:
        for name, value in arguments.items():
            if isinstance(value, str) or (isinstance(value, list) and name != "data"):
                raise NotHere(f"{process}: {name} is {type(value).__name__}; bagpipe computes numbers per pixel")
            if isinstance(value, float) and math.isinf(value):
                raise NotHere(f"{process}: {name} is infinite; a raster holds no infinity (no value instead)")
            if isinstance(value, float) and math.isnan(value):
                raise NotHere(f"{process}: {name} is NaN, which a raster holds as no value (openEO's NaN is a "
                              "number that compares unequal)")
            if isinstance(value, list) and any(isinstance(v, (str, bool, list, dict)) for v in value):
                raise NotHere(f"{process}: data holds other than numbers")
        child = {"process_graph": {"p": {"process_id": process, "arguments": arguments, "result": True}}}
        try:
            found = pixels.Compiler(child, {}, process).result()
        except pixels.Unsupported as exc:
            raise NotHere(exc.message) from None  # (pixels.Invalid is the suite's to see: POST /jobs refuses it)
        if found is None:
            return None
        if isinstance(found, pixels.Bands):
            raise NotHere(f"{process} returns an array")
        value = float(np.ravel(expressions.parse(found.text).evaluate({}, np.float64))[0])
        if math.isnan(value):
            return None
        return bool(value) if found.condition else value

    def _quantiles(self, arguments: dict[str, Any]) -> Any:
        """A zone's quantiles as its table's percentile columns compute them: the weighted
        quantile of its pixels, each weighted 1 (aggregate_spatial counts a pixel whole)."""
        data = arguments.get("data")
        if not isinstance(data, list) or any(isinstance(v, (str, bool, list, dict)) for v in data):
            raise NotHere("quantiles: bagpipe's zones take numbers")
        if any(isinstance(v, float) and (math.isinf(v) or math.isnan(v)) for v in data):
            raise NotHere("quantiles: a raster holds no infinity, and NaN as no data")
        if arguments.get("ignore_nodata") is False:
            raise NotHere("quantiles: a zone's statistics ignore no-data (the compiler refuses ignore_nodata false)")
        probabilities, q = arguments.get("probabilities"), arguments.get("q")
        if isinstance(probabilities, int):
            probabilities, q = None, probabilities
        if q is not None:
            probabilities = [k / q for k in range(1, q)]
        values = np.array([v for v in data if v is not None], dtype=np.float64)
        return [builtins.weighted_quantile(values, np.ones(len(values)), p) if len(values) else None
                for p in probabilities or []]

    def _reduce(self, process: str, arguments: dict[str, Any]) -> Any:
        data = arguments.get("data")
        if not isinstance(data, list) or any(isinstance(v, (str, bool, list, dict)) for v in data):
            raise NotHere(f"{process}: bagpipe reduces numbers over time")
        if any(isinstance(v, float) and math.isinf(v) for v in data):
            raise NotHere(f"{process}: a raster holds no infinity")
        if arguments.get("ignore_nodata") is False:
            raise NotHere(f"{process}: bagpipe's reductions over time ignore no-data (the compiler refuses "
                          "ignore_nodata false)")
        condition = arguments.get("condition")
        if process == "count" and condition not in (None, True):
            raise NotHere("count: a condition other than true")
        if process == "count" and condition is True:
            return len(data)  # every element, no-data or not (as the specification counts with true)
        if not data:
            return 0 if process == "count" else None
        stack = np.array([[[np.nan if v is None else float(v)]] for v in data], dtype=np.float64)
        days = [date(2000, 1, 1) + timedelta(days=i) for i in range(len(data))]
        value = float(builtins.reduce(builtins.Reducer(REDUCERS[process]), stack, days)[0, 0])
        return None if math.isnan(value) else value

    def encode_process_graph(self, process: dict[str, Any], parent_process_id: str | None = None,
                             parent_parameter: str | None = None) -> Any:
        raise NotImplementedError("a child process graph as an argument runs inside a cube process here")

    def encode_labeled_array(self, data: dict[str, Any]) -> Any:
        raise NotImplementedError("labeled arrays: bagpipe's bands are a cube's, not arrays given as JSON")

    def encode_datacube(self, data: dict[str, Any]) -> Any:
        raise NotImplementedError("data cubes given as JSON: bagpipe's cubes are a job's tiles")

    def encode_data(self, data: Any) -> Any:
        return data

    def decode_data(self, data: Any, expected: Any) -> Any:
        if isinstance(expected, float) and math.isinf(expected):
            pytest.skip("the expected value is infinite; a raster holds no infinity (no value instead)")
        if isinstance(expected, float) and math.isnan(expected):
            pytest.skip("the expected value is NaN; bagpipe's no value is null")
        return data

    def is_json_only(self) -> bool:
        return False

    def get_nodata_value(self) -> Any:
        return None


def pytest_configure(config: pytest.Config) -> None:
    stac_offline.serve_offline()
    from openapi_core import V30ResponseValidator
    from openeo_test_suite.lib import compliance_util

    def basic_token(_: Any) -> str:
        return f"basic//{os.environ['OPENEO_AUTH_BASIC_PASSWORD']}"

    compliance_util.get_access_token = basic_token
    # the API's document is OpenAPI 3.0 (its optional values are nullable: true), which the suite
    # reads with openapi-core's 3.1 validator, to which every null of a nullable field is invalid
    compliance_util.V31ResponseValidator = V30ResponseValidator
    # its payload examples are read by paths it joins twice unless its folder's path is absolute
    compliance_util._guess_root = lambda: Path.cwd() / "assets" / "openeo-api"
    if config.getoption("--runner", default="skip") == "bagpipe":
        backend = config.getoption("--openeo-backend-url")
        module = types.ModuleType("openeo_test_suite.lib.process_runner.dask")
        module.Dask = lambda: BagpipeRunner(backend)  # type: ignore[attr-defined]
        sys.modules[module.__name__] = module
        config.option.runner = "dask"


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"bagpipe: {json.dumps({'runner': config.getoption('--runner', default='skip')})}"]
