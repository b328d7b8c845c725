"""Reductions as scientists ask for them, end to end on real workers with granules from the
local Planetary Computer: a built-in reducer per month, per-date derived layers, a job that
made nothing. Each product is checked against numpy on the very tiles the job made
(tests/test_science_baselines.py: against a baseline, and on NASA's real files)."""

from __future__ import annotations

import json
from datetime import date

import numpy as np
import pytest
from rasterio.io import MemoryFile

from bagpipe.mailserver import MailServer
from bagpipe.planetary import Planetary
from pipeline.lifecycle import jobs, tasks
from pipeline.lifecycle.status import TaskStatus
from pipeline.modis.products import CATALOG
from pipeline.reduction import AGGREGATE_STAGE
from pipeline.requests import application
from pipeline.requests.application import SYNTHETIC_NOTE
from pipeline.requests.request import JobRequest
from pipeline.science.encoding import decode
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import on_stac, parts, running_control, running_workers, wait_for

REGION = {"bbox": [-108.0, 35.2, -107.5, 35.8]}  # one 1° tile, x-108 y35, inside h09v05
GRID = {"tile_size": 1.0, "resolution": 0.01}  # 100 × 100 pixels
NDVI = "500m_16_days_NDVI"


def run_job(settings: Settings, body: dict, timeout: float = 800) -> tuple[Clients, str, dict]:
    clients = Clients(settings)
    clients.ensure_resources()
    job = application.submit(clients, JobRequest.model_validate(body)).job
    with running_control(settings), running_workers(settings, 1, slots=2):
        wait_for(lambda: jobs.get(clients, job).state in ("SUCCEEDED", "FAILED"), timeout, "the job")
    return clients, job, jobs.status(clients, job)


def rows_of(clients: Clients, job: str, stage: str) -> list[tasks.TaskRow]:
    return [r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.stage == stage]


def raster(clients: Clients, output: str, band: int = 1) -> tuple[np.ndarray, dict]:
    """An output's band and its file's encoding (type, nodata, scale, offset, unit, tags)."""
    data = clients.tiles.download_blob(output.removeprefix(names.TILE_OUTPUT_PREFIX)).readall()
    with MemoryFile(data) as memory, memory.open() as src:
        return src.read(band), {"dtype": src.dtypes[0], "nodata": src.nodata, "scale": src.scales[0],
                                "offset": src.offsets[0], "unit": src.units[0], "tags": src.tags(),
                                "descriptions": src.descriptions, "shape": (src.height, src.width)}


def ndvi_tiles(clients: Clients, job: str) -> dict[date, np.ndarray]:
    """The job's NDVI tiles, decoded (NaN: no value), by date."""
    layer = CATALOG["MOD13A1"].layer(NDVI)
    found = {}
    for row in rows_of(clients, job, "modis"):
        if row.status in (TaskStatus.SUCCEEDED, TaskStatus.CACHED):
            (output,) = [o for o in row.output_names() if f".{NDVI}." in o]
            found[date.fromisoformat(row.parameters()["date"])] = decode(raster(clients, output)[0], layer.encoding)
    return found


@pytest.mark.timeout(900)  # a year of full-size granules, synthesized and collected
def test_a_year_by_month_with_max_makes_a_reduction_a_month_equal_to_numpy(
        settings: Settings, planetary: Planetary) -> None:
    body = {"region": REGION, "grid": GRID, "start": "2022-01-01", "end": "2022-12-31", "products": ["MOD13A1"],
            "reduce": {"by": "month", "reducer": "max"}}
    clients, job, status = run_job(on_stac(settings, planetary), body)
    assert status["state"] == "SUCCEEDED", status
    assert status["notes"] == [SYNTHETIC_NOTE]  # the local world's granules of 2022 are synthesized
    reductions = rows_of(clients, job, AGGREGATE_STAGE)
    assert sorted(r.parameters()["group"] for r in reductions) == [f"2022-{m:02d}" for m in range(1, 13)]
    tiles = ndvi_tiles(clients, job)
    assert len(tiles) == 23
    layer = CATALOG["MOD13A1"].layer(NDVI)
    for row in reductions:
        group = row.parameters()["group"]
        month = [values for day, values in tiles.items() if f"{day:%Y-%m}" == group]
        assert 1 <= len(month) <= 2
        (output,) = row.output_names()
        made, encoding = raster(clients, output)
        assert encoding["dtype"] == "int16" and encoding["scale"] == pytest.approx(1e-4)  # max keeps the encoding
        assert encoding["nodata"] == layer.nodata and encoding["unit"] == "NDVI"
        assert encoding["tags"]["BAGPIPE_SYNTHETIC"] == "true"  # made of synthesized tiles: it says so
        with np.errstate(all="ignore"):
            expected = np.nanmax(np.stack(month), axis=0)
        stored = np.where(np.isnan(expected), layer.nodata, np.rint(expected / layer.scale)).astype("int16")
        assert np.array_equal(made, stored), group
        assert (made != layer.nodata).any()  # the month is not all empty


def test_a_derived_layer_per_date_is_its_expression_over_the_dates_tiles(
        settings: Settings, planetary: Planetary) -> None:
    red, nir = "MCD43A4.Nadir_Reflectance_Band1", "MCD43A4.Nadir_Reflectance_Band2"
    body = {"region": REGION, "grid": GRID, "start": "2022-03-01", "end": "2022-03-02", "products": ["MCD43A4"],
            "derive": {"MCD43A4": {"ndvi": f"({nir} - {red}) / ({nir} + {red})"}},
            "reduce": {"by": "span", "inputs": ["MCD43A4.ndvi"], "reducer": "mean"}}
    clients, job, status = run_job(on_stac(settings, planetary), body)
    assert status["state"] == "SUCCEEDED", status
    bands = {n: CATALOG["MCD43A4"].layer(n) for n in ("Nadir_Reflectance_Band1", "Nadir_Reflectance_Band2")}
    means = []
    for row in rows_of(clients, job, "modis"):
        outputs = {o.rsplit("/", 1)[-1].split(".")[1]: o for o in row.output_names()}
        assert set(outputs) == {"Nadir_Reflectance_Band1", "Nadir_Reflectance_Band2", "ndvi"}
        b1, b2 = (decode(raster(clients, outputs[n])[0], layer.encoding) for n, layer in bands.items())
        made, encoding = raster(clients, outputs["ndvi"])
        assert encoding["dtype"] == "float32" and json.loads(json.dumps(encoding["tags"]))["LAYER"] == "ndvi"
        with np.errstate(all="ignore"):
            expected = (b2 - b1) / (b2 + b1)
        expected[~np.isfinite(expected)] = np.nan
        assert np.allclose(made, expected, equal_nan=True, atol=1e-6) and np.isfinite(made).any()
        means.append(made)
    (reduction,) = rows_of(clients, job, AGGREGATE_STAGE)
    with np.errstate(all="ignore"):
        expected = np.nanmean(np.stack(means), axis=0)
    made, _ = raster(clients, reduction.output_names()[0])
    assert np.allclose(made, expected, equal_nan=True, atol=1e-6)


def test_a_job_that_made_nothing_says_so_in_its_status_manifest_and_email(
        settings: Settings, planetary: Planetary, mail: MailServer) -> None:
    body = {"region": REGION, "grid": GRID, "start": "2031-01-01", "end": "2031-01-31", "products": ["MOD13A1"],
            "reduce": {"by": "month", "reducer": "max"}, "email": "scientist@example.org"}
    clients, job, status = run_job(on_stac(settings, planetary), body)
    assert status["state"] == "SUCCEEDED" and status["counts"]["NO_DATA"] == status["total"] == 3
    assert status["warning"].startswith("the job made no product")
    manifest = json.loads(clients.products.download_blob(names.manifest_blob(job)).readall())
    assert manifest["warning"] == status["warning"]
    ((_, message),) = wait_for(lambda: mail.messages(), 30, "the email")
    assert message["Subject"].endswith("succeeded, no product")
    assert "Warning: the job made no product" in message.get_content()
