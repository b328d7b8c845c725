"""Where MODIS granules come from: a URL template per product (the source catalog) and one
small feed class per URL scheme — HTTP(S) archives, Azure Blob containers, FTP (the original
paper's feeds) and local directories.

A template names a granule by its product, collection, tile and date, as NASA's archives do,
e.g. ``https://host/MOLT/{product}.{collection}/{ymd}/{name}``. Fields: ``product``,
``collection``, ``tile``, ``year``, ``doy`` (3 digits), ``ymd`` (YYYY.MM.DD), ``layer`` and
``name`` (``MOD10A2.A2022033.h09v05.061.Maximum_Snow_Extent.tif``).
"""

from __future__ import annotations

import base64
import ftplib
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlsplit

import httpx
from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.storage.blob import BlobClient

from pipeline.failures import FailureClass, StageFailure
from pipeline.products import CATALOG

TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Fetched:
    """A source file as a feed delivered it, with the checks the feed offers."""

    url: str
    data: bytes
    length: int | None = None  # what the feed said the length is
    md5: bytes | None = None  # what the feed said the MD5 is


class SourceMissing(StageFailure):
    """The feed has no such granule (404, no such file)."""

    def __init__(self, url: str) -> None:
        super().__init__(FailureClass.SOURCE_DOWNLOAD, f"the feed has no {url}")


def granule_name(product: str, tile: str, day: date) -> str:
    spec = CATALOG[product]
    return f"{product}.A{day.year}{day.timetuple().tm_yday:03d}.{tile}.{spec.collection}.{spec.layer.name}.tif"


def source_url(template: str, product: str, tile: str, day: date) -> str:
    """The URL of one granule's layer file under a catalog template."""
    spec = CATALOG[product]
    return template.format(
        product=product, collection=spec.collection, tile=tile, year=f"{day.year:04d}",
        doy=f"{day.timetuple().tm_yday:03d}", ymd=day.strftime("%Y.%m.%d"), layer=spec.layer.name,
        name=granule_name(product, tile, day),
    )


class Feed(Protocol):
    def fetch(self, url: str) -> Fetched: ...


class HttpFeed:
    """HTTP(S): the length from Content-Length, the MD5 from Content-MD5 when sent."""

    def fetch(self, url: str) -> Fetched:
        try:
            response = httpx.get(url, timeout=TIMEOUT_S, follow_redirects=True)
        except httpx.HTTPError as exc:
            raise StageFailure(FailureClass.SOURCE_DOWNLOAD, f"{url}: {exc}") from exc
        if response.status_code == 404:
            raise SourceMissing(url)
        if response.status_code != 200:
            raise StageFailure(FailureClass.SOURCE_DOWNLOAD, f"{url}: HTTP {response.status_code}")
        length = response.headers.get("content-length")
        md5 = response.headers.get("content-md5")
        return Fetched(url, response.content, int(length) if length else None,
                       base64.b64decode(md5) if md5 else None)


class BlobFeed:
    """An Azure Blob container (``blob+https://account.blob.core.windows.net/container/...``,
    a SAS in the query if it is not public): the MD5 from the blob's properties."""

    def fetch(self, url: str) -> Fetched:
        real = url.removeprefix("blob+")
        try:
            downloader = BlobClient.from_blob_url(real).download_blob()
            data = downloader.readall()
        except ResourceNotFoundError:
            raise SourceMissing(url) from None
        except AzureError as exc:
            raise StageFailure(FailureClass.SOURCE_DOWNLOAD, f"{url}: {exc}") from exc
        md5 = downloader.properties.content_settings.content_md5
        return Fetched(url, data, downloader.properties.size, bytes(md5) if md5 else None)


class FtpFeed:
    """FTP (anonymous unless the URL carries a user): the length from SIZE."""

    def fetch(self, url: str) -> Fetched:
        parts = urlsplit(url)
        chunks: list[bytes] = []
        try:
            with ftplib.FTP(timeout=TIMEOUT_S) as ftp:
                ftp.connect(parts.hostname or "", parts.port or 21)
                ftp.login(unquote(parts.username or "anonymous"), unquote(parts.password or "bagpipe@"))
                ftp.voidcmd("TYPE I")
                path = unquote(parts.path)
                try:
                    length = ftp.size(path)
                except ftplib.error_perm:
                    raise SourceMissing(url) from None
                ftp.retrbinary(f"RETR {path}", chunks.append)
        except (ftplib.Error, OSError) as exc:
            raise StageFailure(FailureClass.SOURCE_DOWNLOAD, f"{url}: {exc}") from exc
        return Fetched(url, b"".join(chunks), length)


class LocalFeed:
    """A directory on this machine (``file:///data/modis/...``)."""

    def fetch(self, url: str) -> Fetched:
        path = Path(unquote(urlsplit(url).path))
        try:
            return Fetched(url, path.read_bytes())
        except FileNotFoundError:
            raise SourceMissing(url) from None
        except OSError as exc:
            raise StageFailure(FailureClass.SOURCE_DOWNLOAD, f"{url}: {exc}") from exc


FEEDS: dict[str, Feed] = {
    "http": HttpFeed(), "https": HttpFeed(), "blob+http": BlobFeed(), "blob+https": BlobFeed(),
    "ftp": FtpFeed(), "file": LocalFeed(),
}


def feed_for(url: str) -> Feed:
    """The feed that serves a URL, by its scheme."""
    scheme = urlsplit(url).scheme
    if scheme not in FEEDS:
        raise StageFailure(FailureClass.SOURCE_DOWNLOAD, f"no feed serves {scheme!r} URLs ({url})")
    return FEEDS[scheme]
