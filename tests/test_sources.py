"""Which MODIS tiles a target tile needs, found for many targets at once
(``targets.sources_of``), is exactly what projecting every point of each target's lattice
finds (the method it replaced, kept here as the reference), on the grids scientists ask
for; and a request at the task limit is validated and estimated in seconds."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pipeline.modis.grid import TILE_SIZE, TILES_H, TILES_V, X_MIN, Y_MAX, Tile
from pipeline.modis.targets import EDGE_SAMPLES, SINUSOIDAL_PROJ4, GridSpec, TargetTile, _to_sinusoidal, sources_of
from pipeline.requests.expansion import expand
from pipeline.requests.request import JobRequest


def lattice_sources(target: TargetTile) -> tuple[Tile, ...]:
    """The MODIS tiles of every point of the target's lattice (EDGE_SAMPLES a side, edges
    included), projected to the sinusoidal grid: the method sources_of replaced, as it was."""
    west, south, east, north = target.bounds()
    line = np.linspace(0.0, 1.0, EDGE_SAMPLES)
    u, v = np.meshgrid(line, line)
    xs = west + (east - west) * u.ravel()
    ys = south + (north - south) * v.ravel()
    sx, sy = _to_sinusoidal(target.grid.crs).transform(xs, ys)
    ok = np.isfinite(sx) & np.isfinite(sy)
    h = np.floor((sx[ok] - X_MIN) / TILE_SIZE).astype(int)
    v_ = np.floor((Y_MAX - sy[ok]) / TILE_SIZE).astype(int)
    found = set()
    for hh, vv in set(zip(h.tolist(), v_.tolist(), strict=True)):
        if 0 <= hh < TILES_H and 0 <= vv < TILES_V and Tile(hh, vv).has_land_pixels():
            found.add(Tile(hh, vv))
    return tuple(sorted(found))


GRIDS = [
    # (what, CRS, tile size, lon/lat box)
    ("lon/lat 1° over North America", "EPSG:4326", 1.0, (-125.0, 25.0, -95.0, 50.0)),
    ("lon/lat 0.25° on the equator and 10° meridians", "EPSG:4326", 0.25, (5.0, -2.0, 12.0, 2.0)),
    ("lon/lat 10° of the whole Earth", "EPSG:4326", 10.0, (-180.0, -90.0, 180.0, 90.0)),
    ("UTM zone 12N, 100 km", "EPSG:32612", 100_000.0, (-120.0, 30.0, -100.0, 45.0)),
    ("UTM zone 33N, far from its zone too", "EPSG:32633", 1_000_000.0, (-60.0, -60.0, 90.0, 70.0)),
    ("polar stereographic north, 150 km", "EPSG:3413", 150_000.0, (-180.0, 70.0, 180.0, 90.0)),
    ("polar stereographic south, 400 km", "EPSG:3031", 400_000.0, (-180.0, -90.0, 180.0, -50.0)),
    ("MODIS's own sinusoidal grid, its tiles", SINUSOIDAL_PROJ4, TILE_SIZE, (-180.0, -90.0, 180.0, 90.0)),
    ("MODIS's sinusoidal grid, half tiles", SINUSOIDAL_PROJ4, TILE_SIZE / 2, (-20.0, -30.0, 40.0, 30.0)),
    ("lon/lat 0.5° across ±180°", "EPSG:4326", 0.5, (175.0, -20.0, -175.0, -10.0)),
    ("Pacific Mercator across ±180°, 100 km", "EPSG:3832", 100_000.0, (172.0, -22.0, -172.0, -12.0)),
    ("Mollweide, the Earth's edge", "ESRI:54009", 1_000_000.0, (-180.0, -90.0, 180.0, 90.0)),
    ("orthographic, its horizon", "+proj=ortho +lat_0=40 +lon_0=-100", 500_000.0, (-180.0, -90.0, 180.0, 90.0)),
]


@pytest.mark.parametrize("what,crs,size,box", GRIDS, ids=[g[0] for g in GRIDS])
def test_sources_are_those_of_every_lattice_point(what: str, crs: str, size: float,
                                                  box: tuple[float, float, float, float]) -> None:
    grid = GridSpec(crs, size, size / 200)
    targets = grid.tiles_for_lonlat_box(*box)
    assert 30 <= len(targets) <= 1000, len(targets)
    found = sources_of(grid, targets)
    expected = [lattice_sources(t) for t in targets]
    assert sum(map(len, expected)) >= len(targets) / 4  # most have sources: a grid worth comparing
    differ = [(t.name, e, f) for t, e, f in zip(targets, expected, found, strict=True) if e != f]
    assert not differ, differ[:5]


def test_sources_of_random_grids_are_those_of_every_lattice_point() -> None:
    rng = random.Random(20260)
    crss = ["EPSG:4326", "EPSG:32612", "EPSG:3413", "EPSG:3857", "EPSG:6933", "+proj=laea +lat_0=90", "+proj=robin",
            "+proj=igh", "+proj=geos +h=35785831 +lon_0=0", "EPSG:3031"]
    compared = 0
    while compared < 600:
        crs = rng.choice(crss)
        size = rng.choice([0.3, 1.0, 2.5, 12.0]) if crs == "EPSG:4326" else rng.choice([3e4, 1e5, 4e5, 2e6])
        west, south = rng.uniform(-180, 170), rng.uniform(-90, 80)
        box = (west, south, min(180.0, west + rng.uniform(1, 90)), min(90.0, south + rng.uniform(1, 45)))
        grid = GridSpec(crs, size, size / 100)
        try:
            if grid.count_for_lonlat_box(*box) > 2000:
                continue
        except ValueError:  # a box the projection cannot show (a geostationary view's far side)
            continue
        targets = grid.tiles_for_lonlat_box(*box)
        sample = rng.sample(range(len(targets)), min(len(targets), 40))
        found = sources_of(grid, targets)
        for k in sample:
            assert found[k] == lattice_sources(targets[k]), (crs, size, box, targets[k].name)
        compared += len(sample)


def test_a_target_knows_its_sources_alone_or_with_others() -> None:
    grid = GridSpec("EPSG:4326", 1.0, 0.005)
    (alone,) = grid.tiles_for_lonlat_box(-106.5, 35.5, -106.4, 35.6)
    assert [t.name for t in alone.sources()] == ["h09v05"]
    assert sources_of(grid, []) == []
    native = GridSpec("MODIS", 0.0, 0.0).native_tile(Tile(9, 5))
    assert native.sources() == [Tile(9, 5)]


@pytest.mark.parametrize("crs,size", [("EPSG:4326", 1.25), ("EPSG:3413", 65_000.0)])
def test_a_request_at_the_task_limit_is_expanded_with_every_tasks_sources(crs: str, size: float) -> None:
    """About 40,000 target tiles × one period, each task's parameters made as the estimate
    makes them (how long it takes is bench.requests' to measure: minutes when each target
    projected its 4,096 lattice points, seconds now)."""
    request = JobRequest.model_validate({
        "region": {"bbox": [-180, -90, 180, 90] if crs == "EPSG:4326" else [-180, 30, 180, 90]},
        "start": "2022-01-01", "end": "2022-01-01", "products": ["MOD10A2"],
        "grid": {"crs": crs, "tile_size": size, "resolution": size / 100}})
    params = [s.params() for s in expand(request, 50_000)]
    assert len(params) > 10_000 and all(p["sources"] for p in params)
