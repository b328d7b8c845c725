"""Blobs made once: a cached source or reprojected tile is read back (and checked against its
stored MD5); a missing one is made by exactly one of the tasks that want it at the same
time — the one that creates its marker (create-if-absent, under ``names.MARKER_PREFIX``)
— while the others wait for it. The maker touches its marker every :data:`TOUCH_S` while it
works, so a marker untouched for :data:`STALE_S` is a maker that died (a killed worker): it
is taken over, and the tasks waiting on it are held up by seconds, not minutes. A dead
maker's marker that no task comes back for (its task was cancelled) is removed by the
sweep (:func:`sweep_markers`): the markers share one prefix, so it lists only them.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.core.rest import HttpRequest
from azure.storage.blob import BlobClient, ContainerClient
from azure.storage.blob.aio import BlobServiceClient as AsyncBlobServiceClient
from azure.storage.blob.aio import ContainerClient as AsyncContainerClient

from pipeline.failures import FailureClass, StageFailure
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.storage.transfer import Transfers, md5_of

TOUCH_S = 5.0  # a live maker refreshes its marker this often
STALE_S = 30.0  # a marker untouched this long belongs to a maker that died
WAIT_S = 900.0  # the longest a task waits for another's maker
POLL_S = 0.5
PEEKS_AT_ONCE = 32  # reads in flight when many cached blobs are looked at together (``Looks``)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cached:
    name: str
    md5: bytes
    data: bytes | None  # None when only its existence was asked for and it was already there
    made: bool  # whether this call made it


def _read(transfers: Transfers, container: ContainerClient, name: str, want_data: bool) -> Cached | None:
    """The cached blob, or None. Asked only whether it is there, it reads its first byte:
    a read is what storage records as an access (a look at its properties is not), and the
    retention rule keeps a cached blob by when it was last used (``costs.keep_days``); the
    answer carries the whole blob's MD5 all the same."""
    try:
        if not want_data:
            return _peek(container, name)
        data, md5 = transfers.download(container, name)
    except ResourceNotFoundError:
        return None
    return Cached(name, md5, data, False)


def _peek(container: ContainerClient, name: str) -> Cached:
    """The blob's MD5 by a read of its first byte (ResourceNotFoundError if it is not there)."""
    props = container.get_blob_client(name).download_blob(offset=0, length=1).properties
    return Cached(name, bytes(props.content_settings.content_md5 or b""), None, False)


class Looks:
    """Looks at many cached blobs at once, as :func:`ensure` looks at a blob it does not need
    the bytes of (a read of the first byte, an access to the retention rule): on one
    asynchronous client and its event loop, kept for the block (``with Looks(clients) as
    looks``), so that a planning page's looks at its sources and then at its tiles share
    their connections; :data:`PEEKS_AT_ONCE` reads in flight, no thread per read."""

    def __init__(self, clients: Clients) -> None:
        self._clients = clients
        self._runner = asyncio.Runner()
        self._opened = AsyncExitStack()
        self._service: AsyncBlobServiceClient | None = None

    def __enter__(self) -> Looks:
        try:
            self._service = self._runner.run(self._opened.enter_async_context(self._clients.async_blob_service()))
        except BaseException:
            self._runner.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._runner.run(self._opened.aclose())
        finally:
            self._runner.close()

    def present(self, container: str, wanted: Iterable[str]) -> dict[str, bytes]:
        """Of the blobs ``wanted`` in ``container``, those surely there and whole: their MD5s.
        A blob missing, one whose read failed, one stored without an MD5 or one whose marker
        says a maker is at work is left out: whoever asks makes or reads it the ordinary way."""
        assert self._service is not None, "Looks is used in a with block"
        wanted = sorted(set(wanted))
        if not wanted:
            return {}
        found = self._runner.run(self._look(self._service.get_container_client(container), wanted))
        return {name: md5 for name, md5 in zip(wanted, found, strict=True) if md5}

    @staticmethod
    async def _look(blobs: AsyncContainerClient, wanted: list[str]) -> list[bytes]:
        making = {blob.name.removeprefix(names.MARKER_PREFIX)
                  async for blob in blobs.list_blobs(name_starts_with=names.MARKER_PREFIX)}
        gate = asyncio.Semaphore(PEEKS_AT_ONCE)

        async def look(name: str) -> bytes:
            if name in making:
                return b""
            try:
                async with gate:
                    return await _apeek(blobs, name)
            except Exception as exc:  # missing, or unreadable now: the ordinary way will tell
                if not isinstance(exc, ResourceNotFoundError):
                    log.info("cached %s not looked at: %s", name, exc)
                return b""

        return await asyncio.gather(*(look(name) for name in wanted))


async def _apeek(blobs: AsyncContainerClient, name: str) -> bytes:
    """:func:`_peek` on the asynchronous client: the blob's MD5 (the whole blob's, which a
    ranged read names in ``x-ms-blob-content-md5``), by a read of its first byte;
    ResourceNotFoundError if it is not there. The request goes through the client's own
    pipeline (its authentication, its retries) but not through the SDK's downloader, which
    makes a client per blob and decodes every header of the answer into its properties: a
    look costs a third less CPU this way (``python -m bench.looks``), and a repeat is mostly
    looks."""
    base, _, query = blobs.url.partition("?")
    request = HttpRequest("GET", f"{base}/{quote(name, safe='~/')}" + (f"?{query}" if query else ""),
                          headers={"x-ms-range": "bytes=0-0", "x-ms-version": blobs.api_version})
    response = await blobs._client._send_request(request, stream=True)  # streamed: not decoded
    try:
        await response.read()  # the byte, or the error's text: read, the connection goes back to the pool
        if response.status_code == 404:
            raise ResourceNotFoundError(response=response)
        response.raise_for_status()
        return base64.b64decode(response.headers.get("x-ms-blob-content-md5", ""))
    finally:
        await response.close()


def touch(container: ContainerClient, name: str) -> None:
    """Write the blob's metadata: a write, from which a retention by time since the last
    write (products') counts again, so a cached blob a new job names lives as long as that
    job's own. ResourceNotFoundError if the blob is gone."""
    container.get_blob_client(name).set_blob_metadata({"reused": f"{time.time():.0f}"})


def ensure(transfers: Transfers, container: ContainerClient, name: str, make: Callable[[], bytes],
           content_type: str, want_data: bool = True, owner: str = "", tidy: bool = False) -> Cached:
    """The blob ``name``: read if it exists, else made by ``make`` — once, whoever asks.

    ``owner`` (the task asking) is written on the marker. ``tidy``: the caller is a later
    attempt of that task, so an earlier attempt may have died as this blob's maker. Its
    marker is then taken over at once, not after :data:`STALE_S` (were it alive after all,
    both make the same content-addressed blob, and the second upload stands down); and a
    marker beside a blob that exists — a maker that died after its upload — is removed."""
    marker = container.get_blob_client(names.marker_blob(name))
    give_up = time.monotonic() + WAIT_S
    while time.monotonic() < give_up:
        found = _read(transfers, container, name, want_data)
        if found is not None:
            if tidy:
                _remove(marker, tries=1)
            return found
        try:
            marker.upload_blob(b"", overwrite=False, metadata={"owner": owner} if owner else None)
        except ResourceExistsError:
            _take_over_if_stale(marker, owner if tidy else "")
            time.sleep(POLL_S)
            continue
        try:
            if (found := _read(transfers, container, name, want_data)) is not None:
                return found  # made between our read and our marker
            with _touching(marker):
                data = make()
                try:
                    md5 = transfers.upload(container, name, data, content_type, overwrite=False)
                except ResourceExistsError:  # a maker we took for dead finished after all: same content address
                    md5 = md5_of(data)
            return Cached(name, md5, data, True)
        finally:
            _remove(marker)
    raise StageFailure(FailureClass.OPERATION_TIMEOUT, f"waited {WAIT_S:.0f} s for {name} to be made")


@contextmanager
def _touching(marker: BlobClient) -> Iterator[None]:
    """Keep the marker fresh (its Last-Modified) while the block runs."""
    done = threading.Event()

    def touch() -> None:
        while not done.wait(TOUCH_S):
            try:
                marker.set_blob_metadata({"touched": f"{time.time():.0f}"})
            except Exception as exc:  # a missed touch only risks a duplicate maker, never a wrong blob
                log.warning("could not touch %s: %s", marker.blob_name, exc)

    toucher = threading.Thread(target=touch, name="cache-marker", daemon=True)
    toucher.start()
    try:
        yield
    finally:
        done.set()
        toucher.join()


def _remove(marker: BlobClient, tries: int = 8) -> None:
    """Delete our marker, waiting out a storage outage (a restart, a cut connection) rather
    than leave it: a marker whose blob exists is never looked at again."""
    for attempt in range(tries):
        try:
            marker.delete_blob()
            return
        except ResourceNotFoundError:
            return
        except Exception as exc:
            if attempt == tries - 1:
                log.warning("marker %s left behind: %s", marker.blob_name, exc)
                return
            time.sleep(min(2.0**attempt, 15.0))


def _take_over_if_stale(marker: BlobClient, dead_owner: str = "") -> None:
    """Remove the marker if its maker is dead: untouched for STALE_S, or ``dead_owner``'s."""
    try:
        props = marker.get_blob_properties()
    except ResourceNotFoundError:
        return
    ours = bool(dead_owner) and (props.metadata or {}).get("owner") == dead_owner
    if ours or (datetime.now(UTC) - props.last_modified).total_seconds() > STALE_S:
        try:
            marker.delete_blob(etag=props.etag, match_condition=MatchConditions.IfNotModified)
        except (ResourceNotFoundError, ResourceModifiedError):
            pass


def sweep_markers(containers: Iterable[ContainerClient], ended: Callable[[str], bool]) -> int:
    """Remove the markers whose maker is gone — untouched for :data:`STALE_S`, or held by an
    owner for which ``ended`` (its task is terminal) — so that none outlives its task when
    no other task comes to take it over. Safe even were the maker alive after all: a second
    maker makes the same content-addressed blob, and its upload stands down. Returns how
    many were removed."""
    removed = 0
    for container in containers:
        for blob in container.list_blobs(name_starts_with=names.MARKER_PREFIX, include=["metadata"]):
            owner = (blob.metadata or {}).get("owner", "")
            stale = (datetime.now(UTC) - blob.last_modified).total_seconds() > STALE_S
            if stale or (owner and ended(owner)):
                try:
                    container.delete_blob(blob.name, etag=blob.etag, match_condition=MatchConditions.IfNotModified)
                    removed += 1
                except (ResourceNotFoundError, ResourceModifiedError):
                    pass
    return removed
