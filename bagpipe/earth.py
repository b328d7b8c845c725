"""The imitated planet's surface on one MODIS tile and day: temperature, moisture, vegetation,
snow, clouds and fire, for the local stack's synthesized granules (:mod:`bagpipe.modis_world`
encodes them as each product's layers).

Every field is a function of where a pixel's centre is and of the date, never of its tile,
so neighbouring tiles join without a seam: what varies with latitude alone is computed per
row; what varies with longitude too (continentality, patchiness, weather, clouds, fire) is
drawn on global lattices of the sinusoidal plane whose nodes fall on every tile's edges
(their values hashed from the nodes' global indices, so a node shared by two tiles has one
value), interpolated smoothly at each pixel as two matrix products. Land is Natural Earth's
(:mod:`bagpipe.coastlines`).

The climate is a simple proxy, plausible rather than true: surface temperature falls with
latitude, its seasonal swing grows with latitude and distance from the sea (the southern
hemisphere's season opposite the northern's); moisture follows the latitude bands (wet
tropics, subtropical deserts, wet mid-latitudes, dry poles), drier inland; vegetation grows
with moisture where it is warm enough, and in the tropics' dry season browns; snow lies where
it is below freezing; clouds come in patches tens to hundreds of kilometres across, more in
wet climates; fire burns savannas in their dry season.
"""

from __future__ import annotations

import hashlib
import math
from datetime import date
from functools import cached_property, lru_cache

import numpy as np

from bagpipe import coastlines
from pipeline.modis.grid import RADIUS, TILE_SIZE, X_MIN, Y_MAX, Tile

F32 = np.float32


def _mix(values: np.ndarray) -> np.ndarray:
    """A 64-bit integer hash (splitmix64's finalizer), elementwise."""
    z = values.astype(np.uint64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _hash01(rows: np.ndarray, cols: np.ndarray, seed: int) -> np.ndarray:
    """A uniform value in [0, 1) per (row, col) node of a global lattice and seed."""
    salt = np.uint64((seed * 0x100000001B3) % (1 << 64))
    key = (rows.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ _mix(cols.astype(np.uint64) + salt)
    return (_mix(key) >> np.uint64(40)).astype(F32) / F32(1 << 24)


@lru_cache(maxsize=32)
def _weights(points: int, cells: int) -> np.ndarray:
    """(points, cells + 1) weights that interpolate a tile's lattice nodes (``cells`` per tile
    side) smoothly (smoothstep: the slope is continuous across nodes) at ``points`` places
    across the tile: pixel centres (``points`` > 0: that many pixels a side) or the nodes of
    a finer lattice (``points`` < 0: its nodes, edges included, ``-points - 1`` cells a side)."""
    at = (np.arange(points) + 0.5) * cells / points if points > 0 else np.arange(-points) * cells / (-points - 1)
    low = np.minimum(at.astype(int), cells - 1)
    t = at - low
    t = t * t * (3 - 2 * t)
    found = np.zeros((abs(points), cells + 1), dtype=F32)
    found[np.arange(abs(points)), low] = 1 - t
    found[np.arange(abs(points)), low + 1] = t
    found.setflags(write=False)
    return found


def _nodes(tile: Tile, cells: int) -> tuple[np.ndarray, np.ndarray]:
    """The global row and column indices of a tile's lattice nodes (``cells`` per tile side)."""
    return np.arange(tile.v * cells, (tile.v + 1) * cells + 1), np.arange(tile.h * cells, (tile.h + 1) * cells + 1)


def interpolate(nodes: np.ndarray, points: int) -> np.ndarray:
    """A field given at a tile's lattice nodes ((cells + 1)², rows from the north), at each of
    ``points`` places a side (see :func:`_weights`)."""
    w = _weights(points, nodes.shape[0] - 1)
    return np.asarray(w @ nodes.astype(F32) @ w.T, dtype=F32)


def noise(tile: Tile, points: int, seed: int, cells: tuple[int, ...] = (6, 24, 96),
          amplitudes: tuple[float, ...] = (0.5, 0.3, 0.2)) -> np.ndarray:
    """Smooth noise in [0, 1] (mean 0.5) of several scales: ``cells`` lattice cells per tile side
    (6: 185 km; 24: 46 km; 96: 12 km), summed with ``amplitudes``, at ``points`` places a side."""
    total = np.zeros((abs(points), abs(points)), dtype=F32)
    for octave, (count, amplitude) in enumerate(zip(cells, amplitudes, strict=True)):
        rows, cols = _nodes(tile, count)
        total += F32(amplitude) * interpolate(_hash01(rows[:, None], cols[None, :], seed * 131 + octave), points)
    return total / F32(sum(amplitudes))


def seed_of(*parts: object) -> int:
    """A lattice seed from what a field depends on (a name, a date, a platform)."""
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:6], "big")


def _continentality_nodes(tile: Tile, cells: int) -> np.ndarray:
    """How far inland each lattice node is, 0 (open sea) to 1 (deep in a continent): the
    global land grid blurred over some 500 km, read at the node's lon/lat."""
    grid = _blurred_land()
    rows, cols = _nodes(tile, cells)
    y = Y_MAX - rows * (TILE_SIZE / cells)
    x = X_MIN + cols * (TILE_SIZE / cells)
    lat = np.clip(np.degrees(y / RADIUS), -89.999, 89.999)[:, None]
    lon = np.clip(np.degrees(x[None, :] / (RADIUS * np.cos(np.radians(lat)))), -180, 180)
    size = coastlines.GRID_DEGREES
    r = np.clip((90 - lat) / size - 0.5, 0, grid.shape[0] - 1)
    c = (lon + 180) / size - 0.5
    r0, c0 = np.floor(r).astype(int), np.floor(c).astype(int)
    fr, fc = r - r0, c - c0
    r1 = np.minimum(r0 + 1, grid.shape[0] - 1)
    wrap = grid.shape[1]

    def at(rr: np.ndarray, cc: np.ndarray) -> np.ndarray:
        return grid[rr, cc % wrap]

    return np.asarray((at(r0, c0) * (1 - fc) + at(r0, c0 + 1) * fc) * (1 - fr)
                      + (at(r1, c0) * (1 - fc) + at(r1, c0 + 1) * fc) * fr, dtype=F32)


@lru_cache(maxsize=1)
def _blurred_land() -> np.ndarray:
    """The 0.25° land grid, box-blurred three times over 9.25° (about Gaussian, σ ≈ 4.6°, some
    500 km), wrapping across ±180°."""
    grid = coastlines.land_fraction().astype(np.float64)
    width = 18
    for _ in range(3):
        padded = np.concatenate([grid[:, -width:], grid, grid[:, :width]], axis=1)
        sums = np.cumsum(np.pad(padded, ((0, 0), (1, 0))), axis=1)
        grid = (sums[:, 2 * width + 1:] - sums[:, :-2 * width - 1])[:, : grid.shape[1]] / (2 * width + 1)
        padded = np.pad(grid, ((width, width), (0, 0)), mode="edge")
        sums = np.cumsum(np.pad(padded, ((1, 0), (0, 0))), axis=0)
        grid = (sums[2 * width + 1:] - sums[:-2 * width - 1]) / (2 * width + 1)
    found = np.clip(grid * 1.6 - 0.2, 0, 1).astype(F32)  # a coast's half-and-half is 0.6 inland
    found.setflags(write=False)
    return found


def declination(doy: int) -> float:
    """The sun's declination (degrees) on a day of the year."""
    return 23.44 * math.sin(2 * math.pi * (doy - 81) / 365.25)


def _band(abs_lat: np.ndarray) -> np.ndarray:
    """Moisture by latitude band: wet tropics, subtropical deserts, wet mid-latitudes, dry poles."""
    return np.interp(abs_lat, [0, 5, 10, 15, 20, 25, 30, 40, 50, 60, 70, 80, 90],
                     [0.95, 0.9, 0.6, 0.4, 0.15, 0.12, 0.25, 0.6, 0.8, 0.8, 0.55, 0.25, 0.1]).astype(F32)


# what the land reflects in MODIS bands 1-7 (red, NIR, blue, green, 1240, 1640, 2130 nm)
SOIL = np.array([0.25, 0.32, 0.15, 0.20, 0.38, 0.40, 0.35], dtype=F32)
LEAVES = np.array([0.04, 0.45, 0.03, 0.08, 0.40, 0.20, 0.08], dtype=F32)
SNOWPACK = np.array([0.80, 0.75, 0.85, 0.82, 0.45, 0.08, 0.05], dtype=F32)
CLOUD = np.array([0.55, 0.58, 0.56, 0.55, 0.50, 0.35, 0.25], dtype=F32)
CELLS = 240  # fields are worked out on a lattice of 4.6 km, then interpolated at each pixel
NODES = -(CELLS + 1)  # :func:`_weights`'s code for that lattice's nodes
WATER = 17  # IGBP's water bodies
CLOUDS = ((12, 48), (0.6, 0.4))  # cloud patches: on 93 and 23 km lattices
FIRES = ((24, 96), (0.5, 0.5))


class Scene:
    """One tile on one day as the imitated planet has it, for a product of ``pixels`` a side.

    Its fields are worked out on the lattice of :data:`CELLS` cells a tile (whose edge nodes
    neighbouring tiles share), when first asked for; :meth:`down` and :meth:`across`
    interpolate one at pixels of the product's grid (down its rows, then across its columns:
    the two steps of :func:`interpolate`, which a block of pixels takes apart)."""

    def __init__(self, tile: str, pixels: int, day: date, platform: str) -> None:
        self.tile, self.pixels, self.day, self.platform = Tile.parse(tile), pixels, day, platform
        self.doy = day.timetuple().tm_yday
        y = self.tile.bounds()[3] - np.arange(CELLS + 1) * (TILE_SIZE / CELLS)
        self.lat = np.degrees(y / RADIUS).astype(F32)[:, None]  # per row of nodes, degrees
        self.abs_lat = np.abs(self.lat)
        self.hemisphere = np.sign(self.lat).astype(F32)
        self._clouds: dict[tuple[float, str], np.ndarray] = {}

    def down(self, field: np.ndarray, rows: slice = slice(None)) -> np.ndarray:
        """A field of the lattice (or of its rows) interpolated down the product's grid, at
        its ``rows``: still at the lattice's columns (:meth:`across` takes it on)."""
        return _weights(self.pixels, CELLS)[rows] @ np.broadcast_to(field, (CELLS + 1, CELLS + 1)).astype(F32)

    def across(self, down: np.ndarray, cols: slice = slice(None)) -> np.ndarray:
        """A field interpolated down the grid (:meth:`down`) at the pixels of its ``cols``."""
        return np.asarray(down @ _weights(self.pixels, CELLS)[cols].T, dtype=F32)

    def noise(self, seed: int, cells: tuple[int, ...] = (6, 24, 96),
              amplitudes: tuple[float, ...] = (0.5, 0.3, 0.2)) -> np.ndarray:
        return noise(self.tile, NODES, seed, cells, amplitudes)

    # --- where ------------------------------------------------------------------------------
    @cached_property
    def land(self) -> np.ndarray:
        """Land at the product's own resolution (every pixel, every coast)."""
        return coastlines.land_mask(self.tile.name, self.pixels)

    @cached_property
    def on_globe(self) -> np.ndarray:
        """Whether each pixel of the product's grid lies on the globe (the sinusoid's edges)."""
        size = TILE_SIZE / self.pixels
        x0, _, _, y1 = self.tile.bounds()
        rows = y1 - (np.arange(self.pixels) + 0.5) * size
        cols = x0 + (np.arange(self.pixels) + 0.5) * size
        return np.abs(cols)[None, :] <= (np.pi * RADIUS * np.cos(rows / RADIUS))[:, None]

    @cached_property
    def continentality(self) -> np.ndarray:
        return interpolate(_continentality_nodes(self.tile, 24), NODES)

    @cached_property
    def patches(self) -> np.ndarray:
        """Static smooth noise: soils, stands, fields (the same every date)."""
        return self.noise(seed_of("patches"))

    @cached_property
    def moisture(self) -> np.ndarray:
        """0 (desert) to 1 (rain forest): the latitude band's, drier inland (less so in the
        tropics, whose rain is convective), with some patchiness."""
        tropical = np.clip(1 - self.abs_lat / 15, 0, 1)
        inland = 1.1 - 0.5 * self.continentality * (1 - 0.7 * tropical)
        return np.clip(_band(self.abs_lat) * inland * (0.7 + 0.6 * self.patches), 0, 1).astype(F32)

    # --- when -------------------------------------------------------------------------------
    def season(self, doy: int) -> np.ndarray:
        """+1 at the local hemisphere's midsummer (mid-July north, mid-January south), -1 at
        its midwinter (per row)."""
        return (math.cos(2 * math.pi * (doy - 196) / 365.25) * self.hemisphere).astype(F32)

    @cached_property
    def mean_temperature(self) -> np.ndarray:
        """The year's mean surface temperature (K, per row): about the zonal means, the south
        polar plateau colder than the Arctic sea."""
        north = np.interp(self.lat, [0, 15, 30, 45, 60, 70, 80, 90], [299, 298, 292, 283, 270, 262, 254, 250])
        south = np.interp(-self.lat, [0, 15, 30, 45, 60, 70, 80, 90], [299, 297, 291, 284, 271, 252, 235, 228])
        return np.where(self.lat >= 0, north, south).astype(F32)

    def climate_temperature(self, doy: int) -> np.ndarray:
        """The day's mean surface temperature of an ordinary year (K): the annual mean plus a
        seasonal swing that grows with latitude and inland."""
        amplitude = (1 + 26 * (self.abs_lat / 90) ** 1.2) * (0.35 + 0.65 * self.continentality)
        return (self.mean_temperature + amplitude * self.season(doy)).astype(F32)

    @cached_property
    def temperature(self) -> np.ndarray:
        """This day's mean surface temperature (K): the climate's, with weather (up to ±6 K
        in patches hundreds of kilometres across, new each day)."""
        weather = self.noise(seed_of("weather", self.day), (6, 24), (0.7, 0.3))
        return (self.climate_temperature(self.doy) + 12 * (weather - 0.5)).astype(F32)

    @cached_property
    def daylight(self) -> np.ndarray:
        """How high the noon sun stands (cosine of its zenith angle, 0 in the polar night; per row)."""
        return np.clip(np.cos(np.radians(self.lat - declination(self.doy))), 0, 1).astype(F32)

    @cached_property
    def diurnal_range(self) -> np.ndarray:
        """The day's warmest minus its coldest surface temperature (K): larger in dry places,
        small where the sun stays low."""
        return ((5 + 18 * (1 - self.moisture)) * (0.15 + 0.85 * self.daylight)).astype(F32)

    def surface_temperature(self, daytime: bool) -> np.ndarray:
        """The land surface temperature at the overpass (K, within 240-330): day warmer than
        night by the diurnal range."""
        found = self.temperature + self.diurnal_range * (0.6 if daytime else -0.4)
        return np.clip(found, 240, 330).astype(F32)

    def greenness_at(self, temperature: np.ndarray, doy: int) -> np.ndarray:
        """Vegetation cover (0-1) for a temperature field and day: moisture where it is warm
        enough to grow, browner in the tropics' dry season (their hemisphere's winter)."""
        warm = np.clip((temperature - 273) / 10, 0, 1)
        tropical = np.clip(1 - (self.abs_lat - 10) / 20, 0, 1)
        dry = (1 - self.season(doy)) / 2 * tropical * (1 - self.moisture)
        cover = self.moisture * warm * (1 - 0.8 * dry) * (0.8 + 0.4 * self.patches)
        return np.clip(cover, 0, 1).astype(F32)

    @cached_property
    def snow_margin(self) -> np.ndarray:
        """How far below freezing the ground is (K, give or take a degree or two in patches):
        snow lies where it is above 0."""
        return (272.0 - self.temperature - 4 * (self.patches - 0.5)).astype(F32)

    @cached_property
    def snow(self) -> np.ndarray:
        """Snow on the ground, on the lattice."""
        return np.asarray(self.snow_margin > 0)

    @cached_property
    def greenness(self) -> np.ndarray:
        """This date's vegetation cover (0-1), from the climate's temperature (no weather:
        leaves do not come and go by the day); little shows through snow."""
        found = self.greenness_at(self.climate_temperature(self.doy), self.doy)
        return np.where(self.snow, F32(0.1) * found, found).astype(F32)

    @cached_property
    def peak_greenness(self) -> np.ndarray:
        """The year's greatest vegetation cover (either hemisphere's midsummer)."""
        north, south = 196, 196 + 183
        return np.maximum(self.greenness_at(self.climate_temperature(north), north),
                          self.greenness_at(self.climate_temperature(south), south))

    def cloud_margin(self, fraction: float, name: str = "") -> np.ndarray:
        """Clouds in patches, new each date and overpass (``name``: night, say), over about
        ``fraction`` of an ordinary place, more in wet climates and fewer in dry: cloudy
        where this is above 0."""
        key = (fraction, name)
        if key not in self._clouds:
            field = self.noise(seed_of("clouds", self.day, self.platform, name), *CLOUDS)
            self._clouds[key] = (field - _quantile(1 - fraction, *CLOUDS) + 0.12 * (self.moisture - 0.5)).astype(F32)
        return self._clouds[key]

    # --- what the sensor sees ---------------------------------------------------------------
    def reflectance(self, band: int) -> np.ndarray:
        """Surface reflectance (0-1) in MODIS band ``band`` (1-7): soil and leaves mixed by
        vegetation cover (deserts' soil brighter), snow where it lies."""
        i = band - 1
        soil = SOIL[i] * (0.8 + 0.5 * (1 - self.moisture)) * (0.9 + 0.2 * self.patches)
        mixed = soil + (LEAVES[i] - soil) * self.greenness
        return np.where(self.snow, SNOWPACK[i] * (0.9 + 0.1 * self.patches), mixed).astype(F32)

    @cached_property
    def ndvi(self) -> np.ndarray:
        red, nir = self.reflectance(1), self.reflectance(2)
        return ((nir - red) / (nir + red)).astype(F32)

    @cached_property
    def evi(self) -> np.ndarray:
        """EVI (MOD13's formula, G 2.5, C1 6, C2 7.5, L 1), kept within -0.2..1 (over snow the
        formula's denominator nears 0)."""
        red, nir, blue = self.reflectance(1), self.reflectance(2), self.reflectance(3)
        return np.clip(2.5 * (nir - red) / (nir + 6 * red - 7.5 * blue + 1), -0.2, 1).astype(F32)

    @cached_property
    def fpar(self) -> np.ndarray:
        """The fraction of light the canopy absorbs (0-0.95), from NDVI."""
        return np.clip(1.1 * self.ndvi - 0.1, 0, 0.95).astype(F32)

    @cached_property
    def lai(self) -> np.ndarray:
        """Leaf area index (m²/m², 0-6), from the absorbed fraction (Beer's law)."""
        return (-np.log1p(-self.fpar) / 0.5).astype(F32)

    def gpp(self, days: int) -> np.ndarray:
        """Gross primary productivity over ``days`` days (kg C/m²): light use × absorbed light,
        slowed by cold."""
        warm = np.clip((self.temperature - 268) / 20, 0, 1)
        return (0.012 * days * self.fpar * self.daylight * warm).astype(F32)

    # --- the land's kind --------------------------------------------------------------------
    def igbp_inputs(self) -> tuple[np.ndarray, ...]:
        """What :func:`igbp` classifies, on the lattice: the year's peak vegetation cover, the
        mean temperature, the latitude's magnitude, patchiness and moisture."""
        shape = (CELLS + 1, CELLS + 1)
        return (self.peak_greenness, np.broadcast_to(self.mean_temperature, shape),
                np.broadcast_to(self.abs_lat, shape), self.patches, self.moisture)

    # --- fire -------------------------------------------------------------------------------
    def burned(self, first: date, days: int) -> tuple[np.ndarray, np.ndarray]:
        """Where fire burned in the ``days`` days from ``first`` (above 0), and on which day of
        the year: rarely, in savannas and grasslands, in their dry season."""
        middle = first.timetuple().tm_yday + days // 2
        dry = (1 - self.season(middle)) / 2 * np.clip(1 - (self.abs_lat - 5) / 25, 0, 1)
        green = self.peak_greenness
        burnable = (green > 0.15) & (green < 0.6) & (self.moisture > 0.2) & (dry > 0.6)
        fire = self.noise(seed_of("fire", first), *FIRES)
        margin = np.where(burnable, fire - _quantile(0.995, *FIRES) + 0.1 * (dry - 0.6), F32(-1)).astype(F32)
        day = first.timetuple().tm_yday + self.noise(seed_of("fire day", first), (96,), (1.0,)) * (days - 0.01)
        return margin, day.astype(F32)


def igbp(green: np.ndarray, cold: np.ndarray, lat: np.ndarray, patches: np.ndarray,
         moisture: np.ndarray) -> np.ndarray:
    """The IGBP land cover class (1-16) of land, from :meth:`Scene.igbp_inputs` (at pixels):
    ice sheets where the year is cold, barren land, shrubs, grass or savanna, then forests
    (evergreen broadleaf in the tropics, deciduous or mixed in the mid-latitudes, needleleaf
    in the north) as the peak vegetation cover grows; fields (not poleward of 60°, where the
    summer is too short: woody savannas there, the taiga's sparse northern edge, as MCD12Q1
    has it), towns and wetlands here and there."""
    forest = np.select([lat < 23, lat < 50, patches > 0.55], [2, np.where(patches > 0.5, 4, 5), 3], 1)
    found = np.select(
        [cold < 258, green < 0.06, green < 0.2, green < 0.38, green < 0.55],
        [15, 16, 7, np.where(lat < 25, 9, 10), np.where((lat < 25) | (lat >= 60), 8, np.where(patches > 0.55, 12, 14))],
        forest)
    found = np.where((patches > 0.58) & (patches < 0.585), 13, found)  # towns
    return np.where((moisture > 0.85) & (patches < 0.3), 11, found).astype(np.uint8)


@lru_cache(maxsize=32)
def _quantile(q: float, cells: tuple[int, ...], amplitudes: tuple[float, ...]) -> float:
    """The ``q`` quantile of :func:`noise`'s values at those scales (their spread is narrower
    than [0, 1]: sums of smooth interpolations), measured once on a sample tile."""
    sample = noise(Tile(18, 4), 600, seed_of("calibration"), cells, amplitudes)
    return float(np.quantile(sample, q))
