"""The STAC API catalog (``pystac-client``): Planetary Computer's by default.

Planetary Computer keeps MODIS 6.1 as one collection per kind of product (``modis-10A2-061``
holds Terra's MOD10A2 and Aqua's MYD10A2 items), an item per granule with an asset per layer
(a COG) and the original HDF4 file (asset ``hdf``), hrefs to its Blob containers. An item's
granule is named by its ``hdf`` asset's file name (which carries the production timestamp;
the item id does not), else by a layer file's; Terra and Aqua are told apart by that name's
short name (``MOD``/``MYD``), the way NASA names them. Before it searches, it checks that the
catalog holds the collection (``GET /collections/{id}``): a wrong ``BAGPIPE_STAC_URL`` or a
retired collection fails the job at planning, where its search would have found nothing and
ended every task NO_DATA. Planetary Computer's subscription key goes with each request to
its hosts (``BAGPIPE_PC_SUBSCRIPTION_KEY``).
"""

from __future__ import annotations

from datetime import date
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import httpx
from pystac_client import Client
from pystac_client.exceptions import APIError
from requests import Request

from pipeline.modis.access import subscription_headers, unresolved
from pipeline.modis.catalogs import Box, CatalogError, CollectionMissing, split
from pipeline.modis.granules import HDF, Granule
from pipeline.modis.products import Product
from pipeline.modis.synthetic import is_synthetic
from pipeline.redact import redact
from pipeline.settings import env_name

TIMEOUT_S = 60.0
PAGE = 250  # items per page (Planetary Computer serves up to 1000)


class StacCatalog:
    def __init__(self, url: str, timeout: float = TIMEOUT_S, subscription_key: str = "") -> None:
        """``subscription_key``: Planetary Computer's, sent to its hosts only (``access.subscription_headers``)."""
        self.url = url
        self.timeout = timeout
        self._key = unresolved(subscription_key, "pc_subscription_key")

    def _keyed(self, request: Request) -> Request:
        """A request of pystac-client's with the subscription key, if it goes to Planetary Computer."""
        url = request.url.decode() if isinstance(request.url, bytes) else request.url or ""
        if headers := subscription_headers(url, self._key):
            request.headers = {**(request.headers or {}), **headers}
        return request

    def check(self, product: Product) -> None:
        """The product's collection is the catalog's (``GET /collections/{id}``): a catalog
        without it would answer every search with nothing."""
        url = f"{self.url.rstrip('/')}/collections/{product.stac_collection}"
        try:
            response = httpx.get(url, headers=subscription_headers(url, self._key), timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise CatalogError(f"STAC API at {redact(self.url)} unreachable: {type(exc).__name__}") from None
        if response.status_code == 404:
            raise CollectionMissing(f"the STAC API at {redact(self.url)} has no collection {product.stac_collection} "
                                    f"({product.name}'s): is {env_name('stac_url')} the right catalog?")
        if response.status_code != 200:
            raise CatalogError(f"STAC API at {redact(self.url)} answered HTTP {response.status_code} for collection "
                               f"{product.stac_collection}")

    def search(self, product: Product, box: Box, start: date, end: date) -> list[Granule]:
        if product.stac_collection is None:
            raise CatalogError(f"{product.name} is in no STAC collection (NASA's CMR has it)")
        self.check(product)
        boxes = split(box)
        where: dict[str, Any] = {"bbox": list(box)} if len(boxes) == 1 else {"intersects": {
            "type": "MultiPolygon", "coordinates": [[_ring(b)] for b in boxes]}}
        try:
            client = Client.open(self.url, timeout=self.timeout, request_modifier=self._keyed)
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
    return Granule.named(name or str(item.get("id", "")), files, is_synthetic(item))


def _ring(box: Box) -> list[list[float]]:
    west, south, east, north = box
    return [[west, south], [east, south], [east, north], [west, north], [west, south]]
