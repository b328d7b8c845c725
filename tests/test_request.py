"""The request schema, the MODIS grid and the expansion of a request into tasks."""

from __future__ import annotations

import math
import random
from datetime import date, timedelta

import pytest
from pydantic import ValidationError

from pipeline.modis.grid import RADIUS, TILE_SIZE, X_MIN, Y_MAX, Tile, tiles_for_bbox
from pipeline.modis.products import CATALOG, period_count, periods
from pipeline.planning import RequestError
from pipeline.requests.expansion import expand
from pipeline.requests.request import JobRequest
from tests.conftest import small_request


def tile_of(lon: float, lat: float) -> Tile:
    """The tile of one point, straight from the sinusoidal formulas."""
    x = RADIUS * math.radians(lon) * math.cos(math.radians(lat))
    y = RADIUS * math.radians(lat)
    return Tile(int((x - X_MIN) // TILE_SIZE), int((Y_MAX - y) // TILE_SIZE))


@pytest.mark.parametrize("bbox", [(-124, 31, -103, 42), (10, -5, 30, 5), (140, -40, 155, -10), (-20, 60, 40, 75)])
def test_bbox_tiles_cover_every_point_of_the_box(bbox: tuple[float, float, float, float]) -> None:
    west, south, east, north = bbox
    found = set(tiles_for_bbox(*bbox))
    sampled = {
        tile_of(west + (east - west) * i / 60, south + (north - south) * j / 60)
        for i in range(61)
        for j in range(61)
    }
    assert sampled <= found
    # and nothing far outside: every tile found is within one tile of a sampled one
    for tile in found:
        assert any(abs(tile.h - s.h) <= 1 and abs(tile.v - s.v) <= 1 for s in sampled)


def test_known_tiles() -> None:
    assert tile_of(-110, 32) == Tile(8, 5)  # Arizona
    assert [t.name for t in tiles_for_bbox(-100, 35, -99, 36)] == ["h09v05"]
    assert Tile.parse("h09v05").name == "h09v05"
    with pytest.raises(ValueError):
        Tile.parse("h36v05")


def test_periods_follow_the_modis_calendar() -> None:
    eight_day = periods(CATALOG["MOD10A2"], date(2022, 1, 5), date(2022, 2, 10))
    assert eight_day == [date(2022, 1, d) for d in (1, 9, 17, 25)] + [date(2022, 2, 2), date(2022, 2, 10)]
    # the last composite of a year is short; a span across new year takes both years' periods
    across = periods(CATALOG["MOD10A2"], date(2021, 12, 30), date(2022, 1, 2))
    assert across == [date(2021, 12, 27), date(2022, 1, 1)]
    assert len(periods(CATALOG["MOD11A1"], date(2022, 1, 1), date(2022, 1, 31))) == 31
    assert periods(CATALOG["MOD10A2"], date(2022, 2, 1), date(2022, 1, 1)) == []


def test_expand_makes_one_task_per_tile_date_product() -> None:
    specs = expand(small_request(products=["MOD10A2", "MOD13A1"]), max_tasks=100)
    assert len(specs) == 2 * 4 + 2 * 2
    assert len(set(specs)) == len(specs)
    assert {s.tile for s in specs} == {"h09v05", "h10v05"}


def test_expand_refuses_too_many_tasks_with_the_count() -> None:
    with pytest.raises(RequestError) as caught:
        expand(small_request(start="2001-01-01", end="2020-12-31"), max_tasks=100)
    assert caught.value.status == 413
    assert caught.value.extra["tasks"] == 2 * 46 * 20


def test_schema_rejects_both_region_kinds() -> None:
    with pytest.raises(ValidationError, match=r"one of bbox .*, tiles or geometry, not bbox and tiles"):
        JobRequest.model_validate(
            {"region": {"bbox": [0, 0, 1, 1], "tiles": ["h09v05"]}, "start": "2022-01-01",
             "end": "2022-01-02", "products": ["MOD10A2"]}
        )


def test_period_count_is_the_number_of_periods_without_making_them() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        product = rng.choice(list(CATALOG.values()))
        start = date(2000, 1, 1) + timedelta(days=rng.randrange(9000))
        end = start + timedelta(days=rng.randrange(-5, 1200))
        assert period_count(product, start, end) == len(periods(product, start, end)), (product.name, start, end)


def test_layers_of_a_product_are_named_or_the_default() -> None:
    specs = expand(small_request(products=["MOD13A1", "MOD10A2"],
                                 layers={"MOD13A1": ["500m_16_days_NDVI", "500m_16_days_pixel_reliability"]}), 100)
    assert {s.layers for s in specs if s.product == "MOD13A1"} == {("500m_16_days_NDVI",
                                                                    "500m_16_days_pixel_reliability")}
    assert {s.layers for s in specs if s.product == "MOD10A2"} == {("Maximum_Snow_Extent",)}
    assert specs[0].params()["layers"]
    for layers, field in (({"MOD13A1": ["NDVI"]}, "layers.MOD13A1"), ({"MOD11A1": ["LST_Day_1km"]}, "layers"),
                          ({"MOD13A1": ["500m_16_days_EVI", "500m_16_days_EVI"]}, "layers.MOD13A1")):
        with pytest.raises(RequestError) as refused:
            expand(small_request(products=["MOD13A1"], layers=layers), 100)
        assert refused.value.status == 400 and refused.value.field == field


def test_the_email_says_what_was_asked() -> None:
    """The email named the job and its label, not what it had been asked for."""
    from pipeline.requests.application import asked_line

    request = JobRequest.model_validate({
        "region": {"tiles": ["h18v09"]}, "start": "2025-01-01", "end": "2025-05-31", "products": ["MOD13A2"],
        "layers": {"MOD13A2": ["1_km_16_days_NDVI"]},
        "reduce": {"by": "month", "reducer": "percentile", "percentile": 90}})
    assert asked_line(request) == ("Asked: MOD13A2 (1_km_16_days_NDVI), 2025-01-01 to 2025-05-31, over the MODIS "
                                   "tiles h18v09; reduced by month: the percentile 90 of every layer made.\n\n")
    boxed = small_request(region={"bbox": [-110, 35.5, -109, 36]}, reducer={"name": "snow_fraction"},
                          grid={"crs": "EPSG:4326", "tile_size": 1.0, "resolution": 0.005})
    assert asked_line(boxed) == (f"Asked: MOD10A2, {boxed.start} to {boxed.end}, over the box -110, 35.5, -109, 36 "
                                 "(west, south, east, north), on EPSG:4326 at 0.005 in tiles of 1; the program "
                                 "snow_fraction over each product's span.\n\n")
