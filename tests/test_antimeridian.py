"""A region across ±180° is accepted and cut correctly, and a target tile that touches MODIS
tiles h00 and h35 is made within a memory bound (each source warped into the target's own
array; the bounding box of the two would be 86,400 × 2,400 pixels: bench/antimeridian.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.enums import Resampling
from rasterio.warp import reproject

from bench import antimeridian
from pipeline.modis.products import CATALOG
from pipeline.modis.reprojection import Source, Target, warp_array
from pipeline.planning import RequestError
from pipeline.requests.expansion import expand
from pipeline.requests.request import JobRequest


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


def test_the_windows_read_lose_no_pixel_of_a_target_across_the_antimeridian(tmp_path: Path) -> None:
    """Each source read only where the target needs it warps to the very pixels that the
    whole source does (the window of a target crossing ±180° spans its sources' width)."""
    paths = antimeridian.sources(tmp_path)
    target = Target(antimeridian.CRS, antimeridian.BOUNDS, 100.0, "nearest")
    expected = np.full(target.shape, 255, dtype="uint8")
    for path in paths:  # each whole source, the first with data winning
        with rasterio.open(path) as source:
            part = np.full(target.shape, 255, dtype="uint8")
            reproject(source.read(1), part, src_transform=source.transform, src_crs=source.crs, src_nodata=255,
                      dst_transform=target.transform, dst_crs=target.crs, dst_nodata=255,
                      resampling=Resampling.nearest)
            expected = np.where(expected == 255, part, expected)
    made = warp_array([Source(p.stem, {"Maximum_Snow_Extent": p}) for p in paths],
                      CATALOG["MOD10A2"].layer("Maximum_Snow_Extent"), target)
    assert (expected != 255).mean() > 0.99 and np.array_equal(made, expected)
