"""The local stack's world (bagpipe/modis_world.py, bagpipe/earth.py, bagpipe/coastlines.py):
the sea is no data in every product, neighbouring tiles join without a seam, temperature,
vegetation, snow, clouds and fire behave as the planet's do, the quality layers mask the
clouds; the real MOD13A2 series is served as it is, through NASA, to a Planetary Computer
deployment too; every synthesized granule says so and no real one does; granules are full
size, COGs tiled and compressed as Planetary Computer's."""

from __future__ import annotations

import math
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import date, timedelta
from functools import lru_cache
from pathlib import Path

import numpy as np
import pystac_client
import pytest
import shapely
from pyhdf.SD import SD, SDC
from rasterio.io import MemoryFile

from bagpipe import coastlines, earth
from bagpipe import modis_world as world
from bagpipe.earthdata import Earthdata
from bagpipe.planetary import Planetary
from pipeline.modis import hdf, quality, tilestage
from pipeline.modis.access import Access
from pipeline.modis.cmr import CmrCatalog
from pipeline.modis.granules import HDF, from_param
from pipeline.modis.grid import RADIUS, TILE_SIZE, X_MIN, Y_MAX
from pipeline.modis.products import CATALOG, Product, periods
from pipeline.modis.reprojection import Source, warp
from pipeline.modis.stac import StacCatalog
from pipeline.modis.synthetic import SYNTHETIC, is_synthetic
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from tests.conftest import on_stac
from tests.test_tilestage import params_for, run, tile_of

SERIES = sorted((world.REAL_DATA / "MOD13A2_h18v09_2025").glob("*.hdf"))
# the sea: the open Pacific (a tile with islands on it), off California, the Gulf of Guinea
SEA = [(-150.0, 10.0), (-121.5, 34.8), (5.0, -2.0)]


def pixel_of(lon: float, lat: float, pixels: int) -> tuple[str, int, int]:
    """The MODIS tile, row and column of a lon/lat on a grid of ``pixels`` a tile side."""
    x, y = RADIUS * math.radians(lon) * math.cos(math.radians(lat)), RADIUS * math.radians(lat)
    h, v = int((x - X_MIN) // TILE_SIZE), int((Y_MAX - y) // TILE_SIZE)
    size = TILE_SIZE / pixels
    return f"h{h:02d}v{v:02d}", int((Y_MAX - v * TILE_SIZE - y) // size), int((x - X_MIN - h * TILE_SIZE) // size)


def stored(product: str, layer: str, tile: str, day: date, window: world.Window | None = None) -> np.ndarray:
    """A synthesized layer as the world stores it: the whole tile, or a window of it (only
    the blocks it touches made: the same pixels, as the window test checks); the last few
    kept."""
    rows, cols = window or np.s_[:, :]
    return _stored(product, layer, tile, day, (rows.start, rows.stop), (cols.start, cols.stop))


@lru_cache(maxsize=16)
def _stored(product: str, layer: str, tile: str, day: date, rows: tuple[int | None, int | None],
            cols: tuple[int | None, int | None]) -> np.ndarray:
    return world.values(CATALOG[product], CATALOG[product].layer(layer), tile, day,
                        np.s_[rows[0]:rows[1], cols[0]:cols[1]])


def readable(product: Product, layer_name: str, tile: str, day: date, masks: bool = True,
             window: world.Window | None = None) -> np.ndarray:
    """Where bagpipe reads a value of a synthesized layer: within the valid range, not the
    fill value and (``masks``) where its quality layer says usable."""
    layer = product.layer(layer_name)
    values = stored(product.name, layer.name, tile, day, window)
    good = (values >= layer.valid[0]) & (values <= layer.valid[1])
    if layer.nodata is not None:
        good &= values != layer.nodata
    if masks and layer.masked_by:
        good &= quality.usable(layer.masked_by, stored(product.name, layer.masked_by, tile, day, window))
    return good


def decoded(product: Product, layer_name: str, tile: str, day: date, masks: bool = True,
            window: world.Window | None = None) -> np.ndarray:
    """A synthesized layer's physical values as bagpipe reads them: NaN where it reads none
    (:func:`readable`)."""
    layer = product.layer(layer_name)
    values = stored(product.name, layer.name, tile, day, window)
    return np.where(readable(product, layer_name, tile, day, masks, window),
                    values.astype(float) * layer.scale + layer.offset, np.nan)


def first_period(product: Product, day: date) -> date:
    return periods(product, day, day)[0]


# synthesizing a whole tile of each product is CPU-bound: when it made three, a 250 m
# product's took over the default 300 s from a cold cache at load 25
@pytest.mark.timeout(900)
@pytest.mark.parametrize("short", sorted(CATALOG))
def test_the_sea_is_no_data_in_every_product(short: str) -> None:
    """Over the open Pacific, off California and in the Gulf of Guinea, a product's default
    layer is no data (land cover: water), and so near the coast, to the pixel."""
    product = CATALOG[short]
    day = first_period(product, date(2022, 7, 10))
    for lon, lat in SEA:
        tile, row, col = pixel_of(lon, lat, product.pixels)
        here = np.s_[row:row + 1, col:col + 1]
        assert world.exists(product, tile, day), (tile, "a tile with land, so with granules")
        if short == "MCD12Q1":
            assert stored(short, "LC_Type1", tile, day, here)[0, 0] == earth.WATER
            assert stored(short, "LW", tile, day, here)[0, 0] == 1
        elif short.endswith("10A2"):
            assert stored(short, "Maximum_Snow_Extent", tile, day, here)[0, 0] == 39  # ocean
        else:
            assert not readable(product, product.default.name, tile, day, window=here)[0, 0], (lon, lat)
    tile, _, _ = pixel_of(*SEA[1], product.pixels)  # California: land within two pixels of the sea, as Natural Earth
    land = coastlines.land_mask(tile, product.pixels)
    if short not in ("MCD12Q1",) and not short.endswith("10A2"):
        read = readable(product, product.default.name, tile, day, masks=False)
        assert not read[~land].any() and read[land].any()


def test_the_coastline_is_the_real_one() -> None:
    """The world's land on h18v09 at 1 km is NASA's (the real MOD13A2: NDVI not fill), but
    for a few pixels along the coast; the real MCD12Q1 of the central Pacific (h00v08) is
    water where the world's is."""
    sd = SD(str(SERIES[0]), SDC.READ)
    real = sd.select("1 km 16 days NDVI").get() != -3000
    ours = coastlines.land_mask("h18v09", 1200)
    assert (real & ours).sum() / (real | ours).sum() > 0.9
    cover = SD(str(world.REAL_DATA / "MCD12Q1.A2001001.h00v08.006.2018142182903.hdf"), SDC.READ)
    water = cover.select("LW").get() == 1
    assert water.mean() > 0.9 and not coastlines.land_mask("h00v08", 2400)[water].any()


def test_a_pixel_is_land_where_its_centre_is() -> None:
    """Along California's coast (h08v05, 500 m), a pixel is land exactly where its centre lies
    inside Natural Earth's land, as a point-in-polygon test in lon/lat says (but for a pixel
    or two whose centre is within metres of the line)."""
    mask = coastlines.land_mask("h08v05", 2400)
    coast = np.zeros_like(mask)
    coast[1:-1, 1:-1] = (mask[1:-1, 1:-1] != mask[:-2, 1:-1]) | (mask[1:-1, 1:-1] != mask[1:-1, 2:])
    coast |= np.roll(coast, 1, axis=0) | np.roll(coast, 1, axis=1)  # both sides of the line
    rows, cols = np.nonzero(coast)
    assert rows.size > 2000
    size = TILE_SIZE / 2400
    x = X_MIN + 8 * TILE_SIZE + (cols + 0.5) * size
    y = Y_MAX - 5 * TILE_SIZE - (rows + 0.5) * size
    lat = np.degrees(y / RADIUS)
    lon = np.degrees(x / (RADIUS * np.cos(np.radians(lat))))
    shapes, index = coastlines.polygons()
    land = shapely.union_all([shapes[i] for i in index.query(shapely.box(lon.min(), lat.min(), lon.max(),
                                                                             lat.max()))])
    inside = shapely.contains_xy(land, lon, lat)
    assert (inside != mask[rows, cols]).sum() <= 2


def test_ndvi_and_evi_differ_and_the_reflectances_give_the_ndvi() -> None:
    """MOD13A1's layers: EVI below NDVI where there are plants, and (NIR - red) / (NIR + red)
    of its own reflectance layers is its NDVI, to the encoding's rounding."""
    product, day = CATALOG["MOD13A1"], date(2022, 6, 26)
    ndvi, evi = (decoded(product, f"500m_16_days_{k}", "h18v04", day, masks=False) for k in ("NDVI", "EVI"))
    red, nir = (decoded(product, f"500m_16_days_{k}_reflectance", "h18v04", day, masks=False) for k in ("red", "NIR"))
    plants = ndvi > 0.3
    assert plants.mean() > 0.2 and (evi[plants] < ndvi[plants]).all()
    assert np.corrcoef(ndvi[plants], evi[plants])[0, 1] > 0.8
    land = ~np.isnan(ndvi)
    assert np.nanmax(np.abs((nir - red) / (nir + red) - ndvi)[land]) < 0.002


@pytest.mark.parametrize(("short", "layer"), [("MOD13A1", "500m_16_days_NDVI"), ("MOD11A1", "LST_Day_1km"),
                                              ("MOD09A1", "sur_refl_b02"), ("MOD15A2H", "Lai_500m"),
                                              ("MOD13Q1", "250m_16_days_EVI")])
def test_neighbouring_tiles_agree_along_their_shared_edge(short: str, layer: str) -> None:
    """Across the edge between h18v04 and h19v04 (and between h18v03 and h18v04), decoded
    values step no more than between two neighbouring columns (rows) inside a tile: the field
    is sampled at each pixel's place, whatever its tile."""
    product = CATALOG[short]
    day = first_period(product, date(2022, 5, 12))
    last = product.pixels - 1

    def edge(tile: str, window: world.Window) -> np.ndarray:
        return decoded(product, layer, tile, day, masks=False, window=window)

    # h18v04's last two columns and first two rows, h19v04's first column, h18v03's last row
    west, top, east, north = (edge("h18v04", np.s_[:, last - 1:]), edge("h18v04", np.s_[:2, :]),
                              edge("h19v04", np.s_[:, :1]), edge("h18v03", np.s_[last:, :]))
    for across, inside in ((east[:, 0] - west[:, -1], west[:, -1] - west[:, -2]),
                           (top[0, :] - north[-1, :], top[1, :] - top[0, :])):
        both = ~np.isnan(across) & ~np.isnan(inside)
        assert both.sum() > product.pixels // 4, "the edge has land on both sides"
        seam, within = np.abs(across[both]), np.abs(inside[both])
        step = 2 * product.layer(layer).scale  # two steps of the encoding
        assert np.median(seam) <= 2 * np.median(within) + step, (np.median(seam), np.median(within))
        assert np.quantile(seam, 0.99) <= 2 * np.quantile(within, 0.99) + step


@pytest.mark.parametrize(("tile", "hemisphere"), [("h18v01", 1), ("h18v04", 1), ("h19v08", 1), ("h19v11", -1),
                                                  ("h12v12", -1), ("h16v02", 1)])
def test_temperature_and_vegetation_stay_physical_through_a_year(tile: str, hemisphere: int) -> None:
    """Every week of a year: land surface temperature within 240-330 K, day warmer than
    night; NDVI within -0.2..1 and EVI lower where there are plants, the two correlated over
    the year."""
    vegetated = []
    for doy in range(1, 366, 7):
        scene = earth.Scene(tile, 1200, date(2022, 1, 1) + timedelta(days=doy - 1), "terra")
        day, night = scene.surface_temperature(True), scene.surface_temperature(False)
        assert day.min() >= 240 and day.max() <= 330 and night.min() >= 240 and night.max() <= 330
        assert (day >= night).all() and day.mean() > night.mean()
        ndvi, evi = scene.ndvi, scene.evi
        assert ndvi.min() >= -0.2 and ndvi.max() <= 1 and evi.min() >= -0.2 and evi.max() <= 1
        green = ndvi > 0.3
        assert (evi[green] < ndvi[green]).all()
        vegetated.append(np.stack([ndvi[ndvi > 0.1], evi[ndvi > 0.1]]))
    together = np.concatenate(vegetated, axis=1)
    assert np.corrcoef(together)[0, 1] > 0.8


def _land_mean(short: str, layer: str, tile: str, day: date) -> float:
    product, first = CATALOG[short], first_period(CATALOG[short], day)
    found = stored(short, layer, tile, first)[readable(product, layer, tile, first, masks=False)]
    return float(found.mean()) * product.layer(layer).scale + product.layer(layer).offset


def test_seasons_follow_the_hemispheres_and_snow_the_cold() -> None:
    """NDVI: northern mid-latitude summer above its winter (Europe, the US Midwest), the
    southern the other way round (Argentina); snow: none in the tropics, a high-latitude
    winter under it and its summer free of it; LST warmer in summer."""
    july, january = date(2022, 7, 12), date(2022, 1, 9)
    for tile in ("h18v04", "h11v04"):
        assert _land_mean("MOD13A1", "500m_16_days_NDVI", tile, july) > \
            _land_mean("MOD13A1", "500m_16_days_NDVI", tile, january) + 0.15
        assert _land_mean("MOD11A2", "LST_Day_1km", tile, july) > _land_mean("MOD11A2", "LST_Day_1km", tile, january)
    assert _land_mean("MOD13A1", "500m_16_days_NDVI", "h12v12", january) > \
        _land_mean("MOD13A1", "500m_16_days_NDVI", "h12v12", july) + 0.05
    snow = CATALOG["MOD10A2"]
    for tile in ("h19v08", "h12v09", "h29v08"):  # central Africa, Amazonia, south-east Asia
        for day in (july, january):
            assert not (stored("MOD10A2", "Maximum_Snow_Extent", tile, first_period(snow, day)) == 200).any()
    winter = stored("MOD10A2", "Maximum_Snow_Extent", "h19v03", first_period(snow, january))  # the Baltic
    summer = stored("MOD10A2", "Maximum_Snow_Extent", "h19v03", first_period(snow, july))
    land = coastlines.land_mask("h19v03", 2400)
    assert (winter[land] == 200).mean() > 0.5 and (summer[land] == 200).mean() < 0.01


@pytest.mark.parametrize(("short", "layer"), [("MOD13A1", "500m_16_days_NDVI"), ("MOD11A1", "LST_Day_1km"),
                                              ("MOD09A1", "sur_refl_b01"), ("MOD15A2H", "Fpar_500m"),
                                              ("MOD17A2H", "Gpp_500m"), ("MCD43A4", "Nadir_Reflectance_Band1")])
def test_quality_masks_remove_cloud_patches_that_change_with_the_date(short: str, layer: str) -> None:
    """The quality layer masks a share of the land (clouds, in patches: most masked pixels'
    neighbours are masked too), not the same pixels on another date."""
    product = CATALOG[short]
    masked = []
    for day in (date(2022, 5, 3), date(2022, 6, 5)):
        first = first_period(product, day)
        raw, usable = (readable(product, layer, "h18v04", first, masks=m) for m in (False, True))
        gone = raw & ~usable
        assert 0.02 < gone[raw].mean() < 0.6, (day, gone[raw].mean())
        inner = gone[1:-1, 1:-1]
        together = gone[:-2, 1:-1] & gone[2:, 1:-1] & gone[1:-1, :-2] & gone[1:-1, 2:]
        assert together[inner].mean() > 0.7  # patches, not speckle (0.3 gone at random: 0.01)
        masked.append(gone)
    assert (masked[0] != masked[1]).mean() > 0.02


def test_fire_burns_rarely_and_in_the_dry_season() -> None:
    """MCD64A1 in the Sahel's savannas (h19v08: 0-10°N): burned in January, their dry
    season, on a small share of the land and on days of that month; none in August."""
    product = CATALOG["MCD64A1"]
    january = decoded(product, "Burn_Date", "h19v08", date(2022, 1, 1))
    august = decoded(product, "Burn_Date", "h19v08", date(2022, 8, 1))
    land = ~np.isnan(january)
    burned = january[land] > 0
    assert 0 < burned.mean() < 0.05
    assert ((january[land][burned] >= 1) & (january[land][burned] <= 31)).all()
    assert not (august[~np.isnan(august)] > 0).any()


def test_land_cover_follows_the_vegetation_and_names_its_classes() -> None:
    """MCD12Q1: the Congo's forest (within 2° of the equator) is evergreen broadleaf, the
    Sahara barren or open shrubland, Antarctica permanent snow and ice; every class present
    has its name; NDVI is higher in the forest than elsewhere."""
    product = CATALOG["MCD12Q1"]
    day = date(2021, 1, 1)
    names = dict(product.layer("LC_Type1").classes)
    for tile, rows, expected in (("h19v08", slice(1920, 2400), {2}), ("h19v06", slice(None), {16, 7}),
                                 ("h19v16", slice(None), {15})):
        classes = stored("MCD12Q1", "LC_Type1", tile, day)
        land = classes[rows] != earth.WATER
        top = np.bincount(classes[rows][land]).argmax()
        assert top in expected, (tile, top, names.get(int(top)))
        assert set(np.unique(classes).tolist()) <= set(names)
    green = decoded(CATALOG["MOD13A1"], "500m_16_days_NDVI", "h19v08", date(2021, 6, 26), masks=False)
    forest = stored("MCD12Q1", "LC_Type1", "h19v08", day) == 2
    assert np.nanmean(green[forest]) > np.nanmean(green[~forest & (stored("MCD12Q1", "LC_Type1", "h19v08", day)
                                                                     != earth.WATER)])


# land either side of ±180° and at the sinusoid's edge: Siberia, Chukotka (west and east of
# ±180°), Wrangel Island (across it), Antarctica beside it
FAR_EAST = [(100.0, 66.0), (170.0, 68.0), (175.0, 66.0), (179.0, 68.0), (-176.0, 66.0), (-173.0, 65.5), (-179.5, 71.2),
            (179.5, 71.3), (179.5, -85.0)]
ARCTIC = {1, 3, 5, 7, 8, 10, 11, 13, 15, 16}  # needleleaf and mixed forest, shrubs, grass, wetland, ice, barren


def test_the_land_across_the_antimeridian_is_land_and_arctic() -> None:
    """Natural Earth's rings that cross ±180° (Afro-Eurasia at Chukotka, Wrangel Island) or
    go round the south pole are land on either side of it, as its polygons are on the
    sphere (read as planar rings, Siberia and Chukotka were sea); the land cover there is
    what the Arctic has (no fields, no tropical forest), and the pixels of an edge tile off
    the globe are fill, as in the real granules."""
    product, day = CATALOG["MCD12Q1"], date(2022, 1, 1)
    names = dict(product.layer("LC_Type1").classes)
    for lon, lat in FAR_EAST:
        tile, row, col = pixel_of(lon, lat, product.pixels)
        assert coastlines.land_mask(tile, product.pixels)[row, col], (lon, lat, tile)
        assert coastlines.land_fraction()[int((90 - lat) / coastlines.GRID_DEGREES),
                                          int((lon + 180) / coastlines.GRID_DEGREES)] == 1, (lon, lat)
        assert tile in world.land_tiles() and world.exists(product, tile, day)
        if lat > 0:
            here = np.s_[row:row + 1, col:col + 1]
            found = int(stored("MCD12Q1", "LC_Type1", tile, day, here)[0, 0])
            assert found in ARCTIC, (lon, lat, tile, found, names.get(found))
            assert stored("MCD12Q1", "LW", tile, day, here)[0, 0] == 2  # land
    for tile in ("h24v02", "h25v02", "h10v02", "h11v02"):  # Chukotka's tiles, at the sinusoid's edge
        classes = stored("MCD12Q1", "LC_Type1", tile, day)
        size = TILE_SIZE / product.pixels
        h, v = int(tile[1:3]), int(tile[4:6])
        x = X_MIN + h * TILE_SIZE + (np.arange(product.pixels) + 0.5) * size
        y = Y_MAX - v * TILE_SIZE - (np.arange(product.pixels) + 0.5) * size
        off = np.abs(x)[None, :] > (math.pi * RADIUS * np.cos(y / RADIUS))[:, None]  # beyond ±180°
        assert off.any() and (classes[off] == product.layer("LC_Type1").fill).all(), tile
        land = ~off & (classes != earth.WATER)
        assert land.mean() > 0.2 and set(np.unique(classes[land]).tolist()) <= ARCTIC, tile


def test_granules_are_full_size_cogs_tiled_and_compressed_as_planetary_computers() -> None:
    for short, layer in (("MOD13Q1", "250m_16_days_NDVI"), ("MOD13A1", "500m_16_days_pixel_reliability"),
                         ("MOD11A2", "LST_Night_1km")):
        product = CATALOG[short]
        name = world.granule_name(product, "h18v04", first_period(product, date(2022, 5, 3)))
        with MemoryFile(world.cog(name, layer)) as memory, memory.open() as raster:
            assert (raster.width, raster.height) == (product.pixels, product.pixels)
            assert raster.block_shapes == [(512, 512)] and raster.compression.name == "deflate"
            assert raster.overviews(1) and raster.tags()["LOCALGRANULEID"] == f"{name}.hdf"
            assert raster.nodata == product.layer(layer).nodata


def test_a_window_of_a_layer_is_those_pixels_of_the_whole_tile() -> None:
    """What the tests above read of a tile's edges and single pixels: a window of a layer is
    its whole tile's pixels there, to the bit, across and within the blocks it is made of, on
    the globe and off it (h10v02, Alaska at the sinusoid's edge); a window with a step is
    refused."""
    product = CATALOG["MOD11A1"]
    layer, day, last = product.layer("LST_Night_1km"), date(2022, 1, 12), product.pixels - 1
    whole = world.values(product, layer, "h10v02", day)
    assert (whole == layer.fill).any() and (whole != layer.fill).any()
    for window in (np.s_[:, :], np.s_[:, :1], np.s_[last - 1:, :], np.s_[500:530, 1000:1100], np.s_[0:1, 0:1],
                   np.s_[last:, last:], np.s_[700:701, 300:301], np.s_[9:9, :]):
        part = world.values(product, layer, "h10v02", day, window)
        assert part.dtype == whole.dtype and np.array_equal(part, whole[window]), window
    with pytest.raises(ValueError, match="no step"):
        world.values(product, layer, "h10v02", day, np.s_[::2, :])


def test_every_synthesized_granule_says_so_and_no_real_one_does(planetary: Planetary, nasa: Earthdata) -> None:
    """A synthesized granule's STAC item, CMR entry, COG and HDF4 file are marked synthetic;
    the real ones (MOD10A2 h09v05, the MOD13A2 series) are not."""
    four_corners = (-108.5, 35.5, -108.0, 36.0)
    items = StacCatalog(planetary.stac_url)
    day = date(2022, 2, 2)
    (real,) = items.search(CATALOG["MOD10A2"], four_corners, day, day)
    (synthesized,) = items.search(CATALOG["MOD10A2"], four_corners, day + timedelta(days=8), day + timedelta(days=8))
    found = {item["id"]: item for item in pystac_client.Client.open(planetary.stac_url).search(
        collections=["modis-10A2-061"], bbox=list(four_corners), datetime="2022-02-02/2022-02-10").items_as_dicts()}
    assert is_synthetic(found[synthesized.id.rsplit(".", 1)[0]]) and not is_synthetic(found[real.id.rsplit(".", 1)[0]])
    assert SYNTHETIC not in found[real.id.rsplit(".", 1)[0]]["properties"]
    access = Access(planetary.sas_url, nasa.token, nasa.hosts)
    assert is_synthetic(access.fetch(synthesized.href("Maximum_Snow_Extent")).data)
    assert not is_synthetic(access.fetch(real.href("Maximum_Snow_Extent")).data)
    assert is_synthetic(access.fetch(synthesized.href(HDF)).data)
    assert not is_synthetic(access.fetch(real.href(HDF)).data)
    box = (8.5, -2.0, 9.5, -1.0)  # the Gabon coast, in h18v09
    entries = {g.day: g for g in CmrCatalog(nasa.cmr_url).search(CATALOG["MOD13A2"], box, date(2025, 1, 1),
                                                                 date(2025, 7, 31))}
    real_days = {date(2025, 1, 1) + timedelta(days=16 * k) for k in range(10)}
    assert real_days < set(entries)
    for day_, granule in entries.items():
        data = access.fetch(granule.href(HDF)).data
        assert is_synthetic(data) is (day_ not in real_days), day_
        assert is_synthetic(nasa.entry(CATALOG["MOD13A2"], "h18v09", day_)) is (day_ not in real_days)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "g.hdf")
        path.write_bytes(world.hdf4(world.granule_name(CATALOG["MCD64A1"], "h19v08", date(2022, 1, 1))))
        assert is_synthetic(path) and not is_synthetic(SERIES[0])
    with pytest.raises(ValueError, match="not a raster"):
        is_synthetic(b"<html>not a granule</html>")


def test_the_real_mod13a2_series_is_served_as_it_is(nasa: Earthdata) -> None:
    """The ten real MOD13A2 h18v09 composites come from the NASA imitation byte for byte,
    found by CMR search under their own names; read back, every SDS is the file's."""
    access = Access("", nasa.token, nasa.hosts)
    found = CmrCatalog(nasa.cmr_url).search(CATALOG["MOD13A2"], (8.5, -2.0, 9.5, -1.0), date(2025, 1, 1),
                                            date(2025, 6, 9))
    assert [g.id for g in found] == [p.stem for p in SERIES]
    for granule, path in zip(found, SERIES, strict=True):
        data = access.fetch(granule.href(HDF)).data
        assert data == path.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        fetched = Path(tmp, f"{found[4].id}.hdf")
        fetched.write_bytes(access.fetch(found[4].href(HDF)).data)
        sd = SD(str(SERIES[4]), SDC.READ)
        with hdf.Granule(fetched) as granule:
            for layer in CATALOG["MOD13A2"].layers:
                assert np.array_equal(granule.read(layer.name), sd.select(layer.sds).get()), layer.name
        sd.end()


def test_a_planetary_computer_deployment_gets_mod13a2_from_nasa(
        clients: Clients, settings: Settings, planetary: Planetary, nasa: Earthdata, tmp_path: Path) -> None:
    """Planetary Computer has no MOD13A2: a deployment searching it finds the product on
    CMR and its tile task fetches the real granule from NASA, making the pixels a warp of the
    real file makes (NDVI masked by its pixel reliability). The target's east edge lies
    within a kilometre of h19v09, whose edge pixels its warp reads too (no seam): the
    imitation's granule of it, fetched from NASA as well."""
    mine = on_stac(settings, planetary, cmr_url=nasa.cmr_url, earthdata_token=nasa.token,
                   earthdata_hosts=nasa.hosts)
    params = params_for(mine, 9.0, -2.0, date(2025, 1, 17), product="MOD13A2")
    granule, neighbour = from_param(params["granules"])
    assert granule.id == SERIES[1].stem and dict(granule.files)[HDF].startswith(nasa.archive.url)
    assert neighbour.tile == "h19v09" and dict(neighbour.files)[HDF].startswith(nasa.archive.url)
    ctx = run(mine, params)
    (output,) = ctx.outputs
    beyond = tmp_path / f"{neighbour.id}.hdf"
    beyond.write_bytes(world.hdf4(neighbour.id))
    expected = warp([Source(granule.id, {HDF: SERIES[1]}), Source(neighbour.id, {HDF: beyond})],
                    CATALOG["MOD13A2"], "1_km_16_days_NDVI", tilestage.target_of(params))
    with MemoryFile(tile_of(clients, output)) as a, a.open() as made, MemoryFile(expected) as b, b.open() as direct:
        ours = made.read(1)
        assert np.array_equal(ours, direct.read(1)) and (ours != -3000).mean() > 0.1
        assert made.tags()["QUALITY_MASK"] == "1_km_16_days_pixel_reliability"


def test_threads_making_one_granule_at_once_make_what_one_thread_makes() -> None:
    """The imitation serves several reads at once, and a tile task reads a granule's layers
    side by side: threads making windows of one granule in different bands of blocks (each
    band of the same height, so that a field of another band would fit) at the same time
    make the very pixels one thread makes alone."""
    product = CATALOG["MOD13A1"]
    ndvi, reliability = product.layer("500m_16_days_NDVI"), product.layer("500m_16_days_pixel_reliability")
    day, band = date(2021, 7, 28), world.BLOCK
    windows = [np.s_[top:top + band, :] for top in range(0, 4 * band, band)]
    alone = {layer.name: world.values(product, layer, "h11v05", day) for layer in (ndvi, reliability)}
    world._granule.cache_clear()
    asked = [(layer, window) for window in windows for layer in (ndvi, reliability)] * 2
    with ThreadPoolExecutor(len(asked)) as pool:
        made = list(pool.map(lambda one: world.values(product, one[0], "h11v05", day, one[1]), asked))
    for (layer, window), found in zip(asked, made, strict=True):
        assert np.array_equal(found, alone[layer.name][window]), (layer.name, window)
