"""Reprojection on real MODIS data: the same pixels as GDAL's own warper (``rio warp``), the
HDF4 granule read as its GeoTIFF export, no seam across a tile border, a valid COG in the
catalog's encoding (not the file's), valid-range and quality masks; source verification."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from datetime import date
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.io import MemoryFile
from rio_cogeo.cogeo import cog_validate

from bagpipe import modis_world as world
from pipeline.failures import FailureClass, StageFailure
from pipeline.modis import quality, tilestage
from pipeline.modis.access import Fetched
from pipeline.modis.collection import verify
from pipeline.modis.granules import HDF
from pipeline.modis.hdf import Granule
from pipeline.modis.products import CATALOG
from pipeline.modis.reprojection import EncodingMismatch, Source, Target, cache_key, warp
from pipeline.storage.transfer import md5_of

REAL = world.REAL_DATA
NAME = "MOD10A2.A2022033.h09v05.061.2022042050729"
SNOW = REAL / f"{NAME}_Maximum_Snow_Extent.tif"
HDF_FILE = REAL / f"{NAME}.hdf"
MOD10A2, MOD13A1 = CATALOG["MOD10A2"], CATALOG["MOD13A1"]
RIO = str(Path(sys.executable).with_name("rio"))


def opened(data: bytes) -> tuple[np.ndarray, rasterio.DatasetReader]:
    memory = MemoryFile(data)
    raster = memory.open()
    return raster.read(1), raster


def snow(*paths: Path) -> list[Source]:
    return [Source(p.stem, {"Maximum_Snow_Extent": p}) for p in paths]


@pytest.mark.parametrize(("crs", "bounds", "res"), [
    ("EPSG:4326", (-110.0, 35.0, -109.0, 36.0), 0.005),
    ("EPSG:4326", (-106.3, 31.2, -104.8, 33.9), 0.0123),
    ("EPSG:5070", (-1_000_000.0, 1_400_000.0, -900_000.0, 1_500_000.0), 500.0),  # CONUS Albers
])
def test_nearest_matches_rio_warp_exactly_from_the_geotiff_and_from_the_hdf4(
        tmp_path: Path, crs: str, bounds: tuple, res: float) -> None:
    target = Target(crs, bounds, res, "nearest")
    ours, raster = opened(warp(snow(SNOW), MOD10A2, "Maximum_Snow_Extent", target))
    from_hdf, _ = opened(warp([Source(NAME, {HDF: HDF_FILE})], MOD10A2, "Maximum_Snow_Extent", target))
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
    assert np.array_equal(from_hdf, expected)
    assert len(np.unique(ours)) > 1  # real content, not all fill


@pytest.mark.parametrize("layer", ["Maximum_Snow_Extent", "Eight_Day_Snow_Cover"])
def test_the_hdf4_layer_is_the_geotiff_layer_pixel_for_pixel_and_placed_the_same(layer: str) -> None:
    with Granule(HDF_FILE) as granule, rasterio.open(REAL / f"{NAME}_{layer}.tif") as tif:
        assert np.array_equal(granule.read(layer), tif.read(1))
        grid = granule.grid_of(layer)
        assert grid.transform.almost_equals(tif.transform, precision=1e-9)
        assert (grid.width, grid.height) == (tif.width, tif.height)
        assert rasterio.crs.CRS.from_proj4(grid.crs) == tif.crs
        assert np.array_equal(granule.read(layer, (100, 200, 30, 40)), tif.read(1)[100:130, 200:240])


def test_output_is_a_cog_that_carries_the_catalogs_encoding_and_its_granules(tmp_path: Path) -> None:
    data = warp(snow(SNOW), MOD10A2, "Maximum_Snow_Extent",
                Target("EPSG:4326", (-110.0, 35.0, -108.0, 37.0), 0.002, "nearest"), tags={"DATE": "x"})
    path = tmp_path / "tile.tif"
    path.write_bytes(data)
    valid, errors, _ = cog_validate(str(path), quiet=True)
    assert valid, errors
    with rasterio.open(path) as raster:
        assert raster.nodata == 255 and raster.dtypes[0] == "uint8" and raster.scales == (1.0,)
        assert raster.tags()["SOURCES"] == SNOW.stem and raster.tags()["DATE"] == "x"
        assert raster.tags()["LAYER"] == "Maximum_Snow_Extent" and raster.descriptions == ("Maximum_Snow_Extent",)
        assert raster.overviews(1)  # a 1000-pixel tile gets overviews


def test_the_mod13a1_crop_comes_out_with_the_catalogs_scale_not_its_divisor() -> None:
    crop = REAL / "MOD13A1.A2022081.h09v05.006.2022101145817_BR_B06_cropped.TIF"
    layer = "500m_16_days_blue_reflectance"
    with rasterio.open(crop) as raster:
        assert raster.scales == (10000.0,)  # HDF's divide-by convention, carried into the crop
        stored = raster.read(1)
        west, south, east, north = raster.bounds
    out, made = opened(warp([Source(crop.stem, {layer: crop})], MOD13A1, layer,
                            Target(str(raster.crs.to_wkt()), (west, south, east, north), raster.res[0], "nearest"),
                            masks=False))
    assert made.scales == (0.0001,) and made.nodata == -1000 and made.dtypes[0] == "int16"
    assert np.array_equal(out, np.where((stored >= 0) & (stored <= 10000), stored, -1000))
    assert np.allclose(out[out != -1000] * made.scales[0], stored[out != -1000] / 10000)


def test_a_scale_the_catalog_does_not_know_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "wrong.tif"
    with rasterio.open(SNOW) as src:
        profile = src.profile
        data = src.read(1)
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(data, 1)
        dst.scales = (0.5,)
    with pytest.raises(EncodingMismatch, match=r"scale 0\.5"):
        warp(snow(path), MOD10A2, "Maximum_Snow_Extent", Target("EPSG:4326", (-110.0, 35.0, -109.0, 36.0), 0.01))


def test_values_outside_the_valid_range_are_masked_before_the_warp(tmp_path: Path) -> None:
    """MOD13A1 NDVI: valid -2000..10000, fill -3000; a stored 12000 or -2500 is no data."""
    layer = MOD13A1.layer("500m_16_days_NDVI")
    transform = rasterio.transform.from_origin(-10007554.677, 4447802.078667, 463.3127165279165, 463.3127165279167)
    stored = np.full((20, 20), 5000, dtype="int16")
    stored[:5] = 12000
    stored[5:10] = -2500
    stored[10:12] = -3000
    path = tmp_path / "ndvi.tif"
    with rasterio.open(path, "w", driver="GTiff", width=20, height=20, count=1, dtype="int16",
                       crs=world.sinusoidal(), transform=transform, nodata=-3000) as dst:
        dst.write(stored, 1)
    bounds = rasterio.transform.array_bounds(20, 20, transform)
    out, made = opened(warp([Source("g", {layer.name: path})], MOD13A1, layer.name,
                            Target(world.sinusoidal().to_wkt(), bounds,
                                   463.3127165279165, "nearest"), masks=False))
    assert made.nodata == -3000
    assert (out[:12] == -3000).all() and (out[12:] == 5000).all()


def test_quality_bits_decode_as_the_user_guides_say() -> None:
    # MOD13 VI Quality 2116 = 0b0000100001000100: VI good, usefulness 1 (lower quality),
    # low aerosol, no adjacent cloud, land
    vi = quality.decode("500m_16_days_VI_Quality", np.array([2116]))
    assert {k: int(v[0]) for k, v in vi.items()} == {
        "modland_qa": 0, "vi_usefulness": 1, "aerosol_quantity": 1, "adjacent_cloud": 0,
        "atmosphere_brdf_correction": 0, "mixed_clouds": 0, "land_water": 1, "possible_snow_ice": 0,
        "possible_shadow": 0}
    assert int(quality.decode("500m_16_days_VI_Quality", np.array([0b0011100000000010]))["land_water"][0]) == 7
    # MOD11 QC 65 = 0b01000001: LST produced, other quality; LST error <= 2 K
    qc = quality.decode("QC_Day", np.array([0, 65, 129, 2, 3], dtype="uint8"))
    assert qc["mandatory_qa"].tolist() == [0, 1, 1, 2, 3] and qc["lst_error"].tolist() == [0, 1, 2, 0, 0]
    assert quality.usable("QC_Day", np.array([0, 65, 129, 2, 3], dtype="uint8")).tolist() == [
        True, True, False, False, False]
    rank = np.array([-1, 0, 1, 2, 3], dtype="int8")
    assert quality.usable("500m_16_days_pixel_reliability", rank).tolist() == [False, True, True, False, False]
    assert quality.usable("BRDF_Albedo_Band_Mandatory_Quality_Band1", np.array([0, 1, 255])).tolist() == [
        True, False, False]


def test_quality_layers_mask_at_native_resolution_and_quality_layers_are_nearest(tmp_path: Path) -> None:
    """A synthesized MOD13A1 granule as NASA writes it: NDVI is masked wherever its pixel
    reliability is 2 or 3, before the warp; the reliability layer itself warps nearest."""
    name = world.granule_name(MOD13A1, "h09v05", date(2022, 2, 2))
    path = tmp_path / f"{name}.hdf"
    path.write_bytes(world.hdf4(name))
    source = Source(name, {HDF: path})
    with Granule(path) as granule:
        transform = granule.grid_of("500m_16_days_NDVI").transform
        x0, y1 = transform * (0, 0)
        x1, y0 = transform * (240, 240)
    target = Target(world.sinusoidal().to_wkt(), (x0, y0, x1, y1), transform.a, "nearest")
    ndvi, made = opened(warp([source], MOD13A1, "500m_16_days_NDVI", target))
    raw, _ = opened(warp([source], MOD13A1, "500m_16_days_NDVI", target, masks=False))
    rank, ranks = opened(warp([source], MOD13A1, "500m_16_days_pixel_reliability", target))
    assert made.tags()["QUALITY_MASK"] == "500m_16_days_pixel_reliability" and made.scales == (0.0001,)
    bad = (rank == 2) | (rank == 3)
    assert bad.any() and (~bad).any()
    assert (ndvi[bad] == -3000).all() and np.array_equal(ndvi[~bad], raw[~bad])
    assert set(np.unique(rank)) <= {0, 1, 2, 3} and ranks.tags()["RESAMPLING"] == "nearest"


def test_the_tile_stage_warps_class_and_quality_layers_nearest_and_continuous_ones_bilinear(tmp_path: Path) -> None:
    """A quality code or a class is never interpolated: the tile stage's target for each
    layer resamples as the catalog says, and on a grid that is not the source's, nearest and
    bilinear make different pixels of the reliability layer."""
    params = {"product": "MOD13A1", "crs": "EPSG:4326", "bounds": "-100.0,30.0,-99.0,31.0", "res": "0.01"}
    reliability = "500m_16_days_pixel_reliability"
    kinds = {name: tilestage.target_of(params, name).resampling
             for name in (reliability, "500m_16_days_VI_Quality", "500m_16_days_NDVI", "500m_16_days_red_reflectance")}
    assert kinds == {reliability: "nearest", "500m_16_days_VI_Quality": "nearest", "500m_16_days_NDVI": "bilinear",
                     "500m_16_days_red_reflectance": "bilinear"}
    name = world.granule_name(MOD13A1, "h09v05", date(2022, 2, 2))
    path = tmp_path / f"{name}_{reliability}.tif"  # as Planetary Computer keeps it
    path.write_bytes(world.cog(name, reliability))
    source = [Source(name, {reliability: path})]
    target = tilestage.target_of(params, reliability)
    as_staged, _ = opened(warp(source, MOD13A1, reliability, target))
    nearest, _ = opened(warp(source, MOD13A1, reliability, replace(target, resampling="nearest")))
    bilinear, _ = opened(warp(source, MOD13A1, reliability, replace(target, resampling="bilinear")))
    assert np.array_equal(as_staged, nearest) and not np.array_equal(bilinear, nearest)


def test_a_mosaic_across_a_tile_border_has_no_seam(tmp_path: Path) -> None:
    day = date(2022, 2, 2)
    west = tmp_path / "h08v05.tif"
    west.write_bytes(world.cog(world.granule_name(MOD10A2, "h08v05", day), "Maximum_Snow_Extent"))
    target = Target("EPSG:4326", (-110.5, 34.5, -109.5, 35.5), 0.005, "nearest")  # the border is at -109.87°
    both, _ = opened(warp(snow(west, SNOW), MOD10A2, "Maximum_Snow_Extent", target))
    alone_w, _ = opened(warp(snow(west), MOD10A2, "Maximum_Snow_Extent", target))
    alone_e, _ = opened(warp(snow(SNOW), MOD10A2, "Maximum_Snow_Extent", target))
    fill = 255
    assert (alone_w != fill).any() and (alone_e != fill).any(), "the target straddles the border"
    assert not (both == fill).any(), "every target pixel is covered by one source or the other"
    assert np.array_equal(both[alone_w != fill], alone_w[alone_w != fill])
    assert np.array_equal(both[alone_e != fill], alone_e[alone_e != fill])


def test_bilinear_keeps_nodata_out_of_valid_pixels(tmp_path: Path) -> None:
    name = world.granule_name(MOD13A1, "h09v05", date(2022, 3, 22))
    path = tmp_path / f"{name}.hdf"
    path.write_bytes(world.hdf4(name))
    out, raster = opened(warp([Source(name, {HDF: path})], MOD13A1, "500m_16_days_NDVI",
                              Target("EPSG:4326", (-100.0, 30.0, -99.0, 31.0), 0.01, "bilinear")))
    assert raster.nodata == -3000 and raster.scales == (0.0001,) and raster.units == ("NDVI",)
    valid = out[out != -3000]
    assert valid.size and valid.min() >= -2000 and valid.max() <= 10000


def test_cache_key_names_everything_the_output_depends_on() -> None:
    target = Target("EPSG:4326", (-110.0, 35.0, -109.0, 36.0), 0.005, "nearest")
    key = cache_key(target, "MOD10A2", "Maximum_Snow_Extent", ["a", "b"])
    assert key == cache_key(target, "MOD10A2", "Maximum_Snow_Extent", ["b", "a"])
    assert key != cache_key(target, "MOD10A2", "Maximum_Snow_Extent", ["a", "c"])
    assert key != cache_key(target, "MOD10A2", "Eight_Day_Snow_Cover", ["a", "b"])
    assert key != cache_key(target, "MOD10A2", "Maximum_Snow_Extent", ["a", "b"], masks=False)
    assert key != cache_key(Target("EPSG:4326", target.bounds, 0.01, "nearest"), "MOD10A2",
                            "Maximum_Snow_Extent", ["a", "b"])


def test_verify_accepts_the_real_granule_and_rejects_broken_ones() -> None:
    real, layers = SNOW.read_bytes(), ["Maximum_Snow_Extent"]
    assert verify(Fetched("u", real, len(real), md5_of(real)), MOD10A2, layers) == real
    hdf4 = HDF_FILE.read_bytes()
    assert verify(Fetched("u", hdf4, len(hdf4)), MOD10A2, ["Maximum_Snow_Extent", "Eight_Day_Snow_Cover"]) == hdf4
    cases = [
        (Fetched("u", real[: len(real) // 2], len(real)), MOD10A2, FailureClass.SOURCE_DOWNLOAD, "bytes arrived"),
        (Fetched("u", real, None, md5_of(b"other")), MOD10A2, FailureClass.SOURCE_DOWNLOAD, "MD5"),
        (Fetched("u", real[: len(real) // 2]), MOD10A2, FailureClass.BAD_SOURCE, "GDAL"),  # truncated, no length
        (Fetched("u", b"<html>not found</html>"), MOD10A2, FailureClass.BAD_SOURCE, "GDAL"),
        (Fetched("u", hdf4[: len(hdf4) // 3]), MOD10A2, FailureClass.BAD_SOURCE, "HDF4"),
    ]
    for fetched, product, failure, words in cases:
        with pytest.raises(StageFailure, match=words) as caught:
            verify(fetched, product, layers)
        assert caught.value.failure is failure
    with pytest.raises(StageFailure, match="int16") as caught:  # a uint8 file is not NDVI's int16
        verify(Fetched("u", real), MOD13A1, ["500m_16_days_NDVI"])
    lonlat = warp(snow(SNOW), MOD10A2, "Maximum_Snow_Extent",
                  Target("EPSG:4326", (-110.0, 35.0, -109.0, 36.0), 0.005, "nearest"))
    with pytest.raises(StageFailure, match="sinusoidal") as caught:
        verify(Fetched("u", lonlat), MOD10A2, layers)
    assert caught.value.failure is FailureClass.BAD_SOURCE


SAID = """
import warnings
from pathlib import Path

import numpy as np
import rasterio
import rasterio.warp
from rasterio.errors import NotGeoreferencedWarning

import pipeline.modis  # noqa: F401

# as rasterio's warp of arrays in threads lets it through now and then (its pixels the same)
warnings.warn_explicit("Dataset has no geotransform, gcps, or rpcs. The identity matrix will be returned.",
                       NotGeoreferencedWarning, rasterio.warp.__file__, 387, module="rasterio.warp")
path = Path({folder!r}) / "plain.tif"  # a file with no transform, written and read: the warning is true
with rasterio.open(path, "w", driver="GTiff", width=4, height=4, count=1, dtype="uint8") as out:
    out.write(np.zeros((1, 4, 4), np.uint8))
with rasterio.open(path) as raster:
    raster.read(1)
"""


def test_only_a_true_no_geotransform_warning_is_said(tmp_path: Path) -> None:
    """The warning rasterio's warps in threads raise now and then with both transforms given
    is not said (a scientist would read it as misplaced pixels); the same warning on
    opening a file that has no transform still is."""
    ran = subprocess.run([sys.executable, "-W", "always", "-c", SAID.format(folder=str(tmp_path))],
                         capture_output=True, text=True, timeout=120, check=True)
    said = [line for line in ran.stderr.splitlines() if "NotGeoreferencedWarning" in line]
    assert said and not [line for line in said if "rasterio/warp.py" in line], ran.stderr
