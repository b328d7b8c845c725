"""The world the local stack's imitations of Planetary Computer and NASA serve: which MODIS
granules exist, their names, and their content.

As in reality: land products exist only for tiles with land on them (Natural Earth's 1:50m
land at 0.25°: about 290 of the 460 tiles on the globe), not for dates before a product's
first data nor during an outage (Terra's safe mode of February 2016) nor before it is
produced (days after its period; a month for burned area, months for land cover), and a
granule's name carries its production timestamp.

The real granules in ``data/modis`` are served as they are: MOD10A2 h09v05 of 2 February 2022
(HDF4, and its two layers as GeoTIFFs) and ten MOD13A2 h18v09 composites of 2025 (HDF4;
Planetary Computer has no MOD13A2). Every other granule is synthesized, full size (4800,
2400 or 1200 pixels a side) on the exact MODIS grid in the product catalog's encoding, from
the imitated planet's surface (:mod:`bagpipe.earth`: land from real coastlines, climate,
vegetation, snow, clouds and fire as functions of place and date, so tiles join without a
seam), deterministic from (product, tile, date), and written as NASA writes it (HDF4-EOS,
SDS named as NASA names them, MOD13's divide-by ``scale_factor``) or as Planetary Computer
does (a Cloud-Optimized GeoTIFF per layer, 512-pixel tiles, deflate, overviews). It is made
a block of 512 × 512 pixels at a time, so that a window of a layer costs only the blocks it
touches (:func:`values`). A synthesized file says so (:data:`pipeline.modis.synthetic.TAG`); a real one does not.
Synthesized files are kept on disk (``BAGPIPE_WORLD_CACHE``, by default in the system's
temporary folder), under a digest of the code that makes them.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from functools import cache, lru_cache
from pathlib import Path

import numpy as np
import rasterio.shutil
from pyhdf.SD import SD, SDC
from rasterio.io import MemoryFile
from threadpoolctl import threadpool_limits

from bagpipe import coastlines, earth
from pipeline.modis.grid import RADIUS, TILES_H, TILES_V, Tile
from pipeline.modis.products import CATALOG, Layer, Product, last_day
from pipeline.modis.synthetic import TAG
from pipeline.modis.targets import native_transform, sinusoidal

ROOT = Path(__file__).resolve().parents[1]
REAL_DATA = ROOT / "data" / "modis"
STAC_DATA = REAL_DATA / "stac"
FIRST_DAY = {"terra": date(2000, 2, 24), "aqua": date(2002, 7, 4), "terra,aqua": date(2000, 2, 24)}
# products whose record starts later than their platforms' (their user guides' first granules)
FIRST_OF = {"MCD64A1": date(2000, 11, 1), "MCD12Q1": date(2001, 1, 1), "MCD15A2H": date(2002, 7, 4)}
# when a platform's granules are missing: Terra's safe mode of 18-28 February 2016
OUTAGES = {"terra": [(date(2016, 2, 18), date(2016, 2, 28))], "aqua": []}
# how long after its period ends a granule is produced, at the least (a week more at most)
LAG_DAYS = {"daily": 1, "8-day": 2, "16-day": 2, "monthly": 30, "yearly": 180}
# the share of an ordinary place that a composite of each cadence leaves cloudy
CLOUDY = {"daily": 0.4, "8-day": 0.12, "16-day": 0.08, "monthly": 0.03, "yearly": 0.0}
BLOCK = 512  # a granule is made a block of pixels at a time (:func:`_made`), its COG's tiles
Window = tuple[slice, slice]  # rows and columns of a tile's grid
GRIDS = {"09A1": "MOD_Grid_500m_Surface_Reflectance", "10A2": "MOD_Grid_Snow_500m",
         "11A1": "MODIS_Grid_Daily_1km_LST", "11A2": "MODIS_Grid_8Day_1km_LST",
         "13Q1": "MODIS_Grid_16DAY_250m_500m_VI", "13A1": "MODIS_Grid_16DAY_500m_VI",
         "13A2": "MODIS_Grid_16DAY_1km_VI", "15A2H": "MOD_Grid_MOD15A2H", "17A2H": "MODIS_Grid_500m_2D",
         "43A4": "MOD_Grid_BRDF", "64A1": "MOD_Grid_Monthly_500m_DB_BA", "12Q1": "MCD12Q1"}


@cache
def real_granules() -> dict[str, Path]:
    """The real HDF4 granules in ``data/modis`` (its folders included), by name."""
    return {path.stem: path for path in REAL_DATA.rglob("*.hdf")}


@cache
def land_tiles() -> frozenset[str]:
    """The MODIS tiles with land on them (Natural Earth 1:50m land at 0.25°, sampled at
    24 × 24 points of each tile)."""
    mask = coastlines.land_fraction() > 0
    found = set()
    steps = (np.arange(24) + 0.5) / 24
    for h in range(TILES_H):
        for v in range(TILES_V):
            tile = Tile(h, v)
            x0, y0, x1, y1 = tile.bounds()
            xs, ys = np.meshgrid(x0 + (x1 - x0) * steps, y0 + (y1 - y0) * steps)
            lat = np.degrees(ys / RADIUS)
            with np.errstate(divide="ignore", invalid="ignore"):
                lon = np.degrees(xs / (RADIUS * np.cos(np.radians(lat))))
            ok = np.abs(lon) <= 180
            rows = np.clip(((90 - lat[ok]) / coastlines.GRID_DEGREES).astype(int), 0, mask.shape[0] - 1)
            cols = np.clip(((lon[ok] + 180) / coastlines.GRID_DEGREES).astype(int), 0, mask.shape[1] - 1)
            if mask[rows, cols].any():
                found.add(tile.name)
    return frozenset(found)


def exists(product: Product, tile: str, day: date) -> bool:
    """Whether the archive has the product's granule of that tile and period: not before the
    product's first data, nor during an outage, nor before it is produced (a period still
    running, or ended days ago, has none yet)."""
    if day < FIRST_OF.get(product.name, FIRST_DAY[product.platform]) or tile not in land_tiles():
        return False
    if _produced(product, tile, day) > datetime.now(UTC).replace(tzinfo=None):  # the name's time is UTC
        return False
    return not any(first <= day <= last for platform in product.platform.split(",")
                   for first, last in OUTAGES.get(platform, []))


def _stamp(product: Product, tile: str, day: date) -> str:
    return f"{product.name}.A{day.year}{day.timetuple().tm_yday:03d}.{tile}.{product.collection}."


def _produced(product: Product, tile: str, day: date) -> datetime:
    """When a synthesized granule was produced: some days after its period."""
    seed = int.from_bytes(hashlib.sha256(_stamp(product, tile, day).encode()).digest()[:8], "big")
    after = timedelta(days=LAG_DAYS[product.cadence] + 1 + seed % 7, seconds=seed % 86400)
    return datetime.combine(last_day(product, day), datetime.min.time()) + after


def granule_name(product: Product, tile: str, day: date) -> str:
    """The granule's name, its production timestamp (a few days after the period) included."""
    stamp = _stamp(product, tile, day)
    real = [name for name in real_granules() if name.startswith(stamp)]
    if real:
        return real[0]
    return f"{stamp}{_produced(product, tile, day):%Y%j%H%M%S}"


def is_real(name: str) -> bool:
    """Whether a granule is one of the real ones in ``data/modis`` (else the world makes it)."""
    return name in real_granules()


def real_file(name: str, layer: str | None = None) -> Path | None:
    """The real file of a granule (its HDF4, or a layer's GeoTIFF), if ``data/modis`` has it."""
    if layer is None:
        return real_granules().get(name)
    path = REAL_DATA / f"{name}_{layer}.tif"
    return path if path.exists() else None


def _parse(name: str) -> tuple[Product, str, date]:
    short, stamp, tile = name.split(".")[:3]
    return CATALOG[short], tile, datetime.strptime(stamp[1:], "%Y%j").date()


# --- the layers ------------------------------------------------------------------------------
@lru_cache(maxsize=2)
def _scene(tile: str, pixels: int, day: date, platform: str) -> earth.Scene:
    return earth.Scene(tile, pixels, day, platform)


class _Granule:
    """What a synthesized granule's layers are drawn from: its scene, and the lattice fields
    several layers share (made when first asked for; a few MB, whatever the resolution).
    Shared by the threads making its files at once (the imitation serves reads side by
    side): the band of blocks a thread is making, and its fields down that band, are that
    thread's own."""

    def __init__(self, product: Product, tile: str, day: date) -> None:
        self.product, self.day = product, day
        self.scene = _scene(tile, product.pixels, day, product.platform)
        self.first = day.timetuple().tm_yday
        self.days = (last_day(product, day) - day).days + 1
        self._lattice: dict[object, np.ndarray] = {}
        self._making = threading.local()  # .band: the rows of the blocks .down holds their fields down

    def at_pixels(self, key: object, make: Callable[[], np.ndarray], rows: slice, cols: slice) -> np.ndarray:
        """A lattice field (``make``, once per granule, or the same made twice by threads at
        once) at the pixels of ``rows`` and ``cols`` of the grid: interpolated down its rows
        once for a band of blocks (those of one row), then across each block's columns."""
        if key not in self._lattice:
            self._lattice[key] = make()
        making = self._making
        if getattr(making, "band", None) != rows:
            making.band, making.down = rows, {}
        down: dict[object, np.ndarray] = making.down
        if key not in down:
            down[key] = self.scene.down(self._lattice[key], rows)
        return self.scene.across(down[key], cols)


class _Block:
    """A block of a granule's pixels (``rows`` and ``cols`` of its grid), which its layers
    are made of: the fields and masks several layers share, at each of its pixels (made when
    first asked for)."""

    def __init__(self, granule: _Granule, rows: slice, cols: slice) -> None:
        self.granule, self.rows, self.cols = granule, rows, cols
        self.product, self.day, self.scene = granule.product, granule.day, granule.scene
        self.first, self.days = granule.first, granule.days
        self._made: dict[object, np.ndarray] = {}

    def px(self, key: object, make: Callable[[], np.ndarray]) -> np.ndarray:
        """A lattice field (``make``) at each pixel, once per block."""
        if key not in self._made:
            self._made[key] = self.granule.at_pixels(key, make, self.rows, self.cols)
        return self._made[key]

    @property
    def on_globe(self) -> np.ndarray:
        return self.scene.on_globe[self.rows, self.cols]

    @property
    def water(self) -> np.ndarray:
        return ~self.scene.land[self.rows, self.cols]

    def cloudy(self, name: str = "") -> np.ndarray:
        fraction = CLOUDY[self.product.cadence]
        return self.px(("clouds", name), lambda: self.scene.cloud_margin(fraction, name)) > 0

    @property
    def snow(self) -> np.ndarray:
        return self.px("snow", lambda: self.scene.snow_margin) > 0

    def noise(self, name: str, cells: tuple[int, ...] = (24, 96), amplitudes: tuple[float, ...] = (0.5, 0.5)
              ) -> np.ndarray:
        """Smooth noise (0-1) at each pixel, new each date and product (for codes and angles)."""
        seed = earth.seed_of(name, self.product.name, self.day)
        return self.px(("noise", name), lambda: self.scene.noise(seed, cells, amplitudes))

    def reflectance(self, band: int, clouds: bool = True) -> np.ndarray:
        """Band ``band``'s surface reflectance at each pixel; a cloud's where it is cloudy."""
        found = self.px(("reflectance", band), lambda: self.scene.reflectance(band))
        if not clouds:
            return found
        if ("seen", band) not in self._made:
            self._made["seen", band] = np.where(self.cloudy(), earth.CLOUD[band - 1], found)
        return self._made["seen", band]

    def sun_zenith(self) -> np.ndarray:
        return self.px("sun", lambda: np.abs(self.scene.lat - earth.declination(self.first)) + 5)

    def doy_in_period(self, name: str) -> np.ndarray:
        """A day of the year within the period (the composite's pick) at each pixel."""
        return self.first + np.floor(self.noise(name) * self.days * 0.999)


def _stored(layer: Layer, physical: np.ndarray) -> np.ndarray:
    """Physical values in the layer's encoding, kept within its valid range."""
    stored = np.rint((physical - layer.offset) / layer.scale)
    return np.clip(stored, layer.valid[0], layer.valid[1]).astype(layer.dtype)


def _where(mask: np.ndarray, value: float | np.ndarray, otherwise: np.ndarray, layer: Layer) -> np.ndarray:
    return np.where(mask, np.asarray(value).astype(layer.dtype), otherwise).astype(layer.dtype)


def _vi(g: _Block, layer: Layer) -> np.ndarray:
    """MOD13: NDVI and EVI from the same reflectances (so they differ, EVI the lower), pixel
    reliability 3 where cloudy, 2 on snow, 1 (marginal) here and there."""
    key = layer.name.split("_16_days_")[1]
    if key in ("NDVI", "EVI"):
        red, nir = g.reflectance(1), g.reflectance(2)
        value = (nir - red) / (nir + red) if key == "NDVI" else \
            np.clip(2.5 * (nir - red) / (nir + 6 * red - 7.5 * g.reflectance(3) + 1), -0.2, 1)
        out = _stored(layer, value)
    elif key.endswith("_reflectance"):
        band = {"red": 1, "NIR": 2, "blue": 3, "MIR": 7}[key.split("_")[0]]
        out = _stored(layer, g.reflectance(band))
    elif key == "pixel_reliability":
        out = np.select([g.cloudy(), g.snow, g.noise("marginal") > 0.62], [3, 2, 1], 0).astype(layer.dtype)
    elif key == "VI_Quality":
        cloudy, marginal = g.cloudy(), g.noise("marginal") > 0.62
        modland = np.select([cloudy, marginal], [2, 1], 0)
        usefulness = np.select([cloudy, marginal], [12, 3], 1)
        out = (modland | usefulness << 2 | 1 << 6 | 1 << 11 | g.snow.astype(int) << 14).astype(layer.dtype)
    elif key == "view_zenith_angle":
        out = _stored(layer, 60 * g.noise("view") * (1 if layer.valid[0] >= 0 else np.sign(g.noise("side") - 0.5)))
    elif key == "sun_zenith_angle":
        out = _stored(layer, np.minimum(g.sun_zenith(), 89))
    elif key == "relative_azimuth_angle":
        out = _stored(layer, 360 * g.noise("azimuth") - 180)
    else:  # composite_day_of_the_year
        out = _stored(layer, g.doy_in_period("composite"))
    return _where(g.water, layer.fill, out, layer)


def _lst(g: _Block, layer: Layer) -> np.ndarray:
    """MOD11: day warmer than night; not produced (QC 10, fill) under clouds, nor over water
    (QC 11); produced mostly with an error of at most 1 K, some of 2 K and a few of 3 K."""
    time = "Day" if "Day" in layer.name or "day" in layer.name else "Night"
    cloudy, water = g.cloudy(time), g.water
    error = np.select([g.noise(f"error {time}") > 0.7, g.noise(f"error {time}") > 0.6], [2, 1], 0)
    produced = ~cloudy & ~water
    if layer.name.startswith("LST_"):
        kelvin = g.px(("lst", time), lambda: g.scene.surface_temperature(time == "Day"))
        return _where(produced, _stored(layer, kelvin), np.full(kelvin.shape, layer.fill), layer)
    if layer.name.startswith("QC_"):
        codes = np.where(error > 0, 1, 0) | error << 6
        return np.select([water, cloudy], [3, 2], codes).astype(layer.dtype)
    if layer.name.endswith("_view_time"):
        hours = {("terra", "Day"): 10.5, ("terra", "Night"): 22.5, ("aqua", "Day"): 13.5, ("aqua", "Night"): 1.5}
        value = _stored(layer, hours[g.product.platform, time] + 1.6 * (g.noise(f"time {time}") - 0.5))
    elif layer.name.endswith("_view_angl"):
        value = _stored(layer, 65 * g.noise(f"angle {time}"))
    elif layer.name.startswith("Emis_"):
        green = g.px("greenness", lambda: g.scene.greenness)
        value = _stored(layer, np.where(g.snow, 0.99, 0.955 + 0.03 * green) + (0.004 if layer.name == "Emis_32" else 0))
        return _where(water, layer.fill, value, layer)
    elif layer.name.startswith("Clear_sky"):  # a bit per clear day or night of the 8
        clear = np.clip(np.rint(8 * g.noise(f"clear {time}")), 1, 8).astype(int)
        value = (0xFF >> (8 - clear)).astype(layer.dtype)
    else:  # Clear_day_cov, Clear_night_cov
        value = _stored(layer, 0.2 + 0.8 * g.noise(f"coverage {time}"))
    return _where(produced, value, np.full(value.shape, layer.fill), layer)


def _snow(g: _Block, layer: Layer) -> np.ndarray:
    """MOD10A2: ocean 39; on land night 11 (the polar night), cloud 50 (cloudy all 8 days),
    snow 200, else no snow 25; the eight days' bits where snow lay."""
    water, snow = g.water, g.snow
    if layer.name == "Eight_Day_Snow_Cover":
        deep = g.px("snow", lambda: g.scene.snow_margin) > 5
        days = np.where(deep, 8, np.clip(np.rint(8 * g.noise("snow days")), 1, 8)).astype(int)
        return np.where(snow & ~water, 0xFF >> (8 - days), 0).astype(layer.dtype)
    night = g.px("daylight", lambda: g.scene.daylight) < 0.05
    return np.select([water, night, g.cloudy(), snow], [39, 11, 50, 200], 25).astype(layer.dtype)


def _reflectance(g: _Block, layer: Layer) -> np.ndarray:
    """MOD09A1: seven bands; clouds bright and flagged in the state bits (cloud state 01 and
    the internal cloud flag), snow flagged, water deep ocean and not processed."""
    cloudy, water, snow = g.cloudy(), g.water, g.snow
    name = layer.name
    if name.startswith("sur_refl_b"):
        out = _stored(layer, g.reflectance(int(name[-2:])))
    elif name == "sur_refl_qc_500m":
        corrected = 3 << 30  # atmospheric and adjacency corrections made
        return np.select([water, cloudy], [0x3FFFFFFF, corrected | 1], corrected).astype(layer.dtype)
    elif name == "sur_refl_state_500m":
        land = 1 << 3 | cloudy.astype(int) * (1 | 1 << 10) | snow.astype(int) * (1 << 12 | 1 << 15)
        return np.where(water, 7 << 3, land).astype(layer.dtype)
    elif name == "sur_refl_szen":
        out = _stored(layer, np.minimum(g.sun_zenith(), 89))
    elif name == "sur_refl_vzen":
        out = _stored(layer, 65 * g.noise("view"))
    elif name == "sur_refl_raz":
        out = _stored(layer, 360 * g.noise("azimuth") - 180)
    else:  # sur_refl_day_of_year
        out = _stored(layer, g.doy_in_period("observed"))
    return _where(water, layer.fill, out, layer)


def _nbar(g: _Block, layer: Layer) -> np.ndarray:
    """MCD43A4: reflectance at nadir, no clouds (16 days of observations model them away);
    mandatory QA 1 (magnitude inversions) where clouds left too few."""
    if layer.name.startswith("BRDF_Albedo"):
        return np.select([g.water, g.cloudy()], [255, 1], 0).astype(layer.dtype)
    band = int(layer.name[-1])
    return _where(g.water, layer.fill, _stored(layer, g.reflectance(band, clouds=False)), layer)


def _no_retrieval(g: _Block, water: int, barren: int, snow: int) -> tuple[np.ndarray, np.ndarray]:
    """Where MOD15/MOD17 retrieve nothing and the code that says why (water, barren, snow)."""
    green = g.px("greenness", lambda: g.scene.greenness)
    code = np.select([g.water, g.snow, green < 0.03], [water, snow, barren], 0)
    return code > 0, code


def _fpar_qc(g: _Block) -> np.ndarray:
    """FparLai_QC (and MOD17's Psn_QC): the main algorithm under a clear sky (saturated where
    the canopy is dense), the empirical back-up under clouds; the sensor bit for Aqua."""
    cloudy = g.cloudy()
    saturated = g.px("lai", lambda: g.scene.lai) > 5
    scf = np.select([cloudy, saturated], [3, 1], 0)
    sensor = 1 << 1 if g.product.platform == "aqua" else 0
    return (np.where(cloudy, 1, 0) | sensor | np.where(cloudy, 1, 0) << 3 | scf << 5).astype(np.uint8)


def _lai(g: _Block, layer: Layer) -> np.ndarray:
    """MOD15A2H: LAI and FPAR from NDVI; 254 water, 253 barren, 252 snow."""
    none, code = _no_retrieval(g, 254, 253, 252)
    name = layer.name
    if name == "FparLai_QC":
        return np.where(g.water, layer.fill, _fpar_qc(g)).astype(layer.dtype)
    if name == "FparExtra_QC":
        return (np.where(g.water, 3, 0) | g.snow.astype(int) << 2 | g.cloudy().astype(int) << 5).astype(layer.dtype)
    lai = g.px("lai", lambda: g.scene.lai)
    fpar = g.px("fpar", lambda: g.scene.fpar)
    value = {"Lai_500m": lai, "Fpar_500m": fpar, "LaiStdDev_500m": 0.1 + 0.15 * lai,
             "FparStdDev_500m": 0.02 + 0.05 * fpar}[name]
    return _where(none, code, _stored(layer, value), layer)


def _gpp(g: _Block, layer: Layer) -> np.ndarray:
    """MOD17A2H: GPP over the 8 days from the absorbed light; net photosynthesis less the
    plants' respiration (below 0 in the cold); 32766 water, 32765 barren, 32764 snow."""
    if layer.name == "Psn_QC_500m":
        return np.where(g.water, layer.fill, _fpar_qc(g)).astype(layer.dtype)
    none, code = _no_retrieval(g, 32766, 32765, 32764)
    gpp = g.px("gpp", lambda: g.scene.gpp(g.days))
    value = gpp if layer.name == "Gpp_500m" else 0.55 * gpp - 0.0004 * g.days
    return _where(none, code, _stored(layer, value), layer)


def _burned(g: _Block, layer: Layer) -> np.ndarray:
    """MCD64A1: the day of burning where fire burned (rare, in the dry season), 0 on unburned
    land, -2 over water, -1 (unmapped) where clouds left too little data; QA land and
    valid-data bits."""
    burned = g.px("burned", lambda: g.scene.burned(g.day, g.days)[0]) > 0
    water, unmapped = g.water, g.cloudy()
    if layer.name == "QA":
        return (np.where(water, 0, 1) | np.where(water | unmapped, 0, 1) << 1).astype(layer.dtype)
    if layer.name == "Burn_Date":
        burn = np.where(burned, np.floor(g.px("burn day", lambda: g.scene.burned(g.day, g.days)[1])), 0)
        return np.select([water, unmapped], [-2, -1], burn).astype(layer.dtype)
    if layer.name == "Burn_Date_Uncertainty":
        return np.where(burned & ~water & ~unmapped, 1 + np.floor(9 * g.noise("uncertainty")), 0).astype(layer.dtype)
    detected = g.first if layer.name == "First_Day" else g.first + g.days - 1
    return np.select([water, unmapped], [-2, -1], detected).astype(layer.dtype)


# land cover: other schemes' classes of each IGBP class (1-17, index 0 unused)
_FROM_IGBP = {
    "LC_Type2": (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 15, 0),
    "LC_Type3": (0, 7, 5, 8, 6, 6, 2, 2, 4, 4, 1, 1, 3, 10, 3, 9, 9, 0),
    "LC_Type4": (0, 1, 2, 3, 4, 4, 4, 4, 6, 6, 6, 6, 5, 8, 5, 7, 7, 0),
    "LC_Type5": (0, 1, 2, 3, 4, 4, 5, 5, 4, 6, 6, 6, 7, 9, 8, 10, 11, 0),
    "LC_Prop1": (0, 11, 12, 13, 14, 15, 41, 43, 21, 22, 31, 31, 31, 1, 31, 2, 1, 3),
    "LC_Prop2": (0, 10, 10, 10, 10, 10, 40, 40, 20, 20, 30, 30, 36, 9, 35, 2, 1, 3),
    "LC_Prop3": (0, 10, 10, 10, 10, 10, 40, 40, 20, 20, 30, 50, 30, 30, 30, 2, 1, 3),
}


def _land_cover(g: _Block, layer: Layer) -> np.ndarray:
    """MCD12Q1: IGBP classes from the year's peak vegetation and the climate (17 over water),
    the other schemes' from them; QC 0 (classified land) or 2 (classified water); LW 1 water,
    2 land."""
    scene, water = g.scene, g.water
    if layer.name == "LW":
        return np.where(water, 1, 2).astype(layer.dtype)
    if layer.name == "QC":
        return np.where(water, 2, 0).astype(layer.dtype)
    if layer.name.endswith("_Assessment"):
        return np.where(water, 100, np.rint(40 + 60 * g.noise(layer.name))).astype(layer.dtype)
    igbp = earth.igbp(*(g.px(("igbp", i), lambda f=field: f) for i, field in enumerate(scene.igbp_inputs())))
    igbp = np.where(water, earth.WATER, igbp).astype(np.uint8)
    if layer.name == "LC_Type1":
        return igbp.astype(layer.dtype)
    return np.asarray(_FROM_IGBP[layer.name], dtype=layer.dtype)[igbp]


FAMILIES: dict[str, Callable[[_Block, Layer], np.ndarray]] = {
    "09A1": _reflectance, "10A2": _snow, "11A1": _lst, "11A2": _lst, "13Q1": _vi, "13A1": _vi, "13A2": _vi,
    "15A2H": _lai, "17A2H": _gpp, "43A4": _nbar, "64A1": _burned, "12Q1": _land_cover,
}


@lru_cache(maxsize=4)
def _granule(product: str, tile: str, day: date) -> _Granule:
    return _Granule(CATALOG[product], tile, day)


def values(product: Product, layer: Layer, tile: str, day: date, window: Window | None = None) -> np.ndarray:
    """A synthesized layer in the layer's encoding, fill off the globe: the whole tile, or
    ``window`` of it (its grid's rows and columns, ``np.s_[top:bottom, left:right]``), which
    costs only the blocks it touches and is those pixels of the whole (see :func:`_made`)."""
    return _made(product, [layer], tile, day, window)[layer.name]


@cache
def _blas_on_one_thread() -> None:
    """The process's BLAS on one thread: the world's interpolation (:mod:`bagpipe.earth`) is
    the project's only BLAS work, hundreds of small matrix products a granule, and a thread
    pool wakes and waits for its threads at each (on a loaded machine, three times as long
    as one thread takes, or more). The pixels are the same on any number of threads."""
    threadpool_limits(limits=1, user_api="blas")


def _made(product: Product, layers: list[Layer], tile: str, day: date, window: Window | None = None
          ) -> dict[str, np.ndarray]:
    """Layers of a granule (the whole tile, or a window of it), made a block of
    :data:`BLOCK` pixels a side at a time (the tile's grid in blocks, as its COG's tiles): a
    block's fields at each pixel are made once for all the layers asked for, then dropped, so
    that a whole granule takes its layers' memory and not its fields' too (at 4800 pixels a
    side, 92 MB each: MOD13Q1's HDF4 file took 1.9 GB made field by field over the whole
    tile, 740 MB so). A pixel is made the same in every window that holds it: in the same
    block, by the same computation."""
    size = product.pixels
    rows, cols = window or (slice(None), slice(None))
    (top, bottom, step_down), (left, right, step_across) = rows.indices(size), cols.indices(size)
    if step_down != 1 or step_across != 1:
        raise ValueError("a window of a tile is its rows and columns from one to another, with no step")
    height, width = max(bottom - top, 0), max(right - left, 0)
    found = {layer.name: np.empty((height, width), dtype=layer.dtype) for layer in layers}
    _blas_on_one_thread()
    granule = _granule(product.name, tile, day)
    for r in range(top - top % BLOCK, bottom, BLOCK):
        for c in range(left - left % BLOCK, right, BLOCK):
            block = _Block(granule, slice(r, min(r + BLOCK, size)), slice(c, min(c + BLOCK, size)))
            r0, r1, c0, c1 = max(r, top), min(r + BLOCK, bottom), max(c, left), min(c + BLOCK, right)
            for layer in layers:
                out = FAMILIES[product.name[3:]](block, layer)
                out = np.where(block.on_globe, out, np.array(layer.fill).astype(layer.dtype)).astype(layer.dtype)
                found[layer.name][r0 - top:r1 - top, c0 - left:c1 - left] = out[r0 - r:r1 - r, c0 - c:c1 - c]
    return found


# --- the files -------------------------------------------------------------------------------
@cache
def _code_digest() -> str:
    """A digest of the code and data synthesized files are made from (a change makes new ones)."""
    digest = hashlib.sha256()
    for path in (Path(__file__), Path(earth.__file__), Path(coastlines.__file__), ROOT / "pipeline" / "modis" /
                 "products.py", coastlines.land_file()):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def cache_folder() -> Path:
    base = os.environ.get("BAGPIPE_WORLD_CACHE") or str(Path(tempfile.gettempdir()) / "bagpipe-world")
    return Path(base) / _code_digest()


def _kept(file: str, make: Callable[[], bytes]) -> bytes:
    """A synthesized file from the disk cache, made and kept there (atomically) if absent."""
    path = cache_folder() / file
    if path.exists():
        return path.read_bytes()
    data = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".part") as tmp:
        tmp.write(data)
    Path(tmp.name).replace(path)
    return data


def cog(name: str, layer_name: str) -> bytes:
    """A granule's layer as Planetary Computer keeps it: a Cloud-Optimized GeoTIFF (512-pixel
    tiles, deflate, overviews), tagged with its granule's id."""
    real = real_file(name, layer_name)
    if real:
        return real.read_bytes()
    return _kept(f"{name}_{layer_name}.tif", lambda: _make_cog(name, layer_name))


def _make_cog(name: str, layer_name: str) -> bytes:
    product, tile, day = _parse(name)
    layer = product.layer(layer_name)
    profile = {"driver": "GTiff", "width": product.pixels, "height": product.pixels, "count": 1,
               "dtype": layer.dtype, "crs": sinusoidal(), "nodata": layer.nodata,
               "transform": native_transform(Tile.parse(tile), product.pixels)}
    with MemoryFile() as raw:
        with raw.open(**profile) as dst:
            dst.write(values(product, layer, tile, day), 1)
            dst.scales, dst.offsets = (layer.scale,), (layer.offset,)
            dst.update_tags(LOCALGRANULEID=f"{name}.hdf", **{TAG: "true"})
        with raw.open() as src, MemoryFile() as out:
            rasterio.shutil.copy(src, out.name, driver="COG", compress="DEFLATE", blocksize=512,
                                 overview_resampling="nearest" if layer.categorical else "average")
            return bytes(out.read())


def hdf4(name: str) -> bytes:
    """A granule as NASA's archives keep it: HDF4-EOS, every layer an SDS named as NASA names
    it with its fill, valid range and scale (MOD13's as a divisor, as its files say it), the
    grid in ``StructMetadata.0``, the granule's id and period in ``CoreMetadata.0``."""
    real = real_file(name)
    if real:
        return real.read_bytes()
    return _kept(f"{name}.hdf", lambda: _make_hdf4(name))


def _make_hdf4(name: str) -> bytes:
    product, tile, day = _parse(name)
    x0, y0, x1, y1 = Tile.parse(tile).bounds()
    fields = "".join(f'\t\t\tOBJECT=DataField_{i}\n\t\t\t\tDataFieldName="{layer.sds}"\n'
                     f"\t\t\tEND_OBJECT=DataField_{i}\n" for i, layer in enumerate(product.layers, 1))
    struct = (f'GROUP=GridStructure\n\tGROUP=GRID_1\n\t\tGridName="{GRIDS[product.name[3:]]}"\n'
              f"\t\tXDim={product.pixels}\n\t\tYDim={product.pixels}\n\t\tUpperLeftPointMtrs=({x0:.6f},{y1:.6f})\n"
              f"\t\tLowerRightMtrs=({x1:.6f},{y0:.6f})\n\t\tProjection=GCTP_SNSOID\n"
              f"\t\tProjParams=({RADIUS:.6f},0,0,0,0,0,0,0,0,0,0,0,0)\n\t\tSphereCode=-1\n\t\tGROUP=DataField\n{fields}"
              "\t\tEND_GROUP=DataField\n\tEND_GROUP=GRID_1\nEND_GROUP=GridStructure\nEND\n")
    core = "".join(f'\t\tOBJECT\t= {key}\n\t\t\tNUM_VAL\t= 1\n\t\t\tVALUE\t= "{value}"\n\t\tEND_OBJECT\t= {key}\n'
                   for key, value in (("LOCALGRANULEID", f"{name}.hdf"), ("RANGEBEGINNINGDATE", day.isoformat()),
                                      ("RANGEENDINGDATE", last_day(product, day).isoformat()),
                                      ("SHORTNAME", product.name), ("VERSIONID", product.collection)))
    kinds = {"uint8": SDC.UINT8, "int8": SDC.INT8, "uint16": SDC.UINT16, "int16": SDC.INT16, "uint32": SDC.UINT32}
    with tempfile.TemporaryDirectory(prefix="bagpipe-hdf-") as tmp:
        path = Path(tmp, f"{name}.hdf")
        sd = SD(str(path), SDC.WRITE | SDC.CREATE)
        sd.attr("StructMetadata.0").set(SDC.CHAR8, struct)
        inventory = f"GROUP\t= INVENTORYMETADATA\n{core}END_GROUP\t= INVENTORYMETADATA\nEND\n"
        sd.attr("CoreMetadata.0").set(SDC.CHAR8, inventory)
        sd.attr(TAG).set(SDC.CHAR8, "true")
        made = _made(product, list(product.layers), tile, day)
        for layer in product.layers:
            kind = kinds[layer.dtype]
            sds = sd.create(layer.sds, kind, (product.pixels, product.pixels))
            sds.setcompress(SDC.COMP_DEFLATE, 6)
            if layer.nodata is not None:
                sds.attr("_FillValue").set(kind, int(layer.nodata))
            sds.attr("valid_range").set(kind, [int(layer.valid[0]), int(layer.valid[1])])
            if layer.unit:
                sds.attr("units").set(SDC.CHAR8, layer.unit)
            if layer.scale != 1.0 or layer.offset:  # MOD13 writes the divisor, the others the factor
                divide = product.name[3:5] == "13"
                sds.attr("scale_factor").set(SDC.FLOAT64, round(1 / layer.scale) if divide else layer.scale)
                sds.attr("add_offset").set(SDC.FLOAT64, layer.offset)
            sds[:] = made.pop(layer.name)
            sds.endaccess()
        sd.end()
        return path.read_bytes()

