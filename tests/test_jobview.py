"""The job page's summaries: runtime histogram with the kill threshold, one state per
target tile, lon/lat bounds of tiles in any CRS."""

from __future__ import annotations

from collections import Counter

import pytest
from pyproj import Transformer

from pipeline.modis.grid import Tile
from pipeline.modis.targets import NATIVE
from pipeline.web import jobview


def test_histogram_counts_every_runtime_and_places_the_threshold() -> None:
    runs = [0.5, 1.0, 1.1, 2.0, 2.4]
    near = jobview.histogram(runs, threshold=4.0)
    assert sum(near["bars"]) == near["count"] == 5 and len(near["bars"]) == jobview.BINS
    assert not near["threshold_beyond"] and near["width_s"] * jobview.BINS >= 4.0
    # every runtime lands in the bar that covers it
    for s in runs:
        assert near["bars"][int(s / near["width_s"])] > 0
    far = jobview.histogram(runs, threshold=1800.0)  # the cold-start ceiling: drawn at the edge
    assert far["threshold_beyond"] and far["width_s"] * jobview.BINS == pytest.approx(2.4 * 1.25)
    assert sum(jobview.histogram([], None)["bars"]) == 0


@pytest.mark.parametrize(("counts", "state"), [
    ({"PENDING": 3}, "waiting"),
    ({"QUEUED": 1, "RUNNING": 1}, "running"),
    ({"SUCCEEDED": 2, "QUEUED": 1}, "running"),
    ({"SUCCEEDED": 2, "CACHED": 1}, "done"),
    ({"SUCCEEDED": 2, "DEAD": 1}, "failed"),
    ({"SUCCEEDED": 1, "CANCELLED": 2}, "cancelled"),
    ({"NO_DATA": 2}, "nodata"),
    ({"NO_DATA": 1, "SUCCEEDED": 1}, "done"),
])
def test_one_state_per_target_tile(counts: dict[str, int], state: str) -> None:
    assert jobview.tile_state(Counter(counts)) == state


def test_tile_bounds_in_lon_lat_from_any_crs() -> None:
    assert jobview.lonlat_bounds("EPSG:4326", "-111.0,34.0,-110.0,35.0") == (-111.0, 34.0, -110.0, 35.0)
    west, south, east, north = jobview.lonlat_bounds("EPSG:5070", "-1300000.0,1300000.0,-1200000.0,1400000.0")
    to_lonlat = Transformer.from_crs("EPSG:5070", "EPSG:4326", always_xy=True)
    for x, y in ((-1300000, 1300000), (-1200000, 1400000), (-1250000, 1350000)):
        lon, lat = to_lonlat.transform(x, y)
        assert west <= lon <= east and south <= lat <= north


def test_tile_bounds_of_a_job_asked_as_modis_tiles() -> None:
    """Its tasks' grid is the MODIS tiles' own (named MODIS, not a CRS pyproj knows)."""
    h09v05 = ",".join(map(repr, Tile.parse("h09v05").bounds()))
    west, south, east, north = jobview.lonlat_bounds(NATIVE, h09v05)
    assert (round(south), round(north)) == (30, 40)
    assert west < -115 < -104 < east  # the sinusoid's edges: wider at its southern edge
