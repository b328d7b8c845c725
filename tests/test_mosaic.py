"""Region mosaics: equal to the tiles where they overlap them (no seams), nodata where no tile
is, cut to the requested box snapped to the grid; a VRT over the tiles when large."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import rasterio
import shapely.geometry
from affine import Affine
from rasterio.crs import CRS
from rasterio.enums import Resampling
from rasterio.warp import reproject
from rasterio.windows import from_bounds

from pipeline.modis import mosaic, stacitems, targets

RES = 0.01
NODATA = 255


def tile(folder: Path, west: int, south: int, value_seed: int) -> Path:
    """A 1° tile of the job's grid, its own pattern of values (a few nodata)."""
    rng = np.random.default_rng(value_seed)
    data = rng.integers(0, 200, (100, 100), dtype="uint8")
    data[rng.random((100, 100)) < 0.05] = NODATA
    path = folder / f"MOD10A2.Maximum_Snow_Extent.2022-02-02.x{west}y{south}.tif"
    profile = {"driver": "GTiff", "width": 100, "height": 100, "count": 1, "dtype": "uint8", "crs": "EPSG:4326",
               "transform": Affine(RES, 0, west, 0, -RES, south + 1), "nodata": NODATA}
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data, 1)
        dst.units = ("class",)
        dst.update_tags(LAYER="Maximum_Snow_Extent", SOURCES="MOD10A2.A2022033.h09v05.061.2022042050729")
    return path


@pytest.fixture
def tiles(tmp_path: Path) -> list[Path]:
    # three of the four 1° tiles of [-111, 34, -109, 36]: x-110y35 is missing (no data)
    return [tile(tmp_path, w, s, i) for i, (w, s) in enumerate([(-111, 34), (-110, 34), (-111, 35)])]


def manifest(files: list[Path], out: Path, bbox: list[float]) -> dict:
    return {"request": {"region": {"bbox": bbox}}, "tasks": [
        {"task": str(i), "stage": "modis", "product": "MOD10A2", "date": "2022-02-02",
         "files": [f.relative_to(out).as_posix()]} for i, f in enumerate(files)]}


def test_a_mosaic_is_the_tiles_where_they_are_and_nodata_where_none_is(tiles: list[Path], tmp_path: Path) -> None:
    box = [-110.754, 34.5, -109.2, 35.9]  # cuts into every tile; not on the grid's pixel edges
    (entry,) = mosaic.write_regions(tmp_path, manifest(tiles, tmp_path, box))
    assert entry["file"] == "MOD10A2/region/2022-02-02/MOD10A2.Maximum_Snow_Extent.2022-02-02.tif"
    assert entry["tasks"] == ["0", "1", "2"] and entry["layer"] == "Maximum_Snow_Extent"
    with rasterio.open(tmp_path / entry["file"]) as region:
        # the box snapped outwards to whole pixels of the grid
        assert region.bounds == pytest.approx((-110.76, 34.5, -109.2, 35.9))
        assert region.res == pytest.approx((RES, RES)) and region.nodata == NODATA and region.units == ("class",)
        assert region.tags()["LAYER"] == "Maximum_Snow_Extent" and "SOURCES" not in region.tags()
        pixels = region.read(1)
        covered = np.zeros(pixels.shape, bool)
        for path in tiles:
            with rasterio.open(path) as src:
                window = from_bounds(*src.bounds, transform=region.transform).round_offsets().round_lengths()
                top, left = int(window.row_off), int(window.col_off)
                rows = slice(max(top, 0), min(top + 100, pixels.shape[0]))
                cols = slice(max(left, 0), min(left + 100, pixels.shape[1]))
                own = src.read(1)[rows.start - top:rows.stop - top, cols.start - left:cols.stop - left]
                assert own.size and (pixels[rows, cols] == own).all(), path.name  # no seam, no shift
                covered[rows, cols] = True
        assert (~covered).any() and (pixels[~covered] == NODATA).all()  # the missing tile's part


def test_a_region_asked_as_modis_tiles_is_their_union(tiles: list[Path], tmp_path: Path) -> None:
    found = manifest(tiles, tmp_path, [])
    found["request"]["region"] = {"tiles": ["h08v05"]}
    (entry,) = mosaic.write_regions(tmp_path, found)
    with rasterio.open(tmp_path / entry["file"]) as region:
        assert region.bounds == pytest.approx((-111, 34, -109, 36)) and region.shape == (200, 200)


def test_a_large_region_is_a_vrt_over_the_tiles_with_the_same_pixels(
        tiles: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    box = [-110.754, 34.5, -109.2, 35.9]
    (copied,) = mosaic.write_regions(tmp_path, manifest(tiles, tmp_path, box))
    monkeypatch.setattr(mosaic, "MAX_PIXELS", 1000)
    (virtual,) = mosaic.write_regions(tmp_path, manifest(tiles, tmp_path, box))
    assert virtual["file"].endswith(".vrt")
    moved = tmp_path.parent / f"{tmp_path.name}-moved"
    tmp_path.rename(moved)  # relative paths: the folder opens wherever it is
    with rasterio.open(moved / virtual["file"]) as vrt, rasterio.open(moved / copied["file"]) as cog:
        assert vrt.bounds == cog.bounds and vrt.crs == cog.crs and vrt.nodata == NODATA
        np.testing.assert_array_equal(vrt.read(1), cog.read(1))


def fiji_tile(folder: Path, west: float, south: float, seed: int, crs: str = "EPSG:4326", res: float = RES,
              size: int = 100) -> Path:
    """A tile of a grid across ±180° (its own pattern of values, a few nodata)."""
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 200, (size, size), dtype="uint8")
    data[rng.random((size, size)) < 0.05] = NODATA
    path = folder / f"MOD10A2.Maximum_Snow_Extent.2022-02-02.t{seed}.tif"
    profile = {"driver": "GTiff", "width": size, "height": size, "count": 1, "dtype": "uint8", "crs": crs,
               "transform": Affine(res, 0, west, 0, -res, south + size * res), "nodata": NODATA}
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data, 1)
        dst.update_tags(LAYER="Maximum_Snow_Extent")
    return path


def test_a_region_across_the_antimeridian_is_one_mosaic_of_the_region_in_lon_lat(tmp_path: Path) -> None:
    """Fiji's box, 177.5°E to 178.5°W: the 1° tiles of both sides (177…180 and −180…−178)
    make one mosaic over 177.5…181.5 — the region, 400 px wide, not the world between its
    sides — each tile's pixels where it lies, those east of ±180° a turn further east; GDAL
    reads its pixels past 180° as the longitudes east of −180° that they are."""
    wests = [177, 178, 179, -180, -179]
    tiles = [fiji_tile(tmp_path, w, s, i) for i, (w, s) in enumerate((w, s) for w in wests for s in (-18, -17))]
    (entry,) = mosaic.write_regions(tmp_path, manifest(tiles, tmp_path, [177.5, -17.5, -178.5, -16.2]))
    assert entry["file"] == "MOD10A2/region/2022-02-02/MOD10A2.Maximum_Snow_Extent.2022-02-02.tif"
    assert sorted(entry["tasks"], key=int) == [str(i) for i in range(10)]
    with rasterio.open(tmp_path / entry["file"]) as region:
        assert region.crs.to_epsg() == 4326 and region.res == pytest.approx((RES, RES))
        assert region.bounds == pytest.approx((177.5, -17.5, 181.5, -16.2)) and region.shape == (130, 400)
        pixels = region.read(1)
        for path in tiles:
            with rasterio.open(path) as src:
                west, south, east, north = src.bounds
                shift = 360.0 if west < 0 else 0.0
                window = from_bounds(max(west + shift, 177.5), max(south, -17.5), min(east + shift, 181.5),
                                     min(north, -16.2), transform=Affine.translation(shift, 0) * src.transform)
                own = src.read(1, window=window.round_offsets().round_lengths())
                mine = from_bounds(max(west + shift, 177.5), max(south, -17.5), min(east + shift, 181.5),
                                   min(north, -16.2), transform=region.transform).round_offsets().round_lengths()
                rows, cols = mine.toslices()
                assert own.size and (pixels[rows, cols] == own).all(), path.name
        # GDAL takes 181.25 for -178.75: warped to UTM 60S, the mosaic's east part is the east tiles' own warp
        east_tile = tiles[wests.index(-179) * 2 + 1]  # -179…-178, -17…-16
        utm = Affine(1500.0, 0, 880_000, 0, -1500.0, 8_200_000)  # -179.4…-178.6, -16.3…-16.9
        from_mosaic, from_tile = np.full((40, 60), NODATA, "uint8"), np.full((40, 60), NODATA, "uint8")
        reproject(rasterio.band(region, 1), from_mosaic, dst_transform=utm, dst_crs="EPSG:32760",
                  dst_nodata=NODATA, resampling=Resampling.nearest)
        with rasterio.open(east_tile) as src:
            reproject(rasterio.band(src, 1), from_tile, dst_transform=utm, dst_crs="EPSG:32760",
                      dst_nodata=NODATA, resampling=Resampling.nearest)
        seen = from_tile != NODATA
        assert seen.sum() > 500 and (from_mosaic[seen] == from_tile[seen]).all()
    # its STAC item is GeoJSON's: a footprint cut at ±180° into both sides, a box whose west is above its east
    task = {"stage": "mosaic", "product": "MOD10A2", "tile": "region", "date": "2022-02-02", "start": "2022-02-02",
            "end": "2022-02-09", "region": "MOD10A2.2022-02-02"}
    item = stacitems.build_item(task, [tmp_path / entry["file"]], {}, [])
    assert item is not None and item.bbox == pytest.approx([177.5, -17.5, -178.5, -16.2])
    assert item.geometry is not None and item.geometry["type"] == "MultiPolygon"
    sides = sorted(p.bounds for p in shapely.geometry.shape(item.geometry).geoms)
    assert sides == [pytest.approx((-180.0, -17.5, -178.5, -16.2)), pytest.approx((177.5, -17.5, 180.0, -16.2))]
    collection = stacitems.build_collection({"job": "j", "label": "", "state": "SUCCEEDED", "request": {
        "products": ["MOD10A2"], "start": "2022-02-02", "end": "2022-02-09", "region": {}}}, [item])
    assert collection.extent.spatial.bboxes == [pytest.approx([177.5, -17.5, -178.5, -16.2])]


def test_a_region_across_the_antimeridian_in_a_grid_that_cannot_join_it_is_a_mosaic_per_side(tmp_path: Path) -> None:
    """On MODIS's sinusoidal grid a turn is not one length of x: the tiles at either end of
    the grid make a mosaic each, named for the side of ±180° they cover, each as wide as
    its side's tiles."""
    edge = math.pi * targets.RADIUS * math.cos(math.radians(16.75))  # x of ±180° at the tiles' middle
    res, size = 1000.0, 50
    top = -16.0 * math.pi / 180 * targets.RADIUS
    tiles = [fiji_tile(tmp_path, x, top - size * res, i, targets.SINUSOIDAL_PROJ4, res, size)
             for i, x in enumerate([edge - 2 * size * res, edge - size * res, -edge, -edge + size * res])]
    made = mosaic.write_regions(tmp_path, manifest(tiles, tmp_path, [179.0, -17.0, -179.0, -16.0]))
    assert [m["file"].rsplit("/", 1)[1] for m in made] == ["MOD10A2.Maximum_Snow_Extent.2022-02-02.west.tif",
                                                          "MOD10A2.Maximum_Snow_Extent.2022-02-02.east.tif"]
    assert [sorted(m["tasks"]) for m in made] == [["0", "1"], ["2", "3"]]
    # a turn is one length of x in lon/lat (in its unit) and in Mercator; not in MODIS's grid, nor in UTM
    assert mosaic.turn(CRS.from_epsg(4326)) == pytest.approx(360) and mosaic.turn(CRS.from_epsg(3857)) == pytest.approx(
        2 * 20_037_508.34, rel=1e-6)
    assert mosaic.turn(CRS.from_user_input(targets.SINUSOIDAL_PROJ4)) is None and mosaic.turn(
        CRS.from_epsg(32760)) is None
    for entry, side in zip(made, (tiles[:2], tiles[2:]), strict=True):
        with rasterio.open(tmp_path / entry["file"]) as region:
            assert region.width <= 2 * size and region.height <= size
            assert mosaic.union(side)[0] <= region.bounds.left and region.bounds.right <= mosaic.union(side)[2]
