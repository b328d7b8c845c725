"""Verified blob transfers, shaped by the object's size and the link to storage.

Every upload stores the object's MD5 as its Content-MD5 and sends each block with its own
MD5 (``validate_content``); every download is checked whole against the stored MD5 — a
mismatch is a ``corrupt_blob_read`` failure (retried), never data handed to a stage. Block
size and concurrency follow the object's size and the link (:data:`NEAR`, :data:`FAR_NARROW`,
:data:`FAR_WIDE`, told apart by a round trip and, for far storage, the rate of one
connection, measured once per process): small objects go in one request, large ones as
blocks or ranges in parallel. The SDK does the transfer (its chunking, its retry policy);
this module only chooses its settings, once per process: one blob client per block size,
all on one shared connection pool.
"""

from __future__ import annotations

import base64
import hashlib
import math
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from azure.core import MatchConditions
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobBlock, BlobServiceClient, ContainerClient, ContentSettings, ExponentialRetry
from urllib3.util.retry import Retry

from pipeline.failures import FailureClass, StageFailure, classify
from pipeline.storage import names

MiB = 1024 * 1024


def md5_of(data: bytes) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()


@dataclass(frozen=True)
class Plan:
    block: int  # bytes per block (upload) or range (download); also the single-request limit
    concurrency: int  # blocks or ranges in flight

    def within(self, in_flight: int | None) -> Plan:
        """This plan with no more than ``in_flight`` bytes of blocks in flight (one block at
        least); unchanged for None."""
        if in_flight is None:
            return self
        return Plan(self.block, max(1, min(self.concurrency, in_flight // self.block)))


Plans = tuple[tuple[int, Plan], ...]  # (objects up to this size, how to move them)


@dataclass(frozen=True)
class Link:
    """The way to storage as one process measured it."""

    round_trip: float  # seconds a request takes
    rate: float = math.inf  # bytes/s one connection carries (measured for far storage only)


READ_CHUNK = MiB  # bytes per socket read of a response body (the SDK's 4 KiB: docs/performance.md)
POOL = 64  # connections kept per host: two far transfers' worth of blocks in flight
NEAR_S = 0.020  # storage whose round trip is shorter is near (the same host or datacenter)
WIDE_RATE = 25e6  # bytes/s: far storage one connection reaches faster is on a wide link
PROBE = MiB  # bytes of the block a process stages to measure a far link's rate

# The plans: docs/performance.md#transfers says which runs of bench.transfer chose them and why.
NEAR: Plans = (
    (16 * MiB, Plan(16 * MiB, 1)),
    (2**62, Plan(8 * MiB, 16)),
)
# far storage, a link that shapes each connection (a WAN): every block in flight at once
FAR_NARROW: Plans = (
    (4 * MiB, Plan(4 * MiB, 1)),
    (32 * MiB, Plan(1 * MiB, 32)),
    (128 * MiB, Plan(4 * MiB, 32)),
    (2**62, Plan(8 * MiB, 32)),
)
# far storage, a wide link: few large requests, all in flight
FAR_WIDE: Plans = (
    (16 * MiB, Plan(16 * MiB, 1)),
    (128 * MiB, Plan(8 * MiB, 16)),
    (2**62, Plan(16 * MiB, 16)),
)


def tables(link: Link) -> Plans:
    """The plans for storage ``link`` away."""
    if link.round_trip < NEAR_S:
        return NEAR
    return FAR_WIDE if link.rate >= WIDE_RATE else FAR_NARROW


def plan_for(size: int, link: Link = Link(0.0)) -> Plan:
    """How to move an object of ``size`` bytes to or from storage ``link`` away (near unless given)."""
    return next(plan for limit, plan in tables(link) if size <= limit)


def retry_policy(total: int = 5) -> ExponentialRetry:
    """The SDK's storage retry, with waits sized for a worker (about 0.5, 2.5, 4.5, 8.5… s
    rather than the SDK's 15, 18, 24 s): a reset or stalled connection is retried on a new
    one, each block or range on its own; what outlasts it fails the attempt, classified."""
    return ExponentialRetry(  # its hints say int; it sleeps any number of seconds
        initial_backoff=0.5, increment_base=2, retry_total=total, random_jitter_range=0.5)  # type: ignore[arg-type]  # annotated int, takes seconds as a float


class PooledTransport(RequestsTransport):  # type: ignore[misc]  # mypy sees azure-core's transports as Any
    """The SDK's blocking transport, its pool keeping :data:`POOL` connections a host where
    urllib3 keeps 10: a process makes more calls than that at once on one client (a read of
    a whole job's partitions, 8 threads, several at once in the API; a finisher's overview
    copies), and a connection that found the pool full was closed, with a warning in the
    log, and a new one opened for a later call. Retries stay the SDK's own, off in urllib3."""

    def _init_session(self, session: requests.Session) -> None:
        super()._init_session(session)
        adapter = requests.adapters.HTTPAdapter(
            pool_maxsize=POOL, max_retries=Retry(total=False, redirect=False, raise_on_status=False))
        for protocol in self._protocols:
            session.mount(protocol, adapter)


TRANSPORT_OPTIONS = ("use_env_settings", "connection_verify")  # an SDK client's options its transport takes


def pooled(options: dict[str, Any]) -> dict[str, Any]:
    """An SDK client's ``options`` (``clients.sdk_options``) with a :class:`PooledTransport`
    built from those of them a transport takes."""
    own = {name: options[name] for name in TRANSPORT_OPTIONS if name in options}
    return {name: value for name, value in options.items() if name not in TRANSPORT_OPTIONS} | \
        {"transport": PooledTransport(**own)}


class Transfers:
    """The blob clients of one process, one per block size, sharing a connection pool.
    ``read_timeout`` bounds a stalled socket read (not a whole transfer)."""

    def __init__(self, service: BlobServiceClient, read_timeout: float = 60, retries: int = 5,
                 options: dict[str, Any] | None = None) -> None:
        """``options``: the keyword arguments its SDK clients are built with beside their own
        (``clients.sdk_options``: hooks, whether to look the environment over for a proxy, the
        CA bundle to trust)."""
        self._options = dict(options or {})
        self._verify: bool | str = self._options.pop("connection_verify", True)  # the transport's, given it here
        self._service, self._read_timeout, self._retries = service, read_timeout, retries
        self._session = requests.Session()
        # the SDK's transport sets this only on a session of its own, not on one it is given
        self._session.trust_env = self._options.get("use_env_settings", True)
        self._session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=POOL))
        self._session.mount("https://", requests.adapters.HTTPAdapter(pool_maxsize=POOL))
        self._by_block: dict[int, BlobServiceClient] = {}
        self._lock = threading.Lock()
        self._link: Link | None = None

    def _client(self, block: int) -> BlobServiceClient:
        with self._lock:
            if block not in self._by_block:
                self._by_block[block] = BlobServiceClient(
                    self._service.url, credential=self._service.credential,
                    transport=RequestsTransport(session=self._session, session_owner=False,
                                                connection_timeout=20, read_timeout=self._read_timeout,
                                                connection_data_block_size=READ_CHUNK,
                                                connection_verify=self._verify),
                    retry_policy=retry_policy(self._retries),
                    max_block_size=block, max_single_put_size=block,
                    max_chunk_get_size=block, max_single_get_size=block, **self._options,
                )
            return self._by_block[block]

    def container(self, container: ContainerClient, block: int) -> ContainerClient:
        return self._client(block).get_container_client(container.container_name)

    def link(self, container: ContainerClient) -> Link:
        """The way to ``container``'s storage, measured once per process at the first transfer,
        on the pool the transfers use: the round trip is the fastest of three reads of the
        container's properties (the first also opens the connection); for far storage, the
        rate of one connection is the faster of two stagings of a :data:`PROBE`-byte block,
        less a round trip."""
        if self._link is None:
            probe = self.container(container, NEAR[0][1].block)
            times = []
            for _ in range(3):
                started = time.perf_counter()
                try:
                    probe.get_container_properties()
                except ResourceNotFoundError:
                    pass  # an answer all the same
                times.append(time.perf_counter() - started)
            round_trip = min(times)
            self._link = Link(round_trip, math.inf if round_trip < NEAR_S else self._rate(probe, round_trip))
        return self._link

    @staticmethod
    def _rate(probe: ContainerClient, round_trip: float) -> float:
        """Bytes/s one connection carries to far storage. The block is never committed (it
        is in no listing, and storage drops it unused); storage that refuses it (no such
        container, no right to write) gives 0: the narrow plans, the safe side on any link."""
        blob = probe.get_blob_client(names.probe_blob(uuid.uuid4().hex))
        block, fastest = bytes(PROBE), math.inf
        try:
            for n in range(2):
                started = time.perf_counter()
                blob.stage_block(f"probe{n}", block)
                fastest = min(fastest, time.perf_counter() - started)
        except HttpResponseError:
            return 0.0
        return PROBE / max(fastest - round_trip, 1e-6)

    def plan(self, container: ContainerClient, size: int) -> Plan:
        """The plan for an object of ``size`` bytes in ``container``, by the link to its storage."""
        return plan_for(size, self.link(container))

    def upload(self, container: ContainerClient, name: str, data: bytes, content_type: str,
               overwrite: bool = True, plan: Plan | None = None) -> bytes:
        """Store ``data`` with its MD5 (checked per block on the way); returns the MD5.
        ``plan``: the plan for its size unless given (the benchmark sweeps it)."""
        plan = plan or self.plan(container, len(data))
        md5 = md5_of(data)
        self.container(container, plan.block).upload_blob(
            name, data, overwrite=overwrite, max_concurrency=plan.concurrency, validate_content=True,
            content_settings=ContentSettings(content_type=content_type, content_md5=bytearray(md5)),
        )
        return md5

    def upload_file(self, container: ContainerClient, name: str, path: Path, content_type: str,
                    overwrite: bool = True, in_flight: int | None = None) -> bytes:
        """Store the file at ``path`` with its MD5, in bounded memory whatever its size: its
        blocks are read and staged a plan's concurrency at a time (each checked by its own
        MD5), the whole file's MD5 computed as they go, then committed with it; ``in_flight``
        caps the bytes of blocks in flight below the plan's (for a large object, up to 256
        MiB). A file that fits one request goes as :meth:`upload` sends bytes. Returns the MD5."""
        size = path.stat().st_size
        plan = self.plan(container, size).within(in_flight)
        if size <= plan.block:
            return self.upload(container, name, path.read_bytes(), content_type, overwrite, plan)
        blob = self.container(container, plan.block).get_blob_client(name)
        if not overwrite and blob.exists():
            raise ResourceExistsError(f"{name} exists")
        digest = hashlib.md5(usedforsecurity=False)
        ids: list[str] = []
        with path.open("rb") as file, ThreadPoolExecutor(plan.concurrency) as pool:
            while True:
                chunks = [chunk for _ in range(plan.concurrency) if (chunk := file.read(plan.block))]
                if not chunks:
                    break
                for chunk in chunks:
                    digest.update(chunk)
                named = [(base64.b64encode(f"{len(ids) + i:08d}".encode()).decode(), c) for i, c in enumerate(chunks)]
                list(pool.map(lambda item: blob.stage_block(item[0], item[1], validate_content=True), named))
                ids += [block for block, _ in named]
        md5 = digest.digest()
        conditions: dict[str, Any] = {} if overwrite else {"etag": "*", "match_condition": MatchConditions.IfMissing}
        blob.commit_block_list([BlobBlock(block) for block in ids],
                               content_settings=ContentSettings(content_type=content_type, content_md5=bytearray(md5)),
                               **conditions)
        return md5

    def download(self, container: ContainerClient, name: str, size: int | None = None,
                 plan: Plan | None = None) -> tuple[bytes, bytes]:
        """The blob's bytes and MD5, checked whole against its stored Content-MD5. Without
        its ``size`` (or a ``plan``), the plan for large objects: a small one still comes in
        one request.

        The SDK retries a range whose connection breaks mid-body only three times, whatever
        its retry policy; a range that exhausts them restarts the download, up to ``retries``
        downloads in all, before the broken connection fails the attempt."""
        plan = plan or self.plan(container, size if size is not None else 2**62)
        attempt = 1
        while True:
            try:
                return self._download_once(container, name, plan)
            except HttpResponseError as error:
                if attempt >= self._retries or classify(error) is not FailureClass.CONNECTION:
                    raise
                attempt += 1

    def _download_once(self, container: ContainerClient, name: str, plan: Plan) -> tuple[bytes, bytes]:
        downloader = self.container(container, plan.block).download_blob(name, max_concurrency=plan.concurrency)
        data = downloader.readall()
        md5 = md5_of(data)
        stored = downloader.properties.content_settings.content_md5
        if stored and bytes(stored) != md5:
            raise StageFailure(FailureClass.CORRUPT_BLOB, f"{container.container_name}/{name}: content does "
                               "not match its stored MD5")
        return data, md5

    def close(self) -> None:
        for client in self._by_block.values():
            client.close()
        self._session.close()
