"""The output grid of a request: its target tiles, and which MODIS source tiles each needs.

By default a request's region is cut into geographic lon/lat tiles (EPSG:4326) of a chosen
size and resolution; another CRS may be asked for if a tile can be made and drawn in it
(:func:`crs_problem`). A region given as MODIS tiles is processed on the native grid: each
target tile is a MODIS tile and its own single source.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import numpy as np
from affine import Affine
from pyproj import CRS, Transformer
from pyproj.exceptions import ProjError
from rasterio.warp import transform_bounds

from pipeline.modis.grid import RADIUS, TILE_SIZE, TILES_H, TILES_V, X_MIN, Y_MAX, Tile

SINUSOIDAL_PROJ4 = f"+proj=sinu +lon_0=0 +x_0=0 +y_0=0 +R={RADIUS} +units=m +no_defs"
NATIVE = "MODIS"  # the grid name of the MODIS sinusoidal tiles themselves
MAX_TILE_PIXELS = 4096  # per side of a target tile
EDGE_SAMPLES = 64  # points per edge (and per interior line) when finding source tiles
# source pixels a target's warp reads beyond its footprint: cubic reaches 2, lanczos 3, at a
# kernel of one source pixel (``reprojection.KERNEL``); the MODIS tiles within it are read too
REACH_PIXELS = 4
REACH_METRES = REACH_PIXELS * TILE_SIZE / 1200  # in the coarsest MODIS grid's pixels (926 m): any product's reach


@lru_cache(maxsize=4096)
def lonlat_bounds(crs: str, bounds: str) -> tuple[float, float, float, float]:
    """A target tile's bounds (``west,south,east,north`` in its CRS) in degrees."""
    west, south, east, north = (float(v) for v in bounds.split(","))
    if crs.upper() in ("EPSG:4326", "OGC:CRS84"):
        return west, south, east, north
    source = SINUSOIDAL_PROJ4 if crs == NATIVE else crs  # a job asked as MODIS tiles: their own grid
    w, s, e, n = transform_bounds(source, "EPSG:4326", west, south, east, north, densify_pts=21)
    return (math.floor(w * 1e6) / 1e6, math.floor(s * 1e6) / 1e6,  # rounded outwards
            math.ceil(e * 1e6) / 1e6, math.ceil(n * 1e6) / 1e6)


@cache
def sinusoidal() -> CRS:
    return CRS.from_proj4(SINUSOIDAL_PROJ4)


def is_modis_sinusoidal(params: Mapping[str, Any]) -> bool:
    """Whether PROJ parameters (``rasterio.crs.CRS.to_dict()``) are the MODIS grid's."""
    return (params.get("proj") == "sinu" and float(params.get("R", 0)) == RADIUS
            and all(float(params.get(k, 0)) == 0 for k in ("lon_0", "x_0", "y_0")))


@lru_cache(maxsize=64)
def _to_sinusoidal(crs: str) -> Transformer:
    return Transformer.from_crs(CRS.from_user_input(crs), sinusoidal(), always_xy=True)


@lru_cache(maxsize=64)
def _from_lonlat(crs: str) -> Transformer:
    return Transformer.from_crs(CRS.from_epsg(4326), CRS.from_user_input(crs), always_xy=True)


# Points of the Earth a target grid's CRS must show (and take back): every 15° of lon/lat.
_EARTH_LON, _EARTH_LAT = (a.ravel() for a in np.meshgrid(np.arange(-180.0, 180.1, 15.0), np.arange(-90.0, 90.1, 15.0)))


# The forms a grid's CRS is given in: AUTHORITY:CODE (EPSG:4326, ESRI:54009, EPSG:4326+5773),
# an OGC URN or URL, a PROJ string, or WKT. pyproj would also search its database for a name
# ("WGS 84"), which takes seconds for a text that names nothing.
CRS_FORMS = re.compile(r"[A-Za-z][A-Za-z0-9_]*:[A-Za-z0-9_.+]+|urn:ogc:def:crs[,:].+|https?://www\.opengis\.net/def/crs/.+"
                       r"|\+?proj=.+|[A-Z][A-Z0-9_]*\[.+", re.DOTALL)


@lru_cache(maxsize=512)
def crs_problem(text: str) -> str:
    """Why ``text`` cannot be a target grid's CRS, or "" if it can: given in one of
    :data:`CRS_FORMS`, it must be a 2-D
    geographic or projected CRS that pyproj knows, of the Earth (pyproj finds a
    transformation from lon/lat, EPSG:4326, to it: a CRS of another body or another kind —
    geocentric, engineering, vertical, compound — has none, or not one a tile grid can use),
    showing some point of the Earth and taking it back to the same lon/lat; and GDAL
    (rasterio) must know it as well, warp MODIS's sinusoidal grid to it and it to lon/lat
    (the overviews), and write it into a GeoTIFF. Decided once per text."""
    if not CRS_FORMS.fullmatch(text):
        return (f"give the CRS as AUTHORITY:CODE (e.g. EPSG:4326, EPSG:32612, EPSG:3413), a PROJ string or WKT, "
                f"not {text!r}")
    try:
        crs = CRS.from_user_input(text)
    except Exception:  # pyproj's CRSError, or whatever else a string it cannot parse makes it raise
        return f"unknown CRS {text!r} (give e.g. EPSG:4326, EPSG:32612 or EPSG:3413)"
    horizontal = crs.source_crs if crs.is_bound and crs.source_crs is not None else crs
    if not (horizontal.is_geographic or horizontal.is_projected) or len(horizontal.axis_info) != 2:
        return (f"{text!r} is a {crs.type_name}: a target grid needs a 2-D geographic or projected CRS "
                f"(e.g. EPSG:4326, a UTM zone, EPSG:3413)")
    try:
        forward = _from_lonlat(text)
    except ProjError as exc:
        body = "of another body than the Earth" if "celestial body" in str(exc) else "out of reach of lon/lat"
        return f"{text!r} is {body}: no transformation from EPSG:4326 to it"
    x, y = (np.asarray(a) for a in forward.transform(_EARTH_LON, _EARTH_LAT))
    lon, lat = (np.asarray(a) for a in forward.transform(x, y, direction="INVERSE"))
    with np.errstate(invalid="ignore"):
        back = (np.isfinite(x) & np.isfinite(y) & (np.abs(lat - _EARTH_LAT) < 1e-6)
                & (np.abs((lon - _EARTH_LON + 180) % 360 - 180) < 1e-6))
    if not back.any():
        return f"{text!r} shows no point of the Earth that it takes back to its lon/lat"
    first = int(np.flatnonzero(back)[0])
    return _gdal_problem(text, float(_EARTH_LON[first]), float(_EARTH_LAT[first]))


def _gdal_problem(text: str, lon: float, lat: float) -> str:
    """Why GDAL cannot make or draw a tile in ``text`` ("" if it can), tried at one point of
    the Earth (lon, lat) that the CRS shows."""
    import rasterio.crs
    import rasterio.shutil
    from rasterio.io import MemoryFile
    from rasterio.warp import transform

    try:
        crs = rasterio.crs.CRS.from_user_input(text)
        (x,), (y,) = transform("EPSG:4326", crs, [lon], [lat])
        (sx,), (sy,) = transform("EPSG:4326", SINUSOIDAL_PROJ4, [lon], [lat])
        (tx,), (ty,) = transform(SINUSOIDAL_PROJ4, crs, [sx], [sy])  # a tile's warp
        (back,), (_,) = transform(crs, "EPSG:4326", [x], [y])  # its overview
        if not all(map(math.isfinite, (x, y, tx, ty, back))):
            return f"GDAL cannot transform lon/lat or MODIS's sinusoidal grid to {text!r}"
        with MemoryFile() as raw:  # as the tile stage writes a tile: a GeoTIFF, copied to a COG's bytes
            with raw.open(driver="GTiff", width=1, height=1, count=1, dtype="uint8", crs=crs,
                          transform=Affine(1.0, 0.0, x, 0.0, -1.0, y)) as tile:
                tile.write(np.zeros((1, 1, 1), dtype="uint8"))
            with raw.open() as tile, MemoryFile() as cog:
                rasterio.shutil.copy(tile, cog.name, driver="COG")
                written = bytes(cog.read())
        with MemoryFile(written) as memory, memory.open() as tile:
            if tile.crs is None:
                return f"a GeoTIFF cannot hold {text!r}: GDAL writes no CRS into the tile"
    except Exception as exc:  # rasterio's CRSError, GDAL's errors: whatever it is, the tile could not be made
        return f"GDAL (rasterio) cannot use {text!r}: {str(exc)[:200]}"
    return ""


@dataclass(frozen=True)
class GridSpec:
    """A target grid: square tiles of ``tile_size`` CRS units, aligned on the CRS origin,
    of pixels ``resolution`` CRS units wide. ``crs`` NATIVE means the MODIS tiles."""

    crs: str = "EPSG:4326"
    tile_size: float = 1.0
    resolution: float = 0.005

    @property
    def native(self) -> bool:
        return self.crs == NATIVE

    @property
    def pixels(self) -> int:
        return round(self.tile_size / self.resolution)

    def _ranges(self, west: float, south: float, east: float, north: float) -> tuple[range, range]:
        """The columns and rows of the target tiles that intersect a lon/lat box."""
        xmin, ymin, xmax, ymax = _from_lonlat(self.crs).transform_bounds(west, south, east, north, densify_pts=21)
        if not all(map(math.isfinite, (xmin, ymin, xmax, ymax))):
            raise ValueError(f"the region cannot be expressed in {self.crs}")
        s = self.tile_size
        cols = range(math.floor(xmin / s), max(math.floor(xmin / s) + 1, math.ceil(xmax / s)))
        rows = range(math.floor(ymin / s), max(math.floor(ymin / s) + 1, math.ceil(ymax / s)))
        return cols, rows

    def count_for_lonlat_box(self, west: float, south: float, east: float, north: float) -> int:
        """How many target tiles intersect a lon/lat box, without making them (for a box
        across ±180°, both halves': at most one column more than there are)."""
        if west > east:
            return self.count_for_lonlat_box(west, south, 180.0, north) + self.count_for_lonlat_box(
                -180.0, south, east, north)
        cols, rows = self._ranges(west, south, east, north)
        return (cols.stop - cols.start) * (rows.stop - rows.start)  # len() fails past 2**63

    def tiles_for_lonlat_box(self, west: float, south: float, east: float, north: float) -> list[TargetTile]:
        """The target tiles that intersect a lon/lat box; west > east: the box crosses ±180°,
        and is cut there into its two halves."""
        if west > east:
            found = self.tiles_for_lonlat_box(west, south, 180.0, north)
            seen = set(found)
            return found + [t for t in self.tiles_for_lonlat_box(-180.0, south, east, north) if t not in seen]
        cols, rows = self._ranges(west, south, east, north)
        return [self.tile(c, r) for r in reversed(rows) for c in cols]

    def tile(self, col: int, row: int) -> TargetTile:
        """The tile of column ``col`` and row ``row`` (from the CRS origin, in tiles)."""
        return TargetTile(self, f"x{col:+05d}y{row:+05d}", col, row)

    def tile_at(self, west: float, south: float) -> TargetTile:
        """The tile whose south-west corner is (``west``, ``south``): a tile's file knows its
        bounds, not its name."""
        return self.tile(round(west / self.tile_size), round(south / self.tile_size))

    def native_tile(self, tile: Tile) -> TargetTile:
        return TargetTile(self, tile.name, tile.h, tile.v)


@dataclass(frozen=True)
class TargetTile:
    """One tile of a target grid: its name, bounds, transform, shape and MODIS sources."""

    grid: GridSpec
    name: str
    col: int
    row: int

    def bounds(self) -> tuple[float, float, float, float]:
        """(west, south, east, north) in the grid's CRS."""
        if self.grid.native:
            return Tile(self.col, self.row).bounds()
        s = self.grid.tile_size
        return (self.col * s, self.row * s, (self.col + 1) * s, (self.row + 1) * s)

    def sources(self) -> list[Tile]:
        """The MODIS tiles whose pixels this target tile needs (on land, in the grid)."""
        if self.grid.native:
            return [Tile(self.col, self.row)]
        return list(_sources(self))

    def reads(self) -> list[Tile]:
        """The MODIS tiles this target tile's warp reads: its :meth:`sources` and each tile
        within :data:`REACH_METRES` of its footprint, whose edge pixels a kernel wider than a
        pixel (bilinear, cubic, average) reads across a MODIS tile's edge, so that no seam
        shows there (``reprojection``). A superset: the warp reads only the pixels it needs."""
        if self.grid.native:
            return self.sources()
        return list(_reads(self))


@lru_cache(maxsize=4096)
def _sources(target: TargetTile) -> tuple[Tile, ...]:
    """A target tile's MODIS tiles, found by projecting a lattice of its points: the same
    for every day and product of a request, which asks for them once per task row."""
    west, south, east, north = target.bounds()
    line = np.linspace(0.0, 1.0, EDGE_SAMPLES)
    u, v = np.meshgrid(line, line)  # the edges and a lattice inside
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


@lru_cache(maxsize=4096)
def _reads(target: TargetTile) -> tuple[Tile, ...]:
    """A target tile's sources and the MODIS tiles near its footprint: points of its outline,
    at most half :data:`REACH_METRES` apart on the sinusoidal plane (the footprint's nearest
    point to a tile it does not cover is on its outline), each moved by twice the reach in
    the eight directions, name the tiles they land in."""
    west, south, east, north = target.bounds()
    unit = 111_320.0 if CRS.from_user_input(target.grid.crs).is_geographic else 1.0
    side = max(east - west, north - south) * unit
    count = int(min(4096, max(EDGE_SAMPLES, math.ceil(8 * side / REACH_METRES))))  # 4× for the plane's shear
    line = np.linspace(0.0, 1.0, count)
    ones = np.ones(count)
    xs = np.concatenate([west + (east - west) * line, east * ones, west + (east - west) * line, west * ones])
    ys = np.concatenate([south * ones, south + (north - south) * line, north * ones, south + (north - south) * line])
    sx, sy = _to_sinusoidal(target.grid.crs).transform(xs, ys)
    ok = np.isfinite(sx) & np.isfinite(sy)
    steps = np.array([-2 * REACH_METRES, 0.0, 2 * REACH_METRES])
    dx, dy = (a.ravel() for a in np.meshgrid(steps, steps))
    px = (sx[ok][:, None] + dx[None, :]).ravel()
    py = (sy[ok][:, None] + dy[None, :]).ravel()
    h = np.floor((px - X_MIN) / TILE_SIZE).astype(int)
    v = np.floor((Y_MAX - py) / TILE_SIZE).astype(int)
    found = set(_sources(target))
    for hh, vv in set(zip(h.tolist(), v.tolist(), strict=True)):
        if 0 <= hh < TILES_H and 0 <= vv < TILES_V and Tile(hh, vv).has_land_pixels():
            found.add(Tile(hh, vv))
    return tuple(sorted(found))


def native_transform(tile: Tile, pixels: int) -> Affine:
    """The geotransform of a MODIS tile at ``pixels`` per side (2400 at 500 m)."""
    xmin, _, _, ymax = tile.bounds()
    size = TILE_SIZE / pixels
    return Affine(size, 0.0, xmin, 0.0, -size, ymax)
