"""A region across ±180° is accepted and cut correctly, and a target tile that touches MODIS
tiles h00 and h35 is made within a memory bound (each source warped into the target's own
array; the bounding box of the two would be 86,400 × 2,400 pixels: bench/antimeridian.py)."""

from __future__ import annotations

import pytest

from bench import antimeridian
from pipeline.request import JobRequest, RequestError, expand


def request(bbox: list[float], grid: dict | None = None) -> JobRequest:
    return JobRequest.model_validate({"region": {"bbox": bbox}, "start": "2022-02-02", "end": "2022-02-09",
                                      "products": ["MOD10A2"], **({"grid": grid} if grid else {})})


def test_a_box_across_the_antimeridian_is_cut_into_tiles_on_both_sides() -> None:
    specs = expand(request([178.5, -18.0, -179.5, -16.0]), 100)
    tiles = {s.tile for s in specs}
    assert tiles == {"x+0178y-0017", "x+0178y-0018", "x+0179y-0017", "x+0179y-0018", "x-0180y-0017",
                     "x-0180y-0018"}
    assert {t.name for s in specs for t in s.target.sources()} == {"h34v10", "h35v10", "h00v10"}
    with pytest.raises(RequestError) as empty:
        expand(request([10.0, -18.0, 10.0, -16.0]), 100)
    assert empty.value.field == "region.bbox"


def test_a_target_touching_h00_and_h35_is_made_within_a_memory_bound() -> None:
    specs = expand(request([178.0, -18.9, -179.0, -17.9], {"crs": "EPSG:3832", "tile_size": 100000,
                                                           "resolution": 100}), 100)
    (spec,) = [s for s in specs if s.target.bounds() == antimeridian.BOUNDS]
    assert [t.name for t in spec.target.sources()] == ["h00v10", "h35v10"]
    made = antimeridian.measure("target", 1000)  # in a fresh process: its peak resident memory
    assert made["array"] == [1, 1000, 1000] and made["covered"] > 0.99
    assert made["peak_mb"] < 250 and made["added_mb"] < 100, made  # the bounding-box mosaic: over 500 and 400
