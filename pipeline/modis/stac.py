"""The STAC API catalog (``pystac-client``): Planetary Computer's by default.

Planetary Computer keeps MODIS 6.1 as one collection per kind of product (``modis-10A2-061``
holds Terra's MOD10A2 and Aqua's MYD10A2 items), an item per granule with an asset per layer
(a COG) and the original HDF4 file (asset ``hdf``), hrefs to its Blob containers. An item's
granule is named by its ``hdf`` asset's file name (which carries the production timestamp;
the item id does not), else by a layer file's; Terra and Aqua are told apart by that name's
short name (``MOD``/``MYD``), the way NASA names them.
"""

from __future__ import annotations

from datetime import date
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from pystac_client import Client
from pystac_client.exceptions import APIError

from pipeline.modis.catalogs import Box, CatalogError, split
from pipeline.modis.granules import HDF, Granule
from pipeline.modis.products import Product
from pipeline.redact import redact

TIMEOUT_S = 60.0
PAGE = 250  # items per page (Planetary Computer serves up to 1000)


class StacCatalog:
    def __init__(self, url: str, timeout: float = TIMEOUT_S) -> None:
        self.url = url
        self.timeout = timeout

    def search(self, product: Product, box: Box, start: date, end: date) -> list[Granule]:
        boxes = split(box)
        where: dict[str, Any] = {"bbox": list(box)} if len(boxes) == 1 else {"intersects": {
            "type": "MultiPolygon", "coordinates": [[_ring(b)] for b in boxes]}}
        try:
            client = Client.open(self.url, timeout=self.timeout)
            search = client.search(collections=[product.stac_collection], limit=PAGE,
                                   datetime=f"{start.isoformat()}T00:00:00Z/{end.isoformat()}T23:59:59Z", **where)
            items = list(search.items_as_dicts())
        except (APIError, OSError, ValueError) as exc:  # requests' errors are OSErrors
            raise CatalogError(f"STAC search of {product.stac_collection} at {redact(self.url)} failed: "
                               f"{redact(str(exc))[:300]}") from None
        found = []
        for item in items:
            granule = granule_of(item, product)
            if granule is not None and granule.product == product.name:
                found.append(granule)
        return found


def granule_of(item: dict[str, Any], product: Product) -> Granule | None:
    """The granule a STAC item describes: its name, and the hrefs of the product's layers."""
    assets = item.get("assets", {})
    name = None
    if HDF in assets:
        name = PurePosixPath(urlsplit(assets[HDF]["href"]).path).name.removesuffix(".hdf")
    else:
        for layer in product.layer_names:
            if layer in assets:
                stem = PurePosixPath(urlsplit(assets[layer]["href"]).path).stem
                name = stem.removesuffix(f"_{layer}")
                break
    files = {layer: assets[layer]["href"] for layer in product.layer_names if layer in assets}
    if HDF in assets:
        files[HDF] = assets[HDF]["href"]
    return Granule.named(name or str(item.get("id", "")), files)


def _ring(box: Box) -> list[list[float]]:
    west, south, east, north = box
    return [[west, south], [east, south], [east, north], [west, north], [west, south]]
