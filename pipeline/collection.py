"""Collection: a granule's layer file in the ``sources`` container — fetched from its feed
once (whatever number of tasks want it at the same time), verified before it is cached, and
recorded in the ``sources`` table."""

from __future__ import annotations

import json
from datetime import date

from rasterio.errors import RasterioIOError
from rasterio.io import MemoryFile

from pipeline import cache, names
from pipeline.clients import Clients
from pipeline.failures import FailureClass, StageFailure
from pipeline.feeds import Fetched, feed_for, granule_name, source_url
from pipeline.products import CATALOG
from pipeline.targets import is_modis_sinusoidal
from pipeline.tasks import now
from pipeline.transfer import md5_of


def template_for(clients: Clients, product: str) -> str:
    """The catalog's URL template for a product: BAGPIPE_FEEDS, else BAGPIPE_FEED_URL."""
    settings = clients.settings
    template = json.loads(settings.feeds).get(product) if settings.feeds else None
    template = template or settings.feed_url
    if not template:
        raise StageFailure(FailureClass.SOURCE_DOWNLOAD, f"no feed is configured for {product} "
                           f"(set {names.SETTING_FEED_URL} or {names.SETTING_FEEDS})")
    return template


def verify(fetched: Fetched, product: str) -> bytes:
    """The fetched bytes if they are whole and the product's raster; else a classified failure."""
    data = fetched.data
    if fetched.length is not None and fetched.length != len(data):
        raise StageFailure(FailureClass.SOURCE_DOWNLOAD,
                           f"{fetched.url}: {len(data)} bytes arrived of {fetched.length}")
    if fetched.md5 is not None and fetched.md5 != md5_of(data):
        raise StageFailure(FailureClass.SOURCE_DOWNLOAD, f"{fetched.url}: MD5 does not match the feed's")
    if not data:
        raise StageFailure(FailureClass.BAD_SOURCE, f"{fetched.url}: an empty file is not a raster GDAL can read")
    layer = CATALOG[product].layer
    try:
        with MemoryFile(data) as memory, memory.open() as raster:
            problem = (
                "it has no coordinate system" if raster.crs is None
                else "it is not in the MODIS sinusoidal projection" if not is_modis_sinusoidal(raster.crs.to_dict())
                else f"its data type is {raster.dtypes[0]}, not {layer.dtype}" if raster.dtypes[0] != layer.dtype
                else None
            )
            raster.read(1)  # every block: a truncated file fails here
    except RasterioIOError as exc:
        raise StageFailure(FailureClass.BAD_SOURCE, f"{fetched.url}: not a raster GDAL can read ({exc})") from None
    if problem:
        raise StageFailure(FailureClass.BAD_SOURCE, f"{fetched.url}: {problem}")
    return data


def collect(clients: Clients, product: str, tile: str, day: date, want_data: bool = True,
            owner: str = "", retry: bool = False) -> cache.Cached:
    """The granule's layer file (its MD5, and its bytes if ``want_data``), from the cache
    or its feed (``owner``, ``retry``: the task asking, and whether this is a later attempt
    of it; see :func:`cache.ensure`)."""
    url = source_url(template_for(clients, product), product, tile, day)
    fetched: list[Fetched] = []

    def fetch() -> bytes:
        got = feed_for(url).fetch(url)
        fetched.append(got)
        return verify(got, product)

    blob = names.source_blob(product, tile, day, granule_name(product, tile, day))
    found = cache.ensure(clients.transfers, clients.sources, blob, fetch, "image/tiff", want_data,
                         owner=owner, tidy=retry)
    if found.made:
        clients.sources_table.upsert_entity({
            "PartitionKey": product, "RowKey": f"{tile}~{day.isoformat()}", "Blob": found.name, "Url": url,
            "Bytes": len(fetched[0].data), "MD5": found.md5.hex(), "FetchedAt": now(),
        })
    return found
