"""openEO's ``run_udf`` with the official Python client, end to end against the local stack
(the API under uvicorn, the control loop, a real worker, the local Planetary Computer): a
Python UDF as the reducer of ``reduce_dimension`` and ``aggregate_temporal_period`` over t,
and as the process of ``apply_dimension`` over t, runs in bagpipe's sandbox as an uploaded
reducer's program does, on the same tiles its built-ins read, and its results are the same
pixels numpy and the built-in ``max`` make of them. A UDF that goes looking for the worker's
secrets, sockets and files finds none and fails as its user's code, its traceback in the
job's logs, dead once it has failed the same way twice; a UDF bagpipe cannot run is refused when the job is created,
naming the process and field, with nothing stored.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from importlib import metadata
from io import BytesIO
from typing import Any

import httpx
import numpy as np
import openeo
import pytest
import rasterio

from bagpipe.azurite import ACCOUNT_KEY, Azurite
from bagpipe.stack import LocalStack
from pipeline.lifecycle import jobs, results, tasks
from pipeline.modis.products import CATALOG
from pipeline.science.encoding import decode
from pipeline.storage.clients import clients_for
from pipeline.web.openeo import store
from tests.conftest import wait_for
from tests.test_openeo_client import connected

BOX = {"west": -108.0, "south": 35.2, "east": -107.5, "north": 35.8}  # one 1° target tile inside h09v05
SPAN = ["2022-06-01", "2022-08-01"]  # five 16-day composites overlap it, from 25 May
BANDS = ["500m_16_days_NDVI", "500m_16_days_EVI"]
DAYS = ["2022-05-25", "2022-06-10", "2022-06-26", "2022-07-12", "2022-07-28"]
MAX = """
from openeo.udf import XarrayDataCube


def apply_datacube(cube: XarrayDataCube, context: dict) -> XarrayDataCube:
    return XarrayDataCube(cube.get_array().max(dim="t"))
"""
SCALED_MEAN = """
import xarray


def apply_datacube(cube: xarray.DataArray, context: dict) -> xarray.DataArray:
    return cube.mean(dim="t") * context["factor"]
"""
RUNNING_SUM = """
import pandas


def apply_timeseries(series: pandas.Series, context: dict) -> pandas.Series:
    return pandas.Series(series).cumsum(skipna=False) + context["offset"]
"""
# what it finds is its exception's message: the job's logs show it
HOSTILE = """
import json, os, pathlib, socket, sys
from openeo.udf import XarrayDataCube


def apply_datacube(cube: XarrayDataCube, context: dict) -> XarrayDataCube:
    seen = {"environ": sorted(os.environ), "leaks": [k for k, v in os.environ.items() if context["key"] in v]}
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except PermissionError:
        pids = []
    found = []
    for pid in pids:
        try:
            if context["key"].encode() in pathlib.Path(f"/proc/{pid}/environ").read_bytes():
                found.append(pid)
        except OSError:
            pass
    seen["proc"] = found
    try:
        socket.create_connection(("127.0.0.1", context["port"]), timeout=2).close()
        seen["storage"] = "connected"
    except OSError as exc:
        seen["storage"] = type(exc).__name__
    try:
        pathlib.Path("/etc/shadow").read_text()
        seen["shadow"] = "read"
    except OSError as exc:
        seen["shadow"] = type(exc).__name__
    task = json.loads(pathlib.Path(os.environ["BAGPIPE_TASK"]).read_text())
    seen["writes"] = {}
    for name, target in (("inputs", pathlib.Path(task["inputs_dir"], "x")), ("tmp", pathlib.Path("/tmp/udf-escape")),
                         ("task", pathlib.Path(os.environ["BAGPIPE_TASK"]).with_name("x")),
                         ("code", pathlib.Path(sys.argv[0]).with_name("x"))):
        try:
            target.write_text("escaped")
            seen["writes"][name] = "written"
        except OSError as exc:
            seen["writes"][name] = type(exc).__name__
    raise RuntimeError("REPORT" + json.dumps(seen, separators=(",", ":")))
"""


@pytest.fixture(scope="module")
def stack(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("udf")
    with LocalStack(tmp / "stack", workers=1, slots=2, connection=azurite.connection_string,
                    namespace=f"udf{tmp.name[-6:].replace('_', '')}") as running:
        yield running


def loaded(connection: openeo.Connection) -> Any:
    return connection.load_collection("MOD13A1", spatial_extent=BOX, temporal_extent=SPAN, bands=BANDS)


def finished(job: Any) -> dict[str, np.ndarray]:
    """The job run to its end (finished), and its result files' first bands by asset name."""
    job.start_job()
    wait_for(lambda: job.status() in ("finished", "error"), 900, "the job")
    assert job.status() == "finished", [(e["message"], e.get("data")) for e in job.logs(level="error")]
    found = {}
    for name, asset in job.get_results().get_metadata()["assets"].items():
        assert "sig=" in asset["href"]
        with rasterio.open(BytesIO(httpx.get(asset["href"]).content)) as src:
            found[name] = src.read(1)
            assert src.dtypes[0] == "float32" and np.isnan(src.nodata), (name, src.profile)
    return found


def tiles_of(stack: LocalStack, job: Any) -> dict[tuple[str, str], np.ndarray]:
    """The job's tile files — the reprojected tiles its reductions read — decoded as bagpipe's
    built-ins decode them, by (layer, date)."""
    clients = clients_for(stack.settings)
    record = store.get(clients, "admin", job.job_id)
    assert record is not None
    manifest = results.with_links(clients, record.latest, results.manifest(clients, record.latest) or {})
    found = {}
    for task in manifest["tasks"]:
        if task["stage"] != "modis":
            continue
        for blob, link in task["links"].items():
            layer = blob.rsplit("/", 1)[-1].split(".")[1]
            with rasterio.open(BytesIO(httpx.get(link).content)) as src:
                found[layer, task["date"]] = decode(src.read(1), CATALOG["MOD13A1"].layer(layer).encoding)
    # the composites of 25 May (to 9 June) to 28 July: each that overlaps the span
    assert sorted({day for _, day in found}) == DAYS, found.keys()
    return found


def reductions_of(stack: LocalStack, job: Any) -> list[str]:
    """How the reduction tasks of the job's latest run ended."""
    clients = clients_for(stack.settings)
    record = store.get(clients, "admin", job.job_id)
    assert record is not None
    row = jobs.get(clients, record.latest)
    return [t.status.value for t in tasks.list_tasks(clients.tasks, row.parts) if t.stage == "reduce"]


def band_of(name: str) -> str:
    (band,) = [b for b in BANDS if b in name]
    return band


@pytest.mark.timeout(1800)
def test_a_udf_reducing_over_t_makes_the_built_in_maximum_pixel_for_pixel(stack: LocalStack) -> None:
    connection = connected(stack)
    assert {"run_udf", "apply_dimension"} <= {p["id"] for p in connection.list_processes()}
    job = loaded(connection).reduce_dimension(dimension="t", reducer=openeo.UDF(MAX)).save_result("GTiff").create_job()
    made = finished(job)
    assert sorted(map(band_of, made)) == sorted(BANDS), made.keys()  # a GeoTIFF per band, on the one target tile
    builtin = loaded(connection).reduce_dimension(dimension="t", reducer="max").save_result("GTiff").create_job()
    builtin.start_and_wait(max_poll_interval=2, print=lambda *_: None)
    expected = {}
    for name, asset in builtin.get_results().get_metadata()["assets"].items():
        with rasterio.open(BytesIO(httpx.get(asset["href"]).content)) as src:
            expected[band_of(name)] = decode(src.read(1), CATALOG["MOD13A1"].layer(band_of(name)).encoding)
    tiles = tiles_of(stack, job)
    for name, values in made.items():
        band = band_of(name)
        assert np.array_equal(values, expected[band], equal_nan=True), band
        with np.errstate(all="ignore"):
            stacked = np.nanmax(np.stack([v for (layer, _), v in tiles.items() if layer == band]), axis=0)
        assert np.array_equal(values, stacked, equal_nan=True), band
        assert np.isfinite(values).mean() > 0.5, band
    assert reductions_of(stack, job) == ["SUCCEEDED"]
    # the same UDF over the same tiles again: found made (its bundle and the tiles are its address), run no more
    again = loaded(connection).reduce_dimension(dimension="t", reducer=openeo.UDF(MAX)).save_result(
        "GTiff").create_job()
    repeated = finished(again)
    assert reductions_of(stack, again) == ["CACHED"]
    assert sorted(repeated) == sorted(made) and all(np.array_equal(repeated[n], made[n], equal_nan=True) for n in made)


@pytest.mark.timeout(1800)
def test_a_udf_per_month_gets_its_context_and_equals_numpy_on_the_job_s_tiles(stack: LocalStack) -> None:
    connection = connected(stack)
    udf = openeo.UDF(SCALED_MEAN, context={"factor": 10})
    job = loaded(connection).aggregate_temporal_period("month", reducer=udf).save_result("GTiff").create_job()
    made = finished(job)
    tiles = tiles_of(stack, job)
    assert len(made) == 4, made.keys()  # two bands, two months
    for name, values in made.items():
        band, month = band_of(name), re.search(r"2022-0[67]", name)
        assert month is not None, name
        with np.errstate(all="ignore"):
            mean = np.nanmean(np.stack([v for (layer, day), v in tiles.items()
                                        if layer == band and day.startswith(month[0])]), axis=0) * 10
        assert np.allclose(values, mean, rtol=1e-6, atol=0, equal_nan=True), name
        assert np.isfinite(values).any()


@pytest.mark.timeout(1800)
def test_a_time_series_udf_applied_over_t_keeps_each_date(stack: LocalStack) -> None:
    connection = connected(stack)
    udf = openeo.UDF(RUNNING_SUM, context={"offset": 1})
    job = loaded(connection).filter_bands([BANDS[0]]).apply_dimension(dimension="t", process=udf).save_result(
        "GTiff").create_job()
    made = finished(job)
    tiles = tiles_of(stack, job)
    assert sorted(re.search(r"2022-\d\d-\d\d", n)[0] for n in made) == DAYS  # type: ignore[index]
    running = np.zeros_like(tiles[BANDS[0], DAYS[0]])
    for day in DAYS:
        running = running + tiles[BANDS[0], day]  # NaN once a date has no value, as cumsum(skipna=False)
        (name,) = [n for n in made if day in n]
        assert np.allclose(made[name], running + 1, rtol=1e-6, equal_nan=True), day


@pytest.mark.timeout(1800)
def test_a_udf_finds_no_secret_socket_or_file_and_fails_as_its_code_with_its_traceback(
        stack: LocalStack, azurite: Azurite) -> None:
    connection = connected(stack)
    port = int(re.search(r"BlobEndpoint=https?://[^:/]+:(\d+)", azurite.connection_string)[1])  # type: ignore[index]
    udf = openeo.UDF(HOSTILE, context={"key": ACCOUNT_KEY[:24], "port": port})
    job = loaded(connection).reduce_dimension(dimension="t", reducer=udf).save_result("GTiff").create_job()
    job.start_job()
    wait_for(lambda: job.status() in ("finished", "error"), 900, "the job")
    assert job.status() == "error"
    errors = [e for e in job.logs(level="error") if e.get("data", {}).get("stage") == "reduce"]
    # the user's code: its budget, not the platform's (the task is dead once it has failed the same way twice)
    assert sorted(e["data"]["attempt"] for e in errors) == [1, 2], [(e["message"], e.get("data")) for e in errors]
    assert all(e["code"] == "user_code_error" and "run_udf exited with code 1" in e["message"] for e in errors)
    error = errors[0]
    stderr = httpx.get(next(link["href"] for link in error["links"] if link["title"] == "stderr.txt")).text
    assert "Traceback (most recent call last)" in stderr and "in apply_datacube" in stderr, stderr
    seen = json.loads(stderr.rsplit("RuntimeError: REPORT", 1)[1])
    assert seen["leaks"] == [] and seen["proc"] == [], seen  # no secret in its environment or another process's
    assert not any(word in name for name in seen["environ"] for word in ("KEY", "SECRET", "TOKEN", "CONNECTION",
                                                                         "AZURE", "STORAGE")), seen["environ"]
    assert seen["storage"] != "connected" and seen["shadow"] == "PermissionError", seen
    assert seen["writes"] == dict.fromkeys(("inputs", "tmp", "task", "code"), "PermissionError"), seen


def test_a_udf_bagpipe_cannot_run_is_refused_at_creation_naming_the_field_with_nothing_stored(
        stack: LocalStack) -> None:
    connection = connected(stack)
    clients = clients_for(stack.settings)
    jobs_before = len(connection.list_jobs())
    bundles_before = sorted(b.name for b in clients.bundles.list_blobs())
    refusals = [
        (openeo.UDF("def apply_datacube(cube, context):\n    return cube +\n", runtime="Python"),
         "ProcessParameterInvalid", "run_udf: udf: a syntax error at line 2"),
        (openeo.UDF("def transform(cube, context):\n    return cube\n", runtime="Python"),
         "ProcessParameterInvalid", "run_udf: udf: no entry point"),
        (openeo.UDF(MAX, runtime="R"), "InvalidRuntime", "run_udf: runtime 'R'"),
        (openeo.UDF(MAX, runtime="Python", version="2.7"), "InvalidVersion", "run_udf: version '2.7'"),
        (openeo.UDF("https://example.org/udf.py", runtime="Python"), "ProcessParameterUnsupported",
         "run_udf: udf: a URL"),
    ]
    connection.validate_process_graph(loaded(connection))  # the API's first graph loads its parser: not timed
    for udf, code, message in refusals:
        graph = loaded(connection).reduce_dimension(dimension="t", reducer=udf).save_result("GTiff")
        started = time.monotonic()
        with pytest.raises(openeo.rest.OpenEoApiError) as refused:
            graph.create_job()
        assert time.monotonic() - started < 1.0  # the client's validation, then its creation, each refused
        assert refused.value.http_status_code == 400 and refused.value.code == code, refused.value
        assert refused.value.message.startswith(message), refused.value.message
    assert len(connection.list_jobs()) == jobs_before
    assert sorted(b.name for b in clients.bundles.list_blobs()) == bundles_before


def test_the_udf_runtimes_name_the_sandbox_s_python_and_libraries(stack: LocalStack) -> None:
    runtimes = connected(stack).list_udf_runtimes()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert list(runtimes) == ["Python"] and runtimes["Python"]["default"] == version
    libraries = runtimes["Python"]["versions"][version]["libraries"]
    for name in ("numpy", "xarray", "pandas", "openeo"):
        assert libraries[name] == {"version": metadata.version(name)}, name
    assert any(e["path"] == "/udf_runtimes" for e in connected(stack).capabilities().capabilities["endpoints"])
