"""Reprojection on real MODIS data: the same pixels as GDAL's own warper (``rio warp``), no
seam across a tile border, a valid COG that says what it is; source verification."""

from __future__ import annotations

import subprocess
import sys
from datetime import date
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.io import MemoryFile
from rio_cogeo.cogeo import cog_validate

from bagpipe.feedserver import REAL_DATA, synthesize
from pipeline.collection import verify
from pipeline.failures import FailureClass, StageFailure
from pipeline.feeds import Fetched
from pipeline.reprojection import Target, cache_key, warp
from pipeline.transfer import md5_of

SNOW = REAL_DATA / "MOD10A2.A2022033.h09v05.061.2022042050729_Maximum_Snow_Extent.tif"
RIO = str(Path(sys.executable).with_name("rio"))


def opened(data: bytes) -> tuple[np.ndarray, rasterio.DatasetReader]:
    memory = MemoryFile(data)
    raster = memory.open()
    return raster.read(1), raster


@pytest.mark.parametrize(("crs", "bounds", "res"), [
    ("EPSG:4326", (-110.0, 35.0, -109.0, 36.0), 0.005),
    ("EPSG:4326", (-106.3, 31.2, -104.8, 33.9), 0.0123),
    ("EPSG:5070", (-1_000_000.0, 1_400_000.0, -900_000.0, 1_500_000.0), 500.0),  # CONUS Albers
])
def test_nearest_matches_rio_warp_exactly(tmp_path: Path, crs: str, bounds: tuple, res: float) -> None:
    ours, raster = opened(warp([SNOW], Target(crs, bounds, res, "nearest")))
    theirs_path = tmp_path / "rio.tif"
    subprocess.run([RIO, "warp", str(SNOW), str(theirs_path), "--dst-crs", crs, "--res", str(res),
                    "--bounds", *map(str, bounds), "--resampling", "nearest", "--overwrite"],
                   check=True, capture_output=True)
    with rasterio.open(theirs_path) as theirs:
        assert raster.transform.almost_equals(theirs.transform)
        assert raster.crs == theirs.crs
        expected = theirs.read(1)
    assert ours.shape == expected.shape
    assert np.array_equal(ours, expected)
    assert len(np.unique(ours)) > 1  # real content, not all fill


def test_output_is_a_cog_that_carries_its_encoding_and_sources(tmp_path: Path) -> None:
    data = warp([SNOW], Target("EPSG:4326", (-110.0, 35.0, -108.0, 37.0), 0.002, "nearest"), tags={"DATE": "x"})
    path = tmp_path / "tile.tif"
    path.write_bytes(data)
    valid, errors, _ = cog_validate(str(path), quiet=True)
    assert valid, errors
    with rasterio.open(path) as raster:
        assert raster.nodata == 255 and raster.dtypes[0] == "uint8" and raster.scales == (1.0,)
        assert raster.tags()["SOURCES"] == SNOW.name and raster.tags()["DATE"] == "x"
        assert raster.overviews(1)  # a 1000-pixel tile gets overviews


def test_a_mosaic_across_a_tile_border_has_no_seam(tmp_path: Path) -> None:
    day = date(2022, 2, 2)
    west = tmp_path / "h08v05.tif"
    west.write_bytes(synthesize("MOD10A2", "h08v05", day))
    east = SNOW  # the real h09v05 granule of that date
    target = Target("EPSG:4326", (-110.5, 34.5, -109.5, 35.5), 0.005, "nearest")  # the border is at -109.87°
    both, _ = opened(warp([west, east], target))
    alone_w, _ = opened(warp([west], target))
    alone_e, _ = opened(warp([east], target))
    fill = 255
    assert (alone_w != fill).any() and (alone_e != fill).any(), "the target straddles the border"
    assert not (both == fill).any(), "every target pixel is covered by one source or the other"
    # where a single source covers a pixel, the mosaic shows that source's pixel
    assert np.array_equal(both[alone_w != fill], alone_w[alone_w != fill])
    assert np.array_equal(both[alone_e != fill], alone_e[alone_e != fill])


def test_bilinear_keeps_nodata_out_of_valid_pixels(tmp_path: Path) -> None:
    path = tmp_path / "ndvi.tif"
    path.write_bytes(synthesize("MOD13A1", "h09v05", date(2022, 3, 22)))
    out, raster = opened(warp([path], Target("EPSG:4326", (-100.0, 30.0, -99.0, 31.0), 0.01, "bilinear")))
    assert raster.nodata == -3000 and raster.scales == (0.0001,)
    valid = out[out != -3000]
    assert valid.size and valid.min() >= -2000 and valid.max() <= 10000


def test_cache_key_names_everything_the_output_depends_on() -> None:
    target = Target("EPSG:4326", (-110.0, 35.0, -109.0, 36.0), 0.005, "nearest")
    key = cache_key(target, "MOD10A2", "Maximum_Snow_Extent", ["a", "b"])
    assert key == cache_key(target, "MOD10A2", "Maximum_Snow_Extent", ["b", "a"])
    assert key != cache_key(target, "MOD10A2", "Maximum_Snow_Extent", ["a", "c"])
    assert key != cache_key(Target("EPSG:4326", target.bounds, 0.01, "nearest"), "MOD10A2",
                            "Maximum_Snow_Extent", ["a", "b"])
    assert key != cache_key(Target("EPSG:4326", target.bounds, 0.005, "bilinear"), "MOD10A2",
                            "Maximum_Snow_Extent", ["a", "b"])


def test_verify_accepts_the_real_granule_and_rejects_broken_ones() -> None:
    real = SNOW.read_bytes()
    assert verify(Fetched("u", real, len(real), md5_of(real)), "MOD10A2") == real
    cases = [
        (Fetched("u", real[: len(real) // 2], len(real)), FailureClass.SOURCE_DOWNLOAD, "bytes arrived"),
        (Fetched("u", real, None, md5_of(b"other")), FailureClass.SOURCE_DOWNLOAD, "MD5"),
        (Fetched("u", real[: len(real) // 2]), FailureClass.BAD_SOURCE, "GDAL"),  # truncated, no length given
        (Fetched("u", b"<html>not found</html>"), FailureClass.BAD_SOURCE, "GDAL"),
        (Fetched("u", real), FailureClass.BAD_SOURCE, "data type"),  # a uint8 file is not MOD13A1's int16
    ]
    for (fetched, failure, words), product in zip(cases, ["MOD10A2"] * 4 + ["MOD13A1"], strict=True):
        with pytest.raises(StageFailure, match=words) as caught:
            verify(fetched, product)
        assert caught.value.failure is failure
    lonlat = warp([SNOW], Target("EPSG:4326", (-110.0, 35.0, -109.0, 36.0), 0.005, "nearest"))
    with pytest.raises(StageFailure, match="sinusoidal") as caught:
        verify(Fetched("u", lonlat), "MOD10A2")
    assert caught.value.failure is FailureClass.BAD_SOURCE
