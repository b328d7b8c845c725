"""A drought index as a scientist would check it: the Vegetation Health Index of July 2022
from two products (MOD13A1 NDVI, MOD11A2 daytime LST) against a 2019–2021 baseline, made by
a job on the local stack, equals the same index computed with xarray on ``odc.stac.load`` of
the job's own STAC items (its results folder, as ``bagpipe results`` writes it), each layer
decoded by its item's ``raster:bands`` alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import odc.stac
import pystac
import pytest
import xarray as xr

from bagpipe.azurite import Azurite
from bagpipe.client import Api, download_results
from bagpipe.stack import LocalStack
from tests.conftest import wait_for

NDVI, LST = "500m_16_days_NDVI", "LST_Day_1km"
REQUEST = {"region": {"bbox": [-108.0, 35.2, -107.5, 35.8]}, "grid": {"tile_size": 1.0, "resolution": 0.01},
           "start": "2022-07-01", "end": "2022-07-31", "products": ["MOD13A1", "MOD11A2"],
           "layers": {"MOD11A2": [LST]},
           "reduce": {"by": "month", "inputs": {"ndvi": f"MOD13A1.{NDVI}", "lst": f"MOD11A2.{LST}"},
                      "expression": "0.5 * ndvi.vci + 0.5 * lst.tci", "name": "vhi",
                      "baseline": {"start": "2019-01-01", "end": "2021-12-31"}}}


@pytest.fixture(scope="module")
def results(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp = tmp_path_factory.mktemp("vhi")
    with LocalStack(tmp / "stack", workers=1, slots=2, connection=azurite.connection_string,
                    namespace=f"vhi{tmp.name[-6:].replace('_', '')}") as stack:
        api = Api(stack.api_url, stack.token)
        job = api.submit(REQUEST)["job"]
        status = wait_for(lambda: (s := api.status(job))["state"] in ("SUCCEEDED", "FAILED") and s, 600, "the job")
        assert status["state"] == "SUCCEEDED", status
        download_results(api, job, tmp / "out")
        yield tmp / "out"


def decoded(items: list[pystac.Item], band: str) -> xr.DataArray:
    """The items' band as physical values, NaN where there is none: odc.stac loads the stored
    values; the item's raster:bands says the nodata, scale and offset."""
    loaded = odc.stac.load(items, bands=[band], groupby="time")[band]
    (info,) = items[0].assets[band].extra_fields["raster:bands"]
    values = loaded.astype("float64")
    if info.get("nodata") is not None:
        values = values.where(loaded != info["nodata"])
    return values * info.get("scale", 1.0) + info.get("offset", 0.0)


@pytest.mark.timeout(900)  # four Julys of two products, synthesized and collected
def test_vhi_against_a_baseline_equals_xarray_on_the_jobs_own_stac_items(results: Path) -> None:
    items = list(pystac.Collection.from_file(str(results / "collection.json")).get_items())
    tiles = {product: [i for i in items if i.properties["bagpipe:stage"] == "modis"
                       and i.properties["bagpipe:product"] == product] for product in ("MOD13A1", "MOD11A2")}
    ndvi, lst = decoded(tiles["MOD13A1"], NDVI), decoded(tiles["MOD11A2"], LST)
    assert {int(y) for y in np.unique(ndvi.time.dt.year)} == {2019, 2020, 2021, 2022}  # the baseline's tiles too

    def julys(values: xr.DataArray) -> xr.DataArray:
        """Each year's July: the mean of the composites whose first day is in July (a composite
        belongs to the group holding its first day)."""
        july = values.where(values.time.dt.month == 7, drop=True)
        return july.groupby("time.year").mean("time", skipna=True)

    def percent_of_range(values: xr.DataArray, *, inverted: bool) -> xr.DataArray:
        yearly = julys(values)
        baseline = yearly.sel(year=[2019, 2020, 2021])
        low, high, now = baseline.min("year"), baseline.max("year"), yearly.sel(year=2022)
        spread = (high - low).where(high > low)
        return 100 * ((high - now) if inverted else (now - low)) / spread

    expected = 0.5 * percent_of_range(ndvi, inverted=False) + 0.5 * percent_of_range(lst, inverted=True)
    (vhi_item,) = [i for i in items if "vhi" in i.assets and i.properties["bagpipe:stage"] != "mosaic"]
    assert vhi_item.properties["start_datetime"].startswith("2022-07-01")
    assert vhi_item.properties["end_datetime"].startswith("2022-07-31")
    made = decoded([vhi_item], "vhi").isel(time=0)
    expected = expected.sel(latitude=made.latitude, longitude=made.longitude, method="nearest", tolerance=1e-6)
    assert made.shape == expected.shape == (100, 100)
    assert np.array_equal(np.isnan(made.values), np.isnan(expected.values))
    assert np.isfinite(made.values).sum() >= 50  # clear in a July of every year (85 of the box): to compare
    # bagpipe computes in float32, its output's type: a difference of LSTs near 300 K carries
    # float32's 3e-5 K, which a baseline spread of a tenth of a kelvin makes 3e-4 of the index
    # (a wrong year, group or sign is off by tens of points)
    np.testing.assert_allclose(made.values[np.isfinite(made.values)], expected.values[np.isfinite(expected.values)],
                               rtol=1e-3, atol=1e-2)
