"""The catalog searches of a request's plan, at planning: each tile task's granules found.

A real MODIS granule's name carries its production timestamp: it is found by searching the
catalog (``pipeline.modis.catalogs``), never guessed. The planner searches once per product
per job, over the lon/lat box of its target tiles (widened by the reach of their warps,
which read a neighbouring MODIS tile's edge pixels: ``TargetTile.reads``) and the span of its
periods, and each tile task keeps its granules in its params: those of the MODIS tiles it
covers and, if it has any, those within its reach. A (tile, date) the catalog does not have
(an ocean tile, an outage) is simply absent there, and a task left with none of the tiles it
covers ends NO_DATA.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from datetime import date

from pipeline.modis.catalogs import CollectionMissing, catalog_for, footprint
from pipeline.modis.granules import Granule, pick
from pipeline.modis.grid import RADIUS
from pipeline.modis.products import CATALOG, last_day
from pipeline.modis.targets import REACH_METRES, TargetTile
from pipeline.planning import RequestError
from pipeline.reduction import CLIMATOLOGY_STAGE
from pipeline.requests.expansion import Spec, TaskSpec
from pipeline.settings import Settings


def resolve(settings: Settings, specs: Sequence[Spec], *stages: str) -> list[Spec]:
    """The task specs with each task's of ``stages`` granules attached: one search per product
    over the lon/lat box of its target tiles and the span of its periods. A pure function
    of the catalog's answers: a planner that runs it again (a plan message handled twice, a
    planner that died mid-search) gets the same granules. RequestError (``products``) if the
    catalog holds no collection of a product the request names: the planner refuses the job."""
    wanted: dict[str, list[TaskSpec]] = {}
    for spec in specs:
        if isinstance(spec, TaskSpec) and spec.stage in stages:
            wanted.setdefault(spec.product, []).append(spec)
    if not wanted:
        return list(specs)
    found: dict[tuple[str, str, date], Granule] = {}
    for name, tasks in wanted.items():
        product = CATALOG[name]
        box = widened(footprint({target for t in tasks for target in t.targets}),
                      math.degrees(3 * REACH_METRES / RADIUS))
        days = sorted({t.date for t in tasks})
        last = last_day(product, days[-1])  # a year's last composite ends with the year
        try:
            searched = catalog_for(settings, product).search(product, box, days[0], last)
        except CollectionMissing as exc:  # every task would end NO_DATA, and the job "succeed"
            raise RequestError(422, "products", str(exc)) from None
        found |= pick(g for g in searched if g.product == name)
    out: list[Spec] = []
    for spec in specs:
        if isinstance(spec, TaskSpec) and spec.stage in stages:
            spec = replace(spec, granules=tuple(found[key] for tile in _reads(spec, found)
                                                 if (key := (spec.product, tile, spec.date)) in found))
        out.append(spec)
    return out


def _reads(spec: TaskSpec, found: dict[tuple[str, str, date], Granule]) -> list[str]:
    """The MODIS tiles whose granules a tile task reads: of each target tile of its batch
    that covers a tile the catalog has, the tiles within its reach (``TargetTile.reads``)."""
    tiles: dict[str, None] = {}
    for target in spec.targets:
        if any((spec.product, tile.name, spec.date) in found for tile in target.sources()):
            tiles |= dict.fromkeys(tile.name for tile in target.reads())
    return list(tiles)


def widened(box: tuple[float, float, float, float], degrees: float) -> tuple[float, float, float, float]:
    """A lon/lat box (west > east: across ±180°) widened by ``degrees`` of latitude on each
    side and by what ``degrees`` of sinusoidal x is in longitude at its farthest latitude
    (the plane's shear included: a step in latitude moves x by up to pi × tan(lat) of it), at
    most the globe."""
    west, south, east, north = box
    south, north = max(-90.0, south - degrees), min(90.0, north + degrees)
    far = math.radians(min(89.0, max(abs(south), abs(north))))
    spread = degrees * (1.0 + math.pi * math.tan(far)) / math.cos(far)
    width = (east - west) % 360.0 if east != west else 0.0
    if (west, east) == (-180.0, 180.0) or width + 2 * spread >= 360.0:
        return -180.0, south, 180.0, north
    return (west - spread + 180.0) % 360.0 - 180.0, south, (east + spread + 180.0) % 360.0 - 180.0, north


def with_sources(specs: list[Spec]) -> list[Spec]:
    """The specs with each climatology's sources: the granules of every baseline date it
    reads (its content address, computed at planning, so that a job finds one made before)."""
    out = []
    for spec in specs:
        if isinstance(spec, TaskSpec) and spec.stage == CLIMATOLOGY_STAGE:
            dates = [d for first, count in spec.deps for seq in range(first, first + count)
                     if isinstance(d := specs[seq], TaskSpec)]
            read = ((d.date.isoformat(), tuple(sorted(g.id for g in _of_target(d, spec.target)))) for d in dates)
            spec = replace(spec, sources=tuple(sorted(read)))
        out.append(spec)
    return out


def _of_target(spec: TaskSpec, target: TargetTile) -> list[Granule]:
    """The granules a tile task reads for one target tile of its batch (as a task of that
    target alone would have them)."""
    if not spec.batch:
        return list(spec.granules or ())
    reads = {tile.name for tile in spec.place_reads()[spec.targets.index(target)]}
    return [g for g in spec.granules or () if g.tile in reads]
