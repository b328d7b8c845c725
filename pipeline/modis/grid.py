"""The MODIS sinusoidal tile grid: which tiles hHHvVV cover a lon/lat box.

Sphere radius 6371007.181 m, 36 × 18 tiles of 1111950.5197665 m, 2400 pixels at 500 m.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

RADIUS = 6371007.181
TILE_SIZE = 1111950.5197665
TILES_H = 36
TILES_V = 18
TILE_PIXELS_500M = 2400
X_MIN = -TILES_H / 2 * TILE_SIZE  # west edge of h00
Y_MAX = TILES_V / 2 * TILE_SIZE  # north edge of v00

TILE_PATTERN = re.compile(r"^h(\d\d)v(\d\d)$")


@dataclass(frozen=True, order=True)
class Tile:
    h: int
    v: int

    def __post_init__(self) -> None:
        if not (0 <= self.h < TILES_H and 0 <= self.v < TILES_V):
            raise ValueError(f"tile h{self.h:02d}v{self.v:02d} is outside the MODIS grid")

    @classmethod
    def parse(cls, text: str) -> Tile:
        match = TILE_PATTERN.match(text)
        if not match:
            raise ValueError(f"{text!r} is not a MODIS tile name like h09v05")
        return cls(int(match[1]), int(match[2]))

    @property
    def name(self) -> str:
        return f"h{self.h:02d}v{self.v:02d}"

    def bounds(self) -> tuple[float, float, float, float]:
        """(xmin, ymin, xmax, ymax) in sinusoidal metres."""
        x0 = X_MIN + self.h * TILE_SIZE
        y1 = Y_MAX - self.v * TILE_SIZE
        return (x0, y1 - TILE_SIZE, x0 + TILE_SIZE, y1)

    def has_land_pixels(self) -> bool:
        """Whether any part of the tile lies on the globe (the sinusoid's edges leave the
        corner tiles of the grid empty)."""
        xmin, ymin, xmax, ymax = self.bounds()
        lat_near_equator = min(abs(ymin), abs(ymax)) if ymin * ymax > 0 else 0.0
        half_width = math.pi * RADIUS * math.cos(lat_near_equator / RADIUS)
        return xmax > -half_width and xmin < half_width


def tiles_for_bbox(west: float, south: float, east: float, north: float) -> list[Tile]:
    """The tiles that intersect a lon/lat box (west < east, south < north, degrees)."""
    found: set[Tile] = set()
    y_north, y_south = math.radians(north) * RADIUS, math.radians(south) * RADIUS
    v_first = max(0, int((Y_MAX - y_north) // TILE_SIZE))
    v_last = min(TILES_V - 1, int((Y_MAX - y_south) // TILE_SIZE))
    if (Y_MAX - y_south) % TILE_SIZE == 0 and v_last > v_first:
        v_last -= 1  # the box only touches the next row's edge
    for v in range(v_first, v_last + 1):
        band_top = min(north, math.degrees((Y_MAX - v * TILE_SIZE) / RADIUS))
        band_bottom = max(south, math.degrees((Y_MAX - (v + 1) * TILE_SIZE) / RADIUS))
        # In the band, x = R·lon·cos(lat): its extremes are at the latitudes where cos is
        # largest (nearest the equator) or smallest (farthest from it).
        near = 0.0 if band_bottom <= 0 <= band_top else min(abs(band_top), abs(band_bottom))
        far = max(abs(band_top), abs(band_bottom))
        xs = [
            RADIUS * math.radians(lon) * math.cos(math.radians(lat))
            for lon in (west, east)
            for lat in (near, far)
        ]
        h_first = max(0, int((min(xs) - X_MIN) // TILE_SIZE))
        h_last = min(TILES_H - 1, int((max(xs) - X_MIN) // TILE_SIZE))
        for h in range(h_first, h_last + 1):
            tile = Tile(h, v)
            if tile.has_land_pixels():
                found.add(tile)
    return sorted(found)


def locate(lon: float, lat: float, pixels: int) -> tuple[Tile, int, int]:
    """The MODIS tile holding a lon/lat point, and the row and column of the pixel holding it
    on that tile's grid of ``pixels`` per side (the product's own: 2400 at 500 m). A point on
    a tile's east or south edge is the next tile's; the grid's last row and column keep
    theirs."""
    x = math.radians(lon) * RADIUS * math.cos(math.radians(lat))
    y = math.radians(lat) * RADIUS
    h = min(TILES_H - 1, max(0, math.floor((x - X_MIN) / TILE_SIZE)))
    v = min(TILES_V - 1, max(0, math.floor((Y_MAX - y) / TILE_SIZE)))
    tile = Tile(h, v)
    xmin, _, _, ymax = tile.bounds()
    size = TILE_SIZE / pixels
    col = min(pixels - 1, max(0, math.floor((x - xmin) / size)))
    row = min(pixels - 1, max(0, math.floor((ymax - y) / size)))
    return tile, row, col
