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
            polygon = Polygon(ring(rings[0]), [ring(r) for r in rings[1:]])
            found.append(polygon if polygon.is_valid else shapely.make_valid(polygon))
    return found, STRtree(found)


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
