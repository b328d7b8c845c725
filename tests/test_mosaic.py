"""Region mosaics: equal to the tiles where they overlap them (no seams), nodata where no tile
is, cut to the requested box snapped to the grid; a VRT over the tiles when large."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio
from affine import Affine
from rasterio.windows import from_bounds

from pipeline.modis import mosaic

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
