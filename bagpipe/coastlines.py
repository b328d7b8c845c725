"""Where the imitated planet has land: Natural Earth's 1:50m land polygons (the portal's map
data, ``land-50m.json`` of world-atlas), rasterized on each MODIS tile's own grid.

A pixel is land where its centre lies inside a land polygon (its edges straight in
longitude and latitude): the polygons, cut to the tile and their edges into pieces of 0.01°,
are projected onto the MODIS sinusoidal plane and rasterized there (a piece drawn straight on
the plane strays from the one drawn straight in longitude and latitude by millimetres). A
pixel's being land is thereby a function of where it is, not of its tile: two tiles agree
along their shared edge, and the sea is sea in every product, at its resolution, to the
pixel. Antarctica and Greenland are land (their ice is snow); lakes
are land (Natural Earth's land has no holes for them).
"""

from __future__ import annotations

import json
from functools import cache, lru_cache
from pathlib import Path

import numpy as np
import shapely
import shapely.affinity
from rasterio import features
from rasterio.transform import from_origin
from shapely.geometry import Polygon, box
from shapely.strtree import STRtree

from pipeline.modis.grid import RADIUS, Tile
from pipeline.modis.targets import native_transform

ROOT = Path(__file__).resolve().parents[1]
LAND = (ROOT / "portal" / "vendor" / "land-50m.json", ROOT / "node_modules" / "world-atlas" / "land-50m.json")
GRID_DEGREES = 0.25  # the global land-fraction grid's cells (:func:`land_fraction`)
SEGMENT_DEGREES = 0.01  # polygon edges are cut to this before they are projected (:func:`land_mask`)


def land_file() -> Path:
    path = next((p for p in LAND if p.exists()), None)
    if path is None:
        raise FileNotFoundError("no land-50m.json: run make setup (world-atlas from npm)")
    return path


@cache
def polygons() -> tuple[list[Polygon], STRtree]:
    """Natural Earth's land as lon/lat polygons (decoded from the TopoJSON's quantized,
    delta-encoded arcs) and a spatial index of them."""
    topo = json.loads(land_file().read_text())
    (sx, sy), (tx, ty) = topo["transform"]["scale"], topo["transform"]["translate"]
    arcs = []
    for arc in topo["arcs"]:
        points = np.cumsum(np.array(arc, dtype=float), axis=0)
        arcs.append(np.column_stack([points[:, 0] * sx + tx, points[:, 1] * sy + ty]))

    def ring(indexes: list[int]) -> np.ndarray:
        parts = [arcs[i] if i >= 0 else arcs[~i][::-1] for i in indexes]
        return np.concatenate([parts[0]] + [p[1:] for p in parts[1:]])

    found = []
    for geometry in topo["objects"]["land"]["geometries"]:
        for rings in geometry["arcs"]:
            found.extend(_on_the_plane([ring(r) for r in rings]))
    return found, STRtree(found)


def _on_the_plane(rings: list[np.ndarray]) -> list[Polygon]:
    """A spherical polygon (its outer ring, then its holes) as lon/lat polygons within ±180°.

    The TopoJSON's rings are drawn on the sphere, as d3 reads them: a ring that crosses the
    antimeridian steps from 180° to -180° (Afro-Eurasia at Chukotka, Wrangel Island, a Fiji
    island), and Antarctica's goes once round the south pole. Taken as planar rings they
    cross themselves, and mending them left most of Siberia and Chukotka sea. Each ring's
    longitudes are made continuous (past ±180° where it crosses), a ring round a pole is
    closed through it (the ring of a pole's own, world-atlas's round the south pole, is no
    hole), and the polygon is cut at ±180° and each side turned back within ±180°."""
    (outer, _), holes = _continuous(rings[0]), [_continuous(r) for r in rings[1:]]
    polygon = shapely.make_valid(Polygon(outer, [hole for hole, polar in holes if not polar]))
    pieces = []
    for west, shift in ((-540.0, 360.0), (-180.0, 0.0), (180.0, -360.0)):
        side = polygon.intersection(box(west, -90.0, west + 360.0, 90.0))
        if not side.is_empty:
            pieces.append(shapely.affinity.translate(side, shift))
    return [p for piece in pieces for p in getattr(piece, "geoms", [piece])
            if isinstance(p, Polygon) and p.area > 0]


def _continuous(ring: np.ndarray) -> tuple[np.ndarray, bool]:
    """A ring's points with no step of more than 180° in longitude (those past ±180° beyond
    it), and whether it goes round a pole (its last point a turn east or west of its first):
    such a ring is closed through that pole."""
    steps = np.diff(ring[:, 0])
    turns = np.concatenate([[0.0], np.cumsum(np.where(steps > 180, -360.0, np.where(steps < -180, 360.0, 0.0)))])
    found = ring + np.column_stack([turns, np.zeros(len(ring))])
    if abs(turns[-1]) < 180:
        return found, False
    pole = -90.0 if ring[:, 1].mean() < 0 else 90.0
    return np.concatenate([found, [[found[-1, 0], pole], [found[0, 0], pole], found[0]]]), True


def _sinusoidal(coords: np.ndarray) -> np.ndarray:
    lat = np.radians(coords[:, 1])
    return np.column_stack([RADIUS * np.radians(coords[:, 0]) * np.cos(lat), RADIUS * lat])


def tile_lonlat_box(tile: Tile) -> tuple[float, float, float, float]:
    """The lon/lat box around the part of a tile that lies on the globe."""
    x0, y0, x1, y1 = tile.bounds()
    lat0, lat1 = np.degrees(y0 / RADIUS), np.degrees(y1 / RADIUS)
    widest = max(np.cos(np.radians(lat)) for lat in (lat0, lat1, min(max(0.0, lat0), lat1)))
    narrowest = max(min(np.cos(np.radians(lat0)), np.cos(np.radians(lat1))), 1e-9)
    lons = [x / (RADIUS * np.radians(1.0) * c) for x in (x0, x1) for c in (widest, narrowest)]
    return (max(-180.0, min(lons)), float(lat0), min(180.0, max(lons)), float(lat1))


@lru_cache(maxsize=8)
def land_mask(tile: str, pixels: int) -> np.ndarray:
    """Whether each pixel of a tile's grid (``pixels`` a side) is land (read-only: shared)."""
    parsed = Tile.parse(tile)
    shapes, index = polygons()
    west, south, east, north = tile_lonlat_box(parsed)
    near = (shapely.clip_by_rect(shapes[i], west - 0.1, south - 0.1, east + 0.1, north + 0.1)
            for i in index.query(box(west, south, east, north)))
    projected = [shapely.transform(shapely.segmentize(p, SEGMENT_DEGREES), _sinusoidal) for p in near if not p.is_empty]
    if not projected:
        found = np.zeros((pixels, pixels), dtype=bool)
    else:
        found = features.rasterize(((p, 1) for p in projected), out_shape=(pixels, pixels),
                                   transform=native_transform(parsed, pixels), dtype="uint8").astype(bool)
    found.setflags(write=False)
    return found


@cache
def land_fraction() -> np.ndarray:
    """The globe's land on a 0.25° lon/lat grid (rows from 90°N, columns from 180°W), 1 where a
    cell's centre is land (read-only: shared)."""
    shapes, _ = polygons()
    rows, cols = round(180 / GRID_DEGREES), round(360 / GRID_DEGREES)
    found = features.rasterize(((s, 1) for s in shapes), out_shape=(rows, cols),
                               transform=from_origin(-180, 90, GRID_DEGREES, GRID_DEGREES),
                               dtype="uint8").astype(np.float32)
    found.setflags(write=False)
    return found
