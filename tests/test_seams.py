"""No seam at a MODIS tile's edge: a target tile's warp reads its neighbouring granules' edge
pixels, so that bilinear, cubic and average across the edge between h08v05 and h09v05 are
GDAL's own warp of the mosaic of the sources (``rio warp`` of ``rio merge``), pixel for pixel
within GDAL's rounding of a stored value, at bagpipe's kernel width of one source pixel
(``XSCALE=1``, ``YSCALE=1``); a target near an edge it does not cross reads the granule
beyond it (``TargetTile.reads``), and the planner's search finds that granule."""

from __future__ import annotations

import subprocess
import sys
from datetime import date
from pathlib import Path

import numpy as np
import pytest
import rasterio
from pyproj import Transformer

from bagpipe import modis_world as world
from pipeline.modis import reprojection
from pipeline.modis.catalogs import footprint
from pipeline.modis.grid import RADIUS, TILE_SIZE, X_MIN, Tile, tiles_for_bbox
from pipeline.modis.products import CATALOG
from pipeline.modis.reprojection import Source, Target, warp_array
from pipeline.modis.targets import REACH_METRES, GridSpec, native_transform, sinusoidal
from pipeline.requests import search

RIO = str(Path(sys.executable).with_name("rio"))
MOD13A1 = CATALOG["MOD13A1"]
NDVI = MOD13A1.layer("500m_16_days_NDVI")
DAY = date(2022, 7, 12)
ACROSS = (-110.5, 34.5, -109.5, 35.5)  # the edge between h08v05 and h09v05 runs through it (at -109.87° at 35°)


@pytest.fixture(scope="module")
def granules(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Source], Path]:
    """The two granules (NDVI and its reliability, as Planetary Computer keeps them) and the
    mosaic of their NDVI masked by its reliability at native resolution, as ``rio merge``
    makes it. The synthetic world is smooth from pixel to pixel, as a field of the planet; the
    NDVI gets a checkerboard of ±0.15 on top, as real data's pixel-to-pixel noise, so that
    what a kernel reads across the edge shows."""
    folder = tmp_path_factory.mktemp("seams")
    sources, masked = [], []
    for tile in ("h08v05", "h09v05"):
        name = world.granule_name(MOD13A1, tile, DAY)
        files = {}
        for layer in (NDVI.name, NDVI.masked_by):
            assert layer
            files[layer] = folder / f"{name}_{layer}.tif"
            files[layer].write_bytes(world.cog(name, layer))
        with rasterio.open(files[NDVI.name]) as smooth:
            profile, values = smooth.profile, smooth.read(1)
        rows, cols = np.indices(values.shape)
        noisy = np.clip(values + np.where((rows + cols) % 2, 1500, -1500), *NDVI.valid)
        with rasterio.open(files[NDVI.name], "w", **(profile | {"driver": "GTiff"})) as out:
            out.write(np.where(values == NDVI.fill, values, noisy).astype(NDVI.dtype), 1)
        source = Source(name, files)
        sources.append(source)
        with reprojection._opened(source, NDVI.name) as raster:
            values = reprojection.masked_values(source, NDVI, (0, 0, raster.height, raster.width), raster)
        path = folder / f"masked-{tile}.tif"
        with rasterio.open(path, "w", driver="GTiff", width=2400, height=2400, count=1, dtype=NDVI.dtype,
                           crs=sinusoidal().to_wkt(), transform=native_transform(Tile.parse(tile), 2400),
                           nodata=NDVI.fill) as out:
            out.write(values, 1)
        masked.append(path)
    mosaic = folder / "mosaic.tif"
    subprocess.run([RIO, "merge", *map(str, masked), str(mosaic), "--overwrite"], check=True)
    return sources, mosaic


def rio_warp(mosaic: Path, target: Target, folder: Path) -> np.ndarray:
    """GDAL's warp of the mosaic onto the target's grid (``rio warp --like`` a raster of it),
    at bagpipe's kernel width."""
    like, out = folder / "like.tif", folder / "warped.tif"
    height, width = target.shape
    with rasterio.open(like, "w", driver="GTiff", width=width, height=height, count=1, dtype="uint8",
                       crs=target.crs, transform=target.transform):
        pass
    kernel = [arg for key, value in reprojection.KERNEL.items() for arg in ("--wo", f"{key}={value}")] \
        if target.resampling in reprojection.KERNELS else []
    subprocess.run([RIO, "warp", str(mosaic), str(out), "--overwrite", "--like", str(like), "--resampling",
                    target.resampling, "--src-nodata", str(NDVI.fill), "--dst-nodata", str(NDVI.fill), *kernel],
                   check=True, capture_output=True)
    with rasterio.open(out) as warped:
        assert warped.shape == target.shape
        return np.asarray(warped.read(1))


@pytest.mark.parametrize("resampling", ["bilinear", "cubic", "average", "nearest"])
def test_a_warp_across_a_modis_tile_edge_is_gdals_warp_of_the_mosaic(
        granules: tuple[list[Source], Path], tmp_path: Path, resampling: str) -> None:
    sources, mosaic = granules
    target = Target("EPSG:4326", ACROSS, 0.005, resampling)
    made = warp_array(sources, NDVI, target)
    expected = rio_warp(mosaic, target, tmp_path)
    assert made.shape == expected.shape == (200, 200)
    assert (made != NDVI.fill).mean() > 0.5
    assert np.array_equal(made == NDVI.fill, expected == NDVI.fill)
    assert int(np.abs(made.astype(int) - expected.astype(int)).max()) <= 1  # GDAL's rounding of a stored value


def test_each_granule_warped_alone_leaves_a_seam(granules: tuple[list[Source], Path], tmp_path: Path) -> None:
    """What the mosaic is for: warped one granule at a time (the first with data winning, as
    bagpipe did), at bagpipe's kernel width, bilinear sees no pixel across the edge, and the
    pixels beside it differ from the mosaic's warp by more than 0.01 NDVI; away from the
    edge they do not differ."""
    sources, mosaic = granules
    target = Target("EPSG:4326", ACROSS, 0.005, "bilinear")
    alone = [warp_array([source], NDVI, target) for source in sources]
    first = np.where(alone[0] != NDVI.fill, alone[0], alone[1])
    expected = rio_warp(mosaic, target, tmp_path)
    both = (first != NDVI.fill) & (expected != NDVI.fill)
    diff = np.where(both, np.abs(first.astype(int) - expected.astype(int)), 0)
    assert diff.max() > 100  # 0.01 NDVI
    west, _, _, north = ACROSS
    lats = north - (np.arange(200) + 0.5) * 0.005
    seam = (np.degrees((X_MIN + 9 * TILE_SIZE) / (RADIUS * np.cos(np.radians(lats)))) - west) / 0.005  # in columns
    near = np.abs(np.arange(200)[None, :] + 0.5 - seam[:, None]) <= 2
    assert diff[~near].max() <= 1
    assert diff[near].max() > 100


def test_a_target_near_an_edge_it_does_not_cross_reads_the_granule_beyond(
        granules: tuple[list[Source], Path], tmp_path: Path) -> None:
    """Small target tiles (4 × 4 pixels) along the edge: each one of h08v05 alone with a
    pixel centre within 2.5 source pixels of the edge names h09v05 among the tiles it reads;
    the nearest one, within cubic's reach (1.5 source pixels: GDAL's cubic reads the 4 × 4
    pixels around a point), has a cubic warp that changes when h09v05 is read, and is then
    the mosaic's; the planner's search box around each such
    target reaches h09v05; a tile far from the edge reads h08v05 alone."""
    sources, mosaic = granules
    grid = GridSpec("EPSG:4326", 0.02, 0.005)
    edge = X_MIN + 9 * TILE_SIZE
    to_plane = Transformer.from_crs("EPSG:4326", sinusoidal(), always_xy=True)
    near = []
    for tile in grid.tiles_for_lonlat_box(-110.55, 34.5, -109.2, 35.5):  # the edge runs -110.52° to -109.23°
        west, south, _, _ = tile.bounds()
        seam = np.degrees(edge / (RADIUS * np.cos(np.radians(south))))
        if not -0.1 < seam - west < 0.1 or [s.name for s in tile.sources()] != ["h08v05"]:
            continue
        cols, rows = np.meshgrid(np.arange(4) + 0.5, np.arange(4) + 0.5)
        xs, _ = to_plane.transform(west + cols.ravel() * 0.005, south + rows.ravel() * 0.005)
        reach = edge - float(np.max(xs))  # metres from the nearest pixel centre to the edge
        if reach < 2.5 * TILE_SIZE / 2400:
            near.append((reach, tile))
    assert len(near) >= 3
    for _, tile in near:
        assert [s.name for s in tile.reads()] == ["h08v05", "h09v05"], tile.name
        box = search.widened(footprint([tile]), np.degrees(3 * REACH_METRES / RADIUS))
        assert Tile.parse("h09v05") in tiles_for_bbox(*box), tile.name
    reach, nearest = min(near, key=lambda n: n[0])
    assert reach < 1.5 * TILE_SIZE / 2400
    target = Target("EPSG:4326", nearest.bounds(), 0.005, "cubic")
    made = warp_array(sources, NDVI, target)
    assert not np.array_equal(warp_array(sources[:1], NDVI, target), made)
    assert int(np.abs(made.astype(int) - rio_warp(mosaic, target, tmp_path).astype(int)).max()) <= 1
    far = grid.tiles_for_lonlat_box(-110.6, 35.0, -110.58, 35.02)  # 60 km west of the edge
    assert far and all([s.name for s in t.reads()] == ["h08v05"] for t in far)


def test_the_content_address_names_the_kernel() -> None:
    """A tile made by the per-granule warp is not taken for one of the seamless warp: the
    stage's version, in the content address, changed with it."""
    target = Target("EPSG:4326", ACROSS, 0.005, "bilinear")
    assert reprojection.VERSION == "reproject-3"
    made = reprojection.cache_key(target, "MOD13A1", NDVI.name, ["a", "b"])
    assert made != reprojection.cache_key(Target("EPSG:4326", ACROSS, 0.005, "cubic"), "MOD13A1", NDVI.name,
                                          ["a", "b"])
    assert made != reprojection.cache_key(target, "MOD13A1", NDVI.name, ["a"])
