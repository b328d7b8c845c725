"""Reductions against a baseline and on real data, end to end on real workers: an
expression against a baseline's climatology (which a second job finds made) from the local
Planetary Computer, and the monthly maxima of NASA's real MOD13A2 series. Each product is
checked against numpy on the very files the job read. (A file of their own: each is minutes
of work, and the suite's processes take a file at a time.)"""

from __future__ import annotations

from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pytest
from pyhdf.SD import SD, SDC

from bagpipe.cli import SCIENCE_DEMO_REQUEST
from bagpipe.earthdata import Earthdata
from bagpipe.planetary import Planetary
from pipeline.lifecycle import jobs
from pipeline.lifecycle.status import TaskStatus
from pipeline.modis.products import CATALOG
from pipeline.reduction import AGGREGATE_STAGE, CLIMATOLOGY_STAGE
from pipeline.requests import application
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from tests.conftest import on_stac, running_control, running_workers, wait_for
from tests.test_science_jobs import GRID, NDVI, REGION, ndvi_tiles, raster, rows_of, run_job


@pytest.mark.timeout(900)  # four years of two products' full-size granules, synthesized and collected, twice
def test_an_expression_against_a_baseline_equals_numpy_and_a_second_job_reuses_its_climatology(
        settings: Settings, planetary: Planetary) -> None:
    body = {"region": REGION, "grid": GRID, "start": "2022-07-01", "end": "2022-07-31", "products": ["MOD13A1"],
            "reduce": {"by": "month", "inputs": {"ndvi": f"MOD13A1.{NDVI}"}, "expression": "ndvi.vci",
                       "name": "vci", "unit": "%", "baseline": {"start": "2019-01-01", "end": "2021-12-31"}}}
    mine = on_stac(settings, planetary)
    clients, job, status = run_job(mine, body)
    assert status["state"] == "SUCCEEDED", status
    (climatology,) = rows_of(clients, job, CLIMATOLOGY_STAGE)
    assert climatology.status is TaskStatus.SUCCEEDED and climatology.settled_at is None
    (reduction,) = rows_of(clients, job, AGGREGATE_STAGE)
    tiles = ndvi_tiles(clients, job)
    tiles = {d: v for d, v in tiles.items() if d.month == 7}  # (the span has the composite of 26 June too)
    assert sorted(d.year for d in tiles) == [2019, 2019, 2020, 2020, 2021, 2021, 2022, 2022]  # two Julys each
    yearly = np.stack([np.nanmean(np.stack([v for d, v in tiles.items() if d.year == y]), axis=0)
                       for y in (2019, 2020, 2021)])
    now = np.nanmean(np.stack([v for d, v in tiles.items() if d.year == 2022]), axis=0)
    low, high = np.nanmin(yearly, axis=0), np.nanmax(yearly, axis=0)
    with np.errstate(all="ignore"):
        expected = 100 * (now - low) / (high - low)
    expected[~np.isfinite(expected)] = np.nan
    (output,) = reduction.output_names()
    made, encoding = raster(clients, output)
    assert encoding["dtype"] == "float32" and encoding["unit"] == "%"
    assert np.array_equal(np.isnan(made), np.isnan(expected)) and np.isfinite(made).any()
    assert np.allclose(made[np.isfinite(made)], expected[np.isfinite(expected)], atol=1e-3)
    _, kept = raster(clients, climatology.output_names()[0])
    assert kept["descriptions"] == ("mean", "std", "min", "max", "count")
    assert np.allclose(raster(clients, climatology.output_names()[0], 3)[0], low, equal_nan=True, atol=1e-6)

    again = application.submit(clients, JobRequest.model_validate(body)).job
    with running_control(mine), running_workers(mine, 1, slots=2):
        wait_for(lambda: jobs.get(clients, again).state in ("SUCCEEDED", "FAILED"), 300, "the second job")
    (reused,) = rows_of(clients, again, CLIMATOLOGY_STAGE)
    assert reused.status is TaskStatus.CACHED and reused.settled_at is not None  # settled at planning: never run
    assert reused.output_names() == climatology.output_names()
    (second,) = rows_of(clients, again, AGGREGATE_STAGE)
    assert second.status is TaskStatus.CACHED and second.output_names() == reduction.output_names()


REAL_SERIES = sorted((Path(__file__).parent.parent / "data" / "modis" / "MOD13A2_h18v09_2025").glob("*.hdf"))


@pytest.mark.timeout(900)
def test_monthly_maxima_of_the_real_mod13a2_series_equal_numpy_on_nasas_files(
        settings: Settings, planetary: Planetary, nasa: Earthdata) -> None:
    """The ten real composites of h18v09 (January to early June 2025, the Gulf of Guinea),
    on the tile's own grid, reduced by month with max: each month's output is, stored value
    for stored value, numpy's maximum over the HDF4 files NASA published for the composites
    that begin in that month, each masked by its pixel reliability (0 or 1 usable) and its
    valid range — read with pyhdf, not with bagpipe's reader. Nothing synthesized takes part.
    It is the request ``bagpipe demo --science`` submits."""
    layer, reliability = CATALOG["MOD13A2"].layer("1_km_16_days_NDVI"), CATALOG["MOD13A2"].layer(
        "1_km_16_days_pixel_reliability")
    body = SCIENCE_DEMO_REQUEST  # bagpipe demo --science's
    mine = on_stac(settings, planetary, cmr_url=nasa.cmr_url, earthdata_token=nasa.token,
                   earthdata_hosts=nasa.hosts)  # Planetary Computer has no MOD13A2: it comes from NASA
    clients, job, status = run_job(mine, body)
    assert status["state"] == "SUCCEEDED", status
    assert status["notes"] == []  # real data only
    by_month: dict[str, list[np.ndarray]] = {}
    for path in REAL_SERIES:
        begins = date(2025, 1, 1) + timedelta(days=int(path.name.split(".")[1][5:]) - 1)
        sd = SD(str(path), SDC.READ)
        ndvi, rank = sd.select(layer.sds).get(), sd.select(reliability.sds).get()
        sd.end()
        usable = (ndvi >= layer.valid[0]) & (ndvi <= layer.valid[1]) & (rank >= 0) & (rank <= 1)
        by_month.setdefault(f"{begins:%Y-%m}", []).append(np.where(usable, ndvi, np.iinfo(np.int16).min))
    reductions = {r.parameters()["group"]: r for r in rows_of(clients, job, AGGREGATE_STAGE)}
    assert sorted(reductions) == sorted(by_month) == ["2025-01", "2025-02", "2025-03", "2025-04", "2025-05"]
    for month, stack in by_month.items():
        highest = np.max(stack, axis=0)
        expected = np.where(highest == np.iinfo(np.int16).min, layer.nodata, highest)
        (output,) = reductions[month].output_names()
        made, encoding = raster(clients, output)
        assert encoding["tags"].get("BAGPIPE_SYNTHETIC") is None
        assert (encoding["dtype"], encoding["nodata"], encoding["scale"]) == ("int16", layer.nodata, layer.scale)
        assert made.shape == expected.shape == (1200, 1200)
        assert (made != layer.nodata).sum() > 20_000, month  # the coast and São Tomé: 2 % of the tile is land
        np.testing.assert_array_equal(made, expected, err_msg=month)
