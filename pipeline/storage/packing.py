"""Small outputs packed into few large blobs, read back by range.

A job of thousands of tiles has thousands of small outputs (a 1° tile at 0.005° is a few
tens of KiB); fetching them one request each is what makes a download across a WAN slow
(bench.transfer: packed is 28× faster on loopback, over 100× through a 30 ms WAN). At
completion the job's outputs of at most :data:`MEMBER_MAX` bytes are read concurrently with
the asynchronous blob client (many requests in flight on one event loop), a round at a time,
and each round staged as a block of a pack of up to :data:`PACK_MAX` bytes, ``products/{job}/packs/NNNN.pack``; the
manifest names each member's pack, offset, length and MD5. The originals stay where they
are (the tile cache serves other jobs, links to them keep working): packing only changes how
many requests a reader needs. Readers fetch the members they want by coalesced byte ranges
and check each member's MD5 — ``bagpipe results`` does it, so unpacking is invisible.

Packs of cached tiles only are content-addressed: their members' names are their content
addresses, so the same outputs make the same packs. Those are written once, under their
content address (``names.pack_cache_blob``, in products), with an index of their members;
a repeat of a request finds the index and names the same packs. Each reuse writes their
metadata, so products' retention (so many days after a blob was last written) keeps them
as long as the newest job that names them.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from azure.core.exceptions import AzureError, HttpResponseError, ResourceNotFoundError
from azure.storage.blob import BlobBlock, ContentSettings
from azure.storage.blob.aio import BlobServiceClient as AsyncBlobServiceClient

from pipeline.failures import FailureClass, StageFailure, error_code
from pipeline.storage import cache, names
from pipeline.storage.clients import Clients
from pipeline.storage.transfer import MiB, md5_of

log = logging.getLogger(__name__)
MEMBER_MAX = 1 * MiB  # outputs up to this size are packed
PACK_MAX = 64 * MiB  # a pack is closed once it reaches this size
IN_FLIGHT = 32  # concurrent reads of small blobs on the event loop
READ_BATCH = 32  # outputs read per round: packing holds at most this many members at once
RANGE_GAP = 64 * 1024  # members closer than this are read in one range
RANGE_MAX = 8 * MiB  # the largest range read at once


@dataclass(frozen=True)
class Member:
    """Where one output lives inside a pack."""

    pack: str  # blob name in products
    offset: int
    length: int
    md5: str  # hex


@dataclass(frozen=True)
class Output:
    """An output to pack: its name on the task row and where its blob is."""

    name: str
    container: str
    blob: str


async def _read_small(service: AsyncBlobServiceClient, outputs: list[Output]) -> dict[str, bytes]:
    """The outputs of at most :data:`MEMBER_MAX` bytes, each checked against its stored
    Content-MD5; larger or missing ones are left out (one ranged read tells both)."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def read(output: Output) -> tuple[str, bytes | None]:
        async with gate:
            try:
                downloader = await service.get_blob_client(output.container, output.blob).download_blob(
                    offset=0, length=MEMBER_MAX + 1)
                data = await downloader.readall()
            except ResourceNotFoundError:
                return output.name, None
            except HttpResponseError as exc:
                if error_code(exc) != "InvalidRange":
                    raise
                return output.name, b""  # an empty blob has no byte 0 to range over
        if downloader.properties.size > MEMBER_MAX:
            return output.name, None
        stored = downloader.properties.content_settings.content_md5
        if stored and bytes(stored) != md5_of(data):
            raise StageFailure(FailureClass.CORRUPT_BLOB, f"{output.container}/{output.blob}: content does not "
                               "match its stored MD5")
        return output.name, data

    return {name: data for name, data in await asyncio.gather(*(read(o) for o in outputs)) if data is not None}


def read_small(clients: Clients, outputs: list[Output]) -> dict[str, bytes]:
    """Many small blobs read at once by the async client (one event loop, many requests in
    flight on one connection pool), each verified; larger or missing ones left out."""

    async def run() -> dict[str, bytes]:
        async with clients.async_blob_service() as service:
            return await _read_small(service, outputs)

    return asyncio.run(run())


class _PackWriter:
    """One pack after another, written as they are read: each round's members staged as a
    block of the current pack, the pack committed (with its MD5) when the next would pass
    :data:`PACK_MAX`. Block ids are the rounds' numbers, so writing again writes the same.
    The packs are the job's, or (``address``: cached tiles only) their content address's."""

    def __init__(self, clients: Clients, job: str, address: str | None) -> None:
        self.clients, self.job, self.address = clients, job, address
        self.number = self.offset = 0
        self.blocks: list[str] = []
        self.md5 = hashlib.md5(usedforsecurity=False)

    @property
    def name(self) -> str:
        return names.pack_cache_blob(self.address, self.number) if self.address else names.pack_blob(
            self.job, self.number)

    def stage(self, parts: list[bytes]) -> None:
        data = b"".join(parts)
        if data:
            block = base64.b64encode(f"{len(self.blocks):08d}".encode()).decode()
            self.clients.products.get_blob_client(self.name).stage_block(block, data, validate_content=True)
            self.blocks.append(block)
            self.md5.update(data)

    def close(self) -> None:
        """Commit the current pack (if it holds any member) and start the next."""
        if self.offset or self.blocks:
            self.clients.products.get_blob_client(self.name).commit_block_list(
                [BlobBlock(b) for b in self.blocks], content_settings=ContentSettings(
                    content_type="application/octet-stream", content_md5=bytearray(self.md5.digest())))
            self.number, self.offset, self.blocks = self.number + 1, 0, []
            self.md5 = hashlib.md5(usedforsecurity=False)


def pack(clients: Clients, job: str, outputs: Iterable[Output]) -> dict[str, Member]:
    """Write the job's small outputs into its packs; returns where each member is.
    Streamed: :data:`READ_BATCH` members are read at a time and staged at once as a block of
    their pack, so packing holds one round (at most :data:`READ_BATCH` × :data:`MEMBER_MAX`
    bytes) whatever the job's size. Deterministic (same outputs, same packs), so a
    completion retried after a crash rewrites the same blobs. Cached tiles only: the packs
    their content address names, made once (``cached``)."""
    ordered = sorted({o.name: o for o in outputs}.values(), key=lambda o: o.name)
    address = cache_address(clients, ordered)
    if address and (found := cached(clients, address)) is not None:
        return found

    async def run() -> dict[str, Member]:
        async with clients.async_blob_service() as service:  # one event loop and pool for every round
            return await _pack(service, _PackWriter(clients, job, address), ordered)

    members = asyncio.run(run())
    if address:
        _index(clients, address, members)
    return members


def cache_address(clients: Clients, ordered: list[Output]) -> str | None:
    """The content address of the packs of ``ordered`` if every one is a cached tile (named
    by its own content address), else None."""
    if not ordered or any(o.container != clients.tiles.container_name for o in ordered):
        return None
    said = json.dumps([MEMBER_MAX, PACK_MAX, READ_BATCH, [o.name for o in ordered]], separators=(",", ":"))
    return hashlib.sha256(said.encode()).hexdigest()


def cached(clients: Clients, address: str) -> dict[str, Member] | None:
    """The members of the packs made before for this content address, or None if their
    index is missing or a pack it names is gone (retention deletes each blob on its own
    day). The index and each pack are touched (their metadata written): kept for as long
    as the job that names them now."""
    index_blob = names.pack_cache_blob(address)
    try:
        index, _ = clients.transfers.download(clients.products, index_blob)
        members = {name: member_of(entry) for name, entry in json.loads(index).items()}
        for blob in [*sorted({m.pack for m in members.values()}), index_blob]:
            cache.touch(clients.products, blob)
    except ResourceNotFoundError:
        return None
    return members


def _index(clients: Clients, address: str, members: dict[str, Member]) -> None:
    """Name the packs just written for the next job of the same tiles (after them: an index
    names only whole packs). Only a saving: a write that fails changes nothing."""
    try:
        clients.transfers.upload(clients.products, names.pack_cache_blob(address),
                                 json.dumps(as_manifest(members)).encode(), "application/json")
    except AzureError as exc:
        log.info("packs %s not indexed: %s", address, exc)


async def _pack(service: AsyncBlobServiceClient, writer: _PackWriter, ordered: list[Output]) -> dict[str, Member]:
    """The rounds of :func:`pack` on one event loop; a round's block is staged by the sync
    client once its reads are done, when nothing else is in flight on the loop."""
    members: dict[str, Member] = {}
    for first in range(0, len(ordered), READ_BATCH):
        batch = ordered[first:first + READ_BATCH]
        found = await _read_small(service, batch)
        parts: list[bytes] = []
        for output in batch:
            data = found.pop(output.name, None)
            if data is None:
                continue
            if writer.offset + len(data) > PACK_MAX:
                writer.stage(parts)
                writer.close()
                parts = []
            members[output.name] = Member(writer.name, writer.offset, len(data), md5_of(data).hex())
            parts.append(data)
            writer.offset += len(data)
        writer.stage(parts)
        del found, parts
    writer.close()
    return members


def as_manifest(members: dict[str, Member]) -> dict[str, dict[str, object]]:
    return {name: asdict(member) for name, member in members.items()}


@dataclass(frozen=True)
class Span:
    """One ranged read of a pack covering several wanted members."""

    pack: str
    start: int
    end: int  # exclusive
    members: tuple[tuple[str, Member], ...]


def spans(wanted: dict[str, Member]) -> list[Span]:
    """Coalesce the wanted members into few byte ranges (per pack, neighbours closer than
    :data:`RANGE_GAP`, at most :data:`RANGE_MAX` long)."""
    found: list[Span] = []
    by_pack: dict[str, list[tuple[str, Member]]] = {}
    for name, member in wanted.items():
        by_pack.setdefault(member.pack, []).append((name, member))
    for pack_name, items in sorted(by_pack.items()):
        items.sort(key=lambda item: item[1].offset)
        current: list[tuple[str, Member]] = []
        start = end = 0
        for name, member in items:
            fits = current and member.offset - end <= RANGE_GAP and member.offset + member.length - start <= RANGE_MAX
            if not fits:
                if current:
                    found.append(Span(pack_name, start, end, tuple(current)))
                current, start = [], member.offset
            current.append((name, member))
            end = max(end, member.offset + member.length)
        if current:
            found.append(Span(pack_name, start, end, tuple(current)))
    return found


def read_span(clients: Clients, span: Span) -> bytes:
    if span.end == span.start:
        return b""  # empty members only
    return clients.products.download_blob(span.pack, offset=span.start, length=span.end - span.start).readall()


def unpack(span: Span, data: bytes) -> dict[str, bytes]:
    """The members of one span's bytes, each checked against its MD5."""
    if len(data) != span.end - span.start:
        raise StageFailure(FailureClass.CORRUPT_BLOB, f"{span.pack}: range read {len(data)} bytes, "
                           f"expected {span.end - span.start}")
    found = {}
    for name, member in span.members:
        part = data[member.offset - span.start:member.offset - span.start + member.length]
        if md5_of(part).hex() != member.md5:
            raise StageFailure(FailureClass.CORRUPT_BLOB, f"{name} in {span.pack}: content does not match its MD5")
        found[name] = part
    return found


def read_members(clients: Clients, wanted: dict[str, Member]) -> dict[str, bytes]:
    """Members read from their packs in storage by ranged reads, verified."""
    found: dict[str, bytes] = {}
    for span in spans(wanted):
        found.update(unpack(span, read_span(clients, span)))
    return found


def member_of(entry: dict[str, Any]) -> Member:
    return Member(**entry)
