"""A request's target tiles in batches: the places one tile task warps.

A tile task warps every target tile of its batch for one date and product (``tilestage``):
the batch's granules are fetched once, and its fixed costs — a message, a claim and a
commit, staging its sources — are paid once for all of its targets, so that a task
carries seconds of work rather than milliseconds. Each target tile keeps its own
content-addressed output, made from its own granules by the same warp as a task of that
tile alone would make it: its pixels and its name are the same whatever batch it was
warped in, and the cache, the STAC items and the reductions see one output per target tile
(``planning.places``).

Target tiles are grouped by the MODIS tile their centre lies in (they read the same
granules), groups joined north to south and west to east while they are neighbours and the
batch stays within :data:`MAX_TARGETS` targets and :data:`MAX_PIXELS` pixels. A tile task
counts itself off each reduction and climatology of its batch's targets in the transaction
that ends it, which holds at most 100 operations; the planner bounds a batch by the tasks
each target's tile tasks feed (``expansion``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

from pyproj import CRS, Transformer

from pipeline.modis.grid import TILE_SIZE, TILES_H, TILES_V, X_MIN, Y_MAX, Tile
from pipeline.modis.targets import TargetTile, sinusoidal

MAX_TARGETS = 32  # target tiles one tile task warps
MAX_PIXELS = 4_000_000  # target pixels (per layer) one tile task warps: a 2400 × 2400 target is a batch alone
MAX_FEEDS = 40  # waiting tasks one tile task counts itself off: two writes each, within a transaction's 100


@lru_cache(maxsize=64)
def _to_sinusoidal(crs: str) -> Transformer:
    return Transformer.from_crs(CRS.from_user_input(crs), sinusoidal(), always_xy=True)


def home(target: TargetTile) -> Tile:
    """The MODIS tile the target's centre lies in (else its first source)."""
    own = target.sources()
    if target.grid.native or not own:
        return own[0] if own else Tile(0, 0)
    west, south, east, north = target.bounds()
    x, y = _to_sinusoidal(target.grid.crs).transform((west + east) / 2, (south + north) / 2)
    if math.isfinite(x) and math.isfinite(y):
        h, v = math.floor((x - X_MIN) / TILE_SIZE), math.floor((Y_MAX - y) / TILE_SIZE)
        if 0 <= h < TILES_H and 0 <= v < TILES_V:
            return Tile(h, v)
    return own[0]


def pixels_of(target: TargetTile, native_pixels: int) -> int:
    """A target tile's pixels (per layer); ``native_pixels``: a side of the product's MODIS tile."""
    if target.grid.native:
        return native_pixels * native_pixels
    west, south, east, north = target.bounds()
    res = target.grid.resolution
    return round(abs(east - west) / res) * round(abs(north - south) / res)


def batches(targets: Sequence[TargetTile], native_pixels: int, most: int = MAX_TARGETS,
            pixels: int = MAX_PIXELS) -> list[tuple[TargetTile, ...]]:
    """``targets`` in batches of at most ``most`` targets and ``pixels`` pixels (a larger
    target alone): by the MODIS tile each one's centre lies in, north to south and west to
    east, each group's targets in their own order; a group joins the batch before it while
    they fit and their MODIS tiles are neighbours (they share granules)."""
    groups: dict[Tile, list[TargetTile]] = {}
    for target in targets:
        groups.setdefault(home(target), []).append(target)
    found: list[list[TargetTile]] = []
    size, last = 0, None
    for tile in sorted(groups, key=lambda t: (t.v, t.h)):
        apart = last is None or abs(tile.h - last.h) > 1 or abs(tile.v - last.v) > 1
        for target in groups[tile]:
            own = pixels_of(target, native_pixels)
            if apart or len(found[-1]) >= most or size + own > pixels:
                found.append([])
                size, apart = 0, False
            found[-1].append(target)
            size += own
        last = tile
    return [tuple(batch) for batch in found]
