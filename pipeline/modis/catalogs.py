"""Where granules are found: a catalog search, once per product per job, at planning.

A real MODIS granule's name carries its production timestamp
(``MOD10A2.A2022033.h09v05.061.2022042050729``): it is found by searching, never guessed.
Two catalogs stand behind one seam, chosen by ``BAGPIPE_CATALOG``: a STAC API
(:mod:`pipeline.modis.stac`, Planetary Computer's by default) and NASA's CMR (:mod:`pipeline.modis.cmr`).
NASA holds every product; a product Planetary Computer does not (MOD13A2, MCD12Q1: the
catalog's ``stac_collection`` is None) is searched on CMR whatever the setting, its files
fetched from NASA with the Earthdata token.
The planner resolves each tile task's (MODIS tile, date) pairs to granules before it writes
the task rows, and keeps them in the task's params; a (tile, date) the catalog does not have
(an ocean tile, an outage) is simply absent there, and a task left with none ends NO_DATA.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import date
from typing import Protocol

import numpy as np
from pyproj import Transformer

from pipeline.modis.granules import Granule
from pipeline.modis.products import Product
from pipeline.modis.targets import TargetTile
from pipeline.settings import Settings

Box = tuple[float, float, float, float]  # west, south, east, north; west > east crosses ±180°


class CatalogError(RuntimeError):
    """A catalog that could not be searched (its message names no credential)."""


class CollectionMissing(CatalogError):
    """The catalog answers, and does not hold the product's collection (a wrong catalog URL,
    a retired collection): its search would find nothing, and every task end NO_DATA. The
    job is refused at planning with this message."""


class Catalog(Protocol):
    def search(self, product: Product, box: Box, start: date, end: date) -> list[Granule]:
        """Every granule of the product intersecting ``box`` whose period overlaps [start, end]
        (all pages); CollectionMissing if the catalog has no collection of the product."""
        ...


def catalog_for(settings: Settings, product: Product) -> Catalog:
    """The catalog that holds the product: the deployment's, else (a product Planetary
    Computer does not have) NASA's."""
    if settings.catalog == "cmr" or product.stac_collection is None:
        from pipeline.modis.cmr import CmrCatalog

        return CmrCatalog(settings.cmr_url)
    from pipeline.modis.stac import StacCatalog

    return StacCatalog(settings.stac_url, subscription_key=settings.pc_subscription_key)


def footprint(targets: Iterable[TargetTile], samples: int = 16) -> Box:
    """The lon/lat box around target tiles, crossing ±180° (west > east) when they do."""
    lons, lats = [], []
    line = np.linspace(0.0, 1.0, samples)
    for target in targets:
        west, south, east, north = target.bounds()
        xs = np.concatenate([west + (east - west) * line, np.full(samples, east), west + (east - west) * line,
                             np.full(samples, west)])
        ys = np.concatenate([np.full(samples, south), south + (north - south) * line, np.full(samples, north),
                             south + (north - south) * line])
        crs = target.grid.crs if not target.grid.native else "+proj=sinu +R=6371007.181 +units=m +no_defs"
        lon, lat = _to_lonlat(crs).transform(xs, ys)
        ok = np.isfinite(lon) & np.isfinite(lat)
        lons.append(lon[ok])
        lats.append(lat[ok])
    lon, lat = np.concatenate(lons), np.concatenate(lats)
    if not lon.size:
        return (-180.0, -90.0, 180.0, 90.0)
    center = math.degrees(math.atan2(np.sin(np.radians(lon)).mean(), np.cos(np.radians(lon)).mean()))
    unwrapped = (lon - center + 180.0) % 360.0 + center - 180.0
    west, east = float(unwrapped.min()), float(unwrapped.max())
    if east - west >= 359.0:
        west, east = -180.0, 180.0

    def wrap(v: float) -> float:
        return (v + 180.0) % 360.0 - 180.0 if not -180.0 <= v <= 180.0 else v

    return (wrap(west), max(-90.0, float(lat.min())), wrap(east), min(90.0, float(lat.max())))


def split(box: Box) -> list[Box]:
    """A box crossing ±180° as the two boxes either side of it."""
    west, south, east, north = box
    return [box] if west <= east else [(west, south, 180.0, north), (-180.0, south, east, north)]


def _to_lonlat(crs: str) -> Transformer:
    return Transformer.from_crs(crs, "EPSG:4326", always_xy=True)
