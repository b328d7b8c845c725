"""Collection: a granule's file in the ``sources`` container — fetched from where the catalog
found it once (whatever number of tasks want it at the same time), verified before it is
cached, and recorded in the ``sources`` table under its granule id.

A file is a layer's COG (a STAC asset) or the granule's HDF4 file (NASA's archive); both
are verified the same way: every block of the layers it is fetched for is read, in the MODIS
sinusoidal grid and the product's encoding (data type, and a scale that is the catalog's in
either convention).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from rasterio.errors import RasterioIOError
from rasterio.io import MemoryFile

from pipeline.failures import FailureClass, StageFailure
from pipeline.lifecycle.tasks import now
from pipeline.modis import hdf
from pipeline.modis.access import Fetched, access_for
from pipeline.modis.granules import HDF, Granule
from pipeline.modis.products import Product
from pipeline.modis.reprojection import EncodingMismatch, check_encoding
from pipeline.modis.targets import is_modis_sinusoidal
from pipeline.redact import redact
from pipeline.storage import cache, names
from pipeline.storage.clients import Clients
from pipeline.storage.transfer import md5_of


def file_name(granule: Granule, key: str) -> str:
    """The name a granule's file is cached under: the last part of its href."""
    return PurePosixPath(urlsplit(granule.href(key)).path).name or f"{granule.id}.{key}"


def source_blob(product: Product, granule: Granule, key: str) -> str:
    """Where a granule's file (``key``: a layer, or :data:`HDF`) is cached in ``sources``."""
    return names.source_blob(product.name, granule.id, file_name(granule, key))


def verify(fetched: Fetched, product: Product, layers: Sequence[str]) -> bytes:
    """The fetched bytes if they are whole and hold the product's ``layers``; else a
    classified failure."""
    data, url = fetched.data, redact(fetched.url)
    if fetched.length is not None and fetched.length != len(data):
        raise StageFailure(FailureClass.SOURCE_DOWNLOAD, f"{url}: {len(data)} bytes arrived of {fetched.length}")
    if fetched.md5 is not None and fetched.md5 != md5_of(data):
        raise StageFailure(FailureClass.SOURCE_DOWNLOAD, f"{url}: MD5 does not match the archive's")
    if not data:
        raise StageFailure(FailureClass.BAD_SOURCE, f"{url}: an empty file is not a raster bagpipe can read")
    try:
        problem = _hdf_problem(data, product, layers) if data[:4] == b"\x0e\x03\x13\x01" else \
            _cog_problem(data, product, layers)
    except EncodingMismatch as exc:
        problem = str(exc)
    if problem:
        raise StageFailure(FailureClass.BAD_SOURCE, f"{url}: {problem}")
    return data


def _cog_problem(data: bytes, product: Product, layers: Sequence[str]) -> str | None:
    layer = product.layer(layers[0])
    try:
        with MemoryFile(data) as memory, memory.open() as raster:
            if raster.crs is None:
                return "it has no coordinate system"
            if not is_modis_sinusoidal(raster.crs.to_dict()):
                return "it is not in the MODIS sinusoidal projection"
            check_encoding(layer, raster.dtypes[0], raster.scales[0], "the file")
            raster.read(1)  # every block: a truncated file fails here
    except RasterioIOError as exc:
        return f"not a raster GDAL can read ({exc})"
    return None


def _hdf_problem(data: bytes, product: Product, layers: Sequence[str]) -> str | None:
    with tempfile.NamedTemporaryFile(suffix=".hdf") as tmp:  # the HDF4 library reads files only
        tmp.write(data)
        tmp.flush()
        try:
            with hdf.Granule(Path(tmp.name)) as granule:
                for name in layers:
                    layer = product.layer(name)
                    check_encoding(layer, str(granule.dtype(name)), granule.scale(name), "the file")
                    granule.read(name)  # every chunk: a truncated file fails here
        except (hdf.NotModisGrid, KeyError) as exc:
            return f"not a MODIS HDF4-EOS granule with {', '.join(layers)} ({exc})"
        except Exception as exc:  # pyhdf's own errors on a damaged file
            return f"its HDF4 data cannot be read ({type(exc).__name__}: {exc})"
    return None


def collect(clients: Clients, product: Product, granule: Granule, key: str, layers: Sequence[str],
            want_data: bool = True, owner: str = "", retry: bool = False) -> cache.Cached:
    """One file of a granule (``key``: a layer, or :data:`HDF`), checked to hold ``layers``:
    its MD5, and its bytes if ``want_data``, from the cache or its archive (``owner``,
    ``retry``: the task asking, and whether this is a later attempt of it; see
    :func:`cache.ensure`)."""
    href = granule.href(key)
    fetched: list[Fetched] = []

    def fetch() -> bytes:
        got = access_for(clients.settings).fetch(href)
        fetched.append(got)
        return verify(got, product, layers)

    blob = source_blob(product, granule, key)
    found = cache.ensure(clients.transfers, clients.sources, blob, fetch,
                         "application/x-hdf" if key == HDF else "image/tiff", want_data, owner=owner, tidy=retry)
    if found.made:
        clients.sources_table.upsert_entity({
            "PartitionKey": product.name, "RowKey": f"{granule.id}~{key}", "Blob": found.name, "Url": href,
            "Tile": granule.tile, "Date": granule.day.isoformat(), "Bytes": len(fetched[0].data),
            "MD5": found.md5.hex(), "FetchedAt": now(),
        })
    return found
