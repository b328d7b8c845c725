"""NASA's Common Metadata Repository: granule search over its documented JSON API
(``/search/granules.json``), paged with ``CMR-Search-After``.

httpx rather than ``python-cmr``: that library sends its requests without a timeout (a
stalled connection would hold the planner forever) and adds nothing here but building the
query string. A granule is found by short name, version, bounding box (two boxes, OR-ed,
across ±180°) and temporal range; its file is the HDF4 link of rel ``…/data#`` on the DAAC
that holds the product (NSIDC for snow, LP DAAC for the others), fetched behind Earthdata
Login (:mod:`pipeline.modis.access`). Before it searches, it checks that CMR knows the
collection (``/search/collections.json`` by short name and version), which a granule search
of an unknown one does not say.
"""

from __future__ import annotations

from datetime import date
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import httpx

from pipeline.modis.catalogs import Box, CatalogError, CollectionMissing, split
from pipeline.modis.granules import HDF, Granule
from pipeline.modis.products import Product
from pipeline.modis.synthetic import is_synthetic
from pipeline.redact import redact
from pipeline.settings import env_name

TIMEOUT_S = 60.0
PAGE = 2000  # CMR's largest page
DATA_REL = "http://esipfed.org/ns/fedsearch/1.1/data#"
SEARCH_AFTER = "CMR-Search-After"


class CmrCatalog:
    def __init__(self, url: str, timeout: float = TIMEOUT_S) -> None:
        self.url = url.rstrip("/") + "/granules.json"
        self.collections_url = url.rstrip("/") + "/collections.json"
        self.timeout = timeout

    def check(self, product: Product) -> None:
        """CMR knows the product's collection (its short name and version): for one it does
        not, a granule search answers nothing rather than an error."""
        params = {"short_name": product.name, "version": product.cmr_version, "page_size": "1"}
        try:
            response = httpx.get(self.collections_url, params=params, headers={"Accept": "application/json"},
                                 timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise CatalogError(f"CMR at {redact(self.collections_url)} unreachable: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise CatalogError(f"CMR collection search of {product.name} at {redact(self.collections_url)} "
                               f"answered HTTP {response.status_code}")
        if not response.json().get("feed", {}).get("entry"):
            raise CollectionMissing(f"CMR at {redact(self.collections_url)} has no collection {product.name} "
                                    f"version {product.cmr_version}: is {env_name('cmr_url')} the right catalog?")

    def search(self, product: Product, box: Box, start: date, end: date) -> list[Granule]:
        self.check(product)
        params: list[tuple[str, str | int | float | bool | None]] = [
            ("short_name", product.name), ("version", product.cmr_version),
            ("temporal", f"{start.isoformat()}T00:00:00Z,{end.isoformat()}T23:59:59Z"),
            ("page_size", str(PAGE)), ("sort_key", "start_date"),
        ]
        boxes = split(box)
        params += [("bounding_box[]", ",".join(f"{v:g}" for v in b)) for b in boxes]
        if len(boxes) > 1:
            params.append(("options[bounding_box][or]", "true"))
        found: list[Granule] = []
        headers: dict[str, str] = {"Accept": "application/json"}
        with httpx.Client(timeout=self.timeout) as http:
            while True:
                try:
                    response = http.get(self.url, params=params, headers=headers)
                except httpx.HTTPError as exc:
                    raise CatalogError(f"CMR search of {product.name} at {redact(self.url)} failed: "
                                       f"{type(exc).__name__}") from None
                if response.status_code != 200:
                    raise CatalogError(f"CMR search of {product.name} at {redact(self.url)} answered "
                                       f"HTTP {response.status_code}: {redact(response.text)[:300]}")
                entries = response.json().get("feed", {}).get("entry", [])
                found += [g for g in map(granule_of, entries) if g is not None]
                after = response.headers.get(SEARCH_AFTER)
                if not after or len(entries) < PAGE:
                    return found
                headers[SEARCH_AFTER] = after


def granule_of(entry: dict[str, Any]) -> Granule | None:
    """The granule a CMR entry describes: its producer granule id and its HDF4 file."""
    hrefs = [link["href"] for link in entry.get("links", [])
             if link.get("rel") == DATA_REL and not link.get("inherited")
             and urlsplit(link.get("href", "")).scheme in ("https", "http") and link["href"].endswith(".hdf")]
    if not hrefs:
        return None
    name = str(entry.get("producer_granule_id") or PurePosixPath(urlsplit(hrefs[0]).path).name)
    return Granule.named(name.removesuffix(".hdf"), {HDF: hrefs[0]}, is_synthetic(entry))
