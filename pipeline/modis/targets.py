"""The output grid of a request: its target tiles, and which MODIS source tiles each needs.

By default a request's region is cut into geographic lon/lat tiles (EPSG:4326) of a chosen
size and resolution; another CRS may be asked for if a tile can be made and drawn in it
(:func:`crs_problem`). A region given as MODIS tiles is processed on the native grid: each
target tile is a MODIS tile and its own single source.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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


def lonlat_bounds(crs: str, bounds: str | Sequence[float]) -> tuple[float, float, float, float]:
    """A target tile's bounds (``west,south,east,north`` in its CRS, as text or numbers) in degrees."""
    west, south, east, north = (float(v) for v in (bounds.split(",") if isinstance(bounds, str) else bounds))
    return _lonlat_bounds(crs, west, south, east, north)


@lru_cache(maxsize=4096)
def _lonlat_bounds(crs: str, west: float, south: float, east: float, north: float) -> tuple[float, float, float, float]:
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
    # its sources, when found for many tiles at once (:func:`with_sources`)
    found: tuple[Tile, ...] | None = field(default=None, compare=False, repr=False)

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
        return list(self.found if self.found is not None else _sources(self))

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
    """One target tile's MODIS tiles: the same for every day and product of a request,
    which asks for them once per task row."""
    return sources_of(target.grid, [target])[0]


def with_sources(targets: list[TargetTile]) -> list[TargetTile]:
    """The targets, each carrying its MODIS tiles, found for all of them at once."""
    by_grid: dict[GridSpec, list[int]] = {}
    for index, target in enumerate(targets):
        if not target.grid.native and target.found is None:
            by_grid.setdefault(target.grid, []).append(index)
    found = list(targets)
    for grid, indices in by_grid.items():
        for start in range(0, len(indices), _CHUNK):
            part = indices[start:start + _CHUNK]
            for index, sources in zip(part, sources_of(grid, [targets[i] for i in part]), strict=True):
                old = targets[index]
                found[index] = TargetTile(old.grid, old.name, old.col, old.row, sources)
    return found


# --- which MODIS tiles a target tile needs ------------------------------------------------
# A target tile's sources are the MODIS tiles (on land, in the grid) that the points of a
# lattice of EDGE_SAMPLES × EDGE_SAMPLES over it (its edges and corners included) fall in,
# once projected to the sinusoidal grid. Projecting every point of every tile costs 4,096
# points a tile: 50,000 tiles took minutes. :func:`sources_of` finds the same tiles from far
# fewer points: it looks at a block of the lattice (at first the whole tile) through its four
# corners, and needs no more of it when every MODIS tile its points could fall in (the
# corners' box in sinusoidal metres, widened by half its size) is one that a point of the
# target already fell in; else it splits the block in four, down to blocks of a few points,
# which it projects whole. A block whose corners fall off the projection's domain is empty
# if no point of its edges falls on it (and no point of the Earth lies within it). Every
# point it projects is a lattice point, projected as the lattice's own is, so that a point on
# a MODIS tile's edge falls on the same side of it. tests/test_sources.py compares the two.
_LEAF = 2  # a block at most this many lattice steps a side is projected whole
_BEND = 4.0  # how far from its corners' surface a block's points may be, in its middle's distance from it
_SPREAD = 0.05  # and as a share of its size
_SLACK_M = 1.0  # and in metres at least: a point within it of a MODIS tile's edge may fall either side
_LARGEST = TILE_SIZE / 4  # a block whose corners span more (in sinusoidal metres) is split
_CHUNK = 20_000  # target tiles looked at together (bounds the arrays: a row of 648 flags each)
_LINE = np.linspace(0.0, 1.0, EDGE_SAMPLES)
_CELLS = TILES_H * TILES_V


@cache
def _land() -> np.ndarray:
    """Per MODIS tile (h × TILES_V + v), whether it has land pixels."""
    return np.array([tile.has_land_pixels() for tile in _tiles()])


@cache
def _tiles() -> list[Tile]:
    """Every MODIS tile, by h × TILES_V + v."""
    return [Tile(h, v) for h in range(TILES_H) for v in range(TILES_V)]


@lru_cache(maxsize=64)
def _probes(crs: str) -> tuple[np.ndarray, np.ndarray]:
    """Points of the Earth in the grid's CRS (every 10° of lon/lat that it can show)."""
    lon, lat = np.meshgrid(np.arange(-180.0, 180.1, 10.0), np.arange(-90.0, 90.1, 10.0))
    x, y = _from_lonlat(crs).transform(lon.ravel(), lat.ravel())
    ok = np.isfinite(x) & np.isfinite(y)
    return np.asarray(x)[ok], np.asarray(y)[ok]


class _Lattice:
    """The lattice points of a set of target tiles, and the MODIS tiles they fell in
    (``hit``: a row per target, a flag per MODIS tile)."""

    def __init__(self, grid: GridSpec, targets: list[TargetTile]) -> None:
        s = grid.tile_size
        cols = np.array([t.col for t in targets], dtype=np.int64)
        rows = np.array([t.row for t in targets], dtype=np.int64)
        # as TargetTile.bounds() computes them, to the last bit
        self.west, self.east = cols.astype(np.float64) * s, (cols + 1).astype(np.float64) * s
        self.south, self.north = rows.astype(np.float64) * s, (rows + 1).astype(np.float64) * s
        self.transformer = _to_sinusoidal(grid.crs)
        self.hit = np.zeros((len(targets), _CELLS), dtype=bool)

    def xy(self, t: np.ndarray, i: np.ndarray, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Lattice points in the grid's CRS, as the lattice of the whole tile holds them."""
        return (self.west[t] + (self.east[t] - self.west[t]) * _LINE[i],
                self.south[t] + (self.north[t] - self.south[t]) * _LINE[j])

    def project(self, t: np.ndarray, i: np.ndarray, j: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Lattice points in sinusoidal metres (inf: off the projection); the MODIS tiles
        they fall in are hit."""
        sx, sy = self.transformer.transform(*self.xy(t, i, j))
        sx, sy = np.asarray(sx, dtype=np.float64), np.asarray(sy, dtype=np.float64)
        self._hit(t, sx, sy)
        return sx, sy

    def _hit(self, t: np.ndarray, sx: np.ndarray, sy: np.ndarray) -> None:
        ok = np.isfinite(sx) & np.isfinite(sy)
        h = np.floor((sx[ok] - X_MIN) / TILE_SIZE)
        v = np.floor((Y_MAX - sy[ok]) / TILE_SIZE)
        inside = (h >= 0) & (h < TILES_H) & (v >= 0) & (v < TILES_V)
        cell = h[inside].astype(np.int64) * TILES_V + v[inside].astype(np.int64)
        land = _land()[cell]
        self.hit[t[ok][inside][land], cell[land]] = True


def sources_of(grid: GridSpec, targets: list[TargetTile]) -> list[tuple[Tile, ...]]:
    """The MODIS tiles each target tile needs (see above): those the points of its lattice
    fall in, found without projecting most of them."""
    if not targets:
        return []
    lattice = _Lattice(grid, targets)
    last = EDGE_SAMPLES - 1
    count = len(targets)
    t = np.arange(count, dtype=np.int64)
    i0, i1 = np.zeros(count, dtype=np.int64), np.full(count, last, dtype=np.int64)
    j0, j1 = i0.copy(), i1.copy()
    while len(t):
        leaf = (i1 - i0 <= _LEAF) & (j1 - j0 <= _LEAF)
        if leaf.any():
            _project_whole(lattice, t[leaf], i0[leaf], i1[leaf], j0[leaf], j1[leaf])
        t, i0, i1, j0, j1 = (a[~leaf] for a in (t, i0, i1, j0, j1))
        if not len(t):
            break
        sx, sy = (a.reshape(4, -1) for a in lattice.project(
            np.tile(t, 4), np.concatenate([i0, i1, i0, i1]), np.concatenate([j0, j0, j1, j1])))
        finite = np.isfinite(sx) & np.isfinite(sy)
        split = ~finite.all(axis=0)  # off the domain in part: look closer
        off = ~finite.any(axis=0)
        if off.any():  # wholly off, unless its edges or the Earth say otherwise
            split[off] = _may_touch(lattice, grid.crs, t[off], i0[off], i1[off], j0[off], j1[off])
        on = finite.all(axis=0)
        split[on] = _may_add(lattice, t[on], i0[on], i1[on], j0[on], j1[on], sx[:, on], sy[:, on])
        line = split & ((i0 == i1) | (j0 == j1))  # a line looked at closer: each of its points
        if line.any():
            _project_line(lattice, t[line], i0[line], i1[line], j0[line], j1[line])
        t, i0, i1, j0, j1 = (a[split & ~line] for a in (t, i0, i1, j0, j1))
        t, i0, i1, j0, j1 = _split(t, i0, i1, j0, j1)
    tiles, found = _tiles(), [list[Tile]() for _ in targets]
    for row, cell in zip(*(a.tolist() for a in np.nonzero(lattice.hit)), strict=True):
        found[row].append(tiles[cell])
    return [tuple(f) for f in found]


def _may_add(lattice: _Lattice, t: np.ndarray, i0: np.ndarray, i1: np.ndarray, j0: np.ndarray, j1: np.ndarray,
             sx: np.ndarray, sy: np.ndarray) -> np.ndarray:
    """Per block whose corners all project (``sx``, ``sy``: 4 × blocks): whether its other
    points might fall in a MODIS tile (on land) that no point of its target has fallen in
    yet. Its points lie near the surface the corners span (bilinear in the lattice's
    indices), as far from it as its middle point is, four times over, and a twentieth of
    the block's size; a block whose middle is farther than a quarter of its size, or larger
    than a quarter of a MODIS tile, is looked at closer whatever it holds."""
    ic, jc = (i0 + i1) // 2, (j0 + j1) // 2
    mx, my = lattice.project(t, ic, jc)
    a = np.divide(ic - i0, i1 - i0, out=np.zeros(len(t)), where=i1 > i0)  # a line: one side has no span
    b = np.divide(jc - j0, j1 - j0, out=np.zeros(len(t)), where=j1 > j0)
    weights = np.stack([(1 - a) * (1 - b), a * (1 - b), (1 - a) * b, a * b])
    off_surface = np.hypot(mx - (weights * sx).sum(axis=0), my - (weights * sy).sum(axis=0))
    xmin, xmax, ymin, ymax = sx.min(axis=0), sx.max(axis=0), sy.min(axis=0), sy.max(axis=0)
    extent = np.maximum(xmax - xmin, ymax - ymin)
    margin = _BEND * off_surface + _SPREAD * extent + _SLACK_M
    more = ~np.isfinite(off_surface) | (off_surface > extent / 4) | (extent > _LARGEST)
    h_lo = np.floor((xmin - margin - X_MIN) / TILE_SIZE)
    h_hi = np.floor((xmax + margin - X_MIN) / TILE_SIZE)
    v_lo = np.floor((Y_MAX - ymax - margin) / TILE_SIZE)
    v_hi = np.floor((Y_MAX - ymin + margin) / TILE_SIZE)
    land = _land()
    for dh in (0, 1):  # a block no larger than a quarter of a MODIS tile reaches 2 × 2 of them at most
        for dv in (0, 1):
            h, v = h_lo + dh, v_lo + dv
            inside = (h <= h_hi) & (v <= v_hi) & (h >= 0) & (h < TILES_H) & (v >= 0) & (v < TILES_V) & ~more
            cell = np.where(inside, h * TILES_V + v, 0).astype(np.int64)
            more |= inside & land[cell] & ~lattice.hit[t, cell]
    return np.asarray(more, dtype=bool)


def _may_touch(lattice: _Lattice, crs: str, t: np.ndarray, i0: np.ndarray, i1: np.ndarray, j0: np.ndarray,
               j1: np.ndarray) -> np.ndarray:
    """Per block whose corners are all off the projection's domain: whether a point of it
    might be on it — one on its edges is, or a point of the Earth lies within the block
    (the whole domain might)."""
    span = int(max((i1 - i0).max(), (j1 - j0).max()))
    steps = np.arange(span + 1)
    rows = len(t)
    ii = np.minimum(i0[:, None] + steps, i1[:, None])
    jj = np.minimum(j0[:, None] + steps, j1[:, None])
    ring_t = np.repeat(t, 4 * (span + 1))
    ring_i = np.concatenate([ii, ii, np.repeat(i0[:, None], span + 1, 1), np.repeat(i1[:, None], span + 1, 1)], 1)
    ring_j = np.concatenate([np.repeat(j0[:, None], span + 1, 1), np.repeat(j1[:, None], span + 1, 1), jj, jj], 1)
    sx, sy = lattice.project(ring_t, ring_i.ravel(), ring_j.ravel())
    touched = (np.isfinite(sx) & np.isfinite(sy)).reshape(rows, -1).any(axis=1)
    px, py = _probes(crs)
    x0, y0 = lattice.xy(t, i0, j0)
    x1, y1 = lattice.xy(t, i1, j1)
    for start in range(0, len(px), 64):
        bx, by = px[start:start + 64], py[start:start + 64]
        touched |= ((bx >= x0[:, None]) & (bx <= x1[:, None]) & (by >= y0[:, None]) & (by <= y1[:, None])).any(axis=1)
    return np.asarray(touched, dtype=bool)


def _project_whole(lattice: _Lattice, t: np.ndarray, i0: np.ndarray, i1: np.ndarray, j0: np.ndarray,
                   j1: np.ndarray) -> None:
    steps = np.arange(_LEAF + 1)
    ii = np.minimum(i0[:, None, None] + steps[None, None, :], i1[:, None, None])
    jj = np.minimum(j0[:, None, None] + steps[None, :, None], j1[:, None, None])
    ii, jj = np.broadcast_arrays(ii, jj)
    lattice.project(np.broadcast_to(t[:, None, None], ii.shape).ravel(), ii.ravel(), jj.ravel())


def _project_line(lattice: _Lattice, t: np.ndarray, i0: np.ndarray, i1: np.ndarray, j0: np.ndarray,
                  j1: np.ndarray) -> None:
    steps = np.arange(int(max((i1 - i0).max(), (j1 - j0).max())) + 1)
    ii, jj = np.minimum(i0[:, None] + steps, i1[:, None]), np.minimum(j0[:, None] + steps, j1[:, None])
    lattice.project(np.broadcast_to(t[:, None], ii.shape).ravel(), ii.ravel(), jj.ravel())


def _split(t: np.ndarray, i0: np.ndarray, i1: np.ndarray, j0: np.ndarray,
           j1: np.ndarray) -> tuple[np.ndarray, ...]:
    """Blocks to look at closer: a whole tile in its four edges and its inside (a MODIS
    tile's edge may lie on a tile's edge, as lon/lat tiles' on whole tens of degrees: each
    of its points is then looked at along that edge alone), any other block in two along
    each side longer than a leaf's (sharing the middle line)."""
    last = EDGE_SAMPLES - 1
    whole = (i0 == 0) & (i1 == last) & (j0 == 0) & (j1 == last)
    wt = t[whole]
    zero, end = np.zeros(len(wt), dtype=np.int64), np.full(len(wt), last, dtype=np.int64)
    one, inner = zero + 1, end - 1
    peeled = [(wt, zero, end, zero, zero), (wt, zero, end, end, end), (wt, zero, zero, zero, end),
              (wt, end, end, zero, end), (wt, one, inner, one, inner)]
    halves = _halves(*(a[~whole] for a in (t, i0, i1, j0, j1)))
    return tuple(np.concatenate([p[k] for p in peeled] + [halves[k]]) for k in range(5))


def _halves(t: np.ndarray, i0: np.ndarray, i1: np.ndarray, j0: np.ndarray,
            j1: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each block in two along each side longer than a leaf's (sharing the middle line)."""
    im = np.where(i1 - i0 > _LEAF, (i0 + i1) // 2, i1)
    jm = np.where(j1 - j0 > _LEAF, (j0 + j1) // 2, j1)
    parts = [(t, i0, im, j0, jm), (t, im, i1, j0, jm), (t, i0, im, jm, j1), (t, im, i1, jm, j1)]
    keep = [np.ones(len(t), dtype=bool), im < i1, jm < j1, (im < i1) & (jm < j1)]
    return tuple(np.concatenate([p[k][m] for p, m in zip(parts, keep, strict=True)]) for k in range(5))


@lru_cache(maxsize=4096)
def _reads(target: TargetTile) -> tuple[Tile, ...]:
    """A target tile's sources and the MODIS tiles near its footprint: points of its outline,
    at most half :data:`REACH_METRES` apart on the sinusoidal plane (the footprint's nearest
    point to a tile it does not cover is on its outline), each moved by twice the reach in
    the eight directions, name the tiles they land in."""
    west, south, east, north = target.bounds()
    unit = 111_320.0 if _geographic(target.grid.crs) else 1.0
    side = max(east - west, north - south) * unit
    count = int(min(4096, max(EDGE_SAMPLES, math.ceil(8 * side / REACH_METRES))))  # 4× for the plane's shear
    line = np.linspace(0.0, 1.0, count)
    ones = np.ones(count)
    xs = np.concatenate([west + (east - west) * line, east * ones, west + (east - west) * line, west * ones])
    ys = np.concatenate([south * ones, south + (north - south) * line, north * ones, south + (north - south) * line])
    sx, sy = _to_sinusoidal(target.grid.crs).transform(xs, ys)
    ok = np.isfinite(sx) & np.isfinite(sy)
    px = (sx[ok][:, None] + _REACH_DX[None, :]).ravel()
    py = (sy[ok][:, None] + _REACH_DY[None, :]).ravel()
    h = np.floor((px - X_MIN) / TILE_SIZE)
    v = np.floor((Y_MAX - py) / TILE_SIZE)
    inside = (h >= 0) & (h < TILES_H) & (v >= 0) & (v < TILES_V)
    hit = np.zeros(_CELLS, dtype=bool)  # per MODIS tile, as _land() (a set of a few: no sort)
    hit[h[inside].astype(np.int64) * TILES_V + v[inside].astype(np.int64)] = True
    tiles = _tiles()
    found = set(target.sources())  # found with the others (with_sources), or alone
    found.update(tiles[cell] for cell in np.flatnonzero(hit & _land()).tolist())
    return tuple(sorted(found))


# each point of a target's outline moved by twice the reach in the eight directions (and not)
_REACH_DX, _REACH_DY = (a.ravel() for a in np.meshgrid(*[np.array([-2 * REACH_METRES, 0.0, 2 * REACH_METRES])] * 2))


@lru_cache(maxsize=64)
def _geographic(crs: str) -> bool:
    return bool(CRS.from_user_input(crs).is_geographic)


def native_transform(tile: Tile, pixels: int) -> Affine:
    """The geotransform of a MODIS tile at ``pixels`` per side (2400 at 500 m)."""
    xmin, _, _, ymax = tile.bounds()
    size = TILE_SIZE / pixels
    return Affine(size, 0.0, xmin, 0.0, -size, ymax)
