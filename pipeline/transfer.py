"""Verified blob transfers, shaped by the object's size.

Every upload stores the object's MD5 as its Content-MD5 and sends each block with its own
MD5 (``validate_content``); every download is checked whole against the stored MD5 — a
mismatch is a ``corrupt_blob_read`` failure (retried), never data handed to a stage. Block
size and concurrency follow the object's size and the storage's distance (:data:`NEAR`,
:data:`FAR`, told apart by a round trip measured once per process): small objects go in
one request, large ones as blocks or ranges in parallel. The SDK does the transfer (its
chunking, its retry policy); this module only chooses its settings, once per process: one
blob client per block size, all on one shared connection pool.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass

import requests
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import BlobServiceClient, ContainerClient, ContentSettings, ExponentialRetry

from pipeline.failures import FailureClass, StageFailure, classify

MiB = 1024 * 1024


def md5_of(data: bytes) -> bytes:
    return hashlib.md5(data, usedforsecurity=False).digest()


@dataclass(frozen=True)
class Plan:
    block: int  # bytes per block (upload) or range (download); also the single-request limit
    concurrency: int  # blocks or ranges in flight


Plans = tuple[tuple[int, Plan], ...]  # (objects up to this size, how to move them)

READ_CHUNK = MiB  # bytes per socket read of a response body (the SDK's default, 4 KiB,
# made a 256 MiB download cost 65,536 reads and 4 s of CPU)
POOL = 64  # connections kept per host: two far transfers' worth of blocks in flight
NEAR_S = 0.020  # storage whose round trip is shorter is near (the same host or datacenter)

# From bench.transfer (2 cores shared with Azurite). Near storage (loopback): a request
# costs more than the wait for it, so blocks are large: at 100 MiB 4 MiB × 4 and × 16 were
# the best (1.50 and 1.52 s, 1 MiB blocks 2.0 s and more), at 256 MiB 8 MiB × 16 and × 32
# (3.54 and 3.58 s, 8 MiB × 4 4.67 s); at 10 MiB the plans with 4 or 8 MiB blocks lie
# within a tenth of each other.
NEAR: Plans = (
    (4 * MiB, Plan(4 * MiB, 1)),
    (128 * MiB, Plan(4 * MiB, 16)),
    (2**62, Plan(8 * MiB, 16)),
)
# Far storage (a 30 ms WAN, capped at 100 Mbit/s per connection or not): the latency and
# the per-connection rate dominate, so every block is in flight at once, the smallest
# blocks that let 32 carry the object. Through the capped WAN: 1 MiB × 10 at 10 MiB
# (0.67 s against 1.97 s for one stream), 4 MiB × 25 at 100 MiB (2.56 s against 22.7 s;
# 8 MiB × 13 3.38 s), at 256 MiB 1 MiB × 32 and 8 MiB × 32 (6.22 and 6.43 s against
# 59.2 s; 8 MiB × 16 7.06 s); uncapped, the same plans were the best or within 0.97.
FAR: Plans = (
    (4 * MiB, Plan(4 * MiB, 1)),
    (32 * MiB, Plan(1 * MiB, 32)),
    (128 * MiB, Plan(4 * MiB, 32)),
    (2**62, Plan(8 * MiB, 32)),
)


def plan_for(size: int, round_trip: float = 0.0) -> Plan:
    """How to move an object of ``size`` bytes to or from storage ``round_trip`` s away."""
    return next(plan for limit, plan in (NEAR if round_trip < NEAR_S else FAR) if size <= limit)


def retry_policy(total: int = 5) -> ExponentialRetry:
    """The SDK's storage retry, with waits sized for a worker (about 0.5, 2.5, 4.5, 8.5… s
    rather than the SDK's 15, 18, 24 s): a reset or stalled connection is retried on a new
    one, each block or range on its own; what outlasts it fails the attempt, classified."""
    return ExponentialRetry(initial_backoff=0.5, increment_base=2, retry_total=total, random_jitter_range=0.5)


class Transfers:
    """The blob clients of one process, one per block size, sharing a connection pool.
    ``read_timeout`` bounds a stalled socket read (not a whole transfer)."""

    def __init__(self, service: BlobServiceClient, read_timeout: float = 60, retries: int = 5) -> None:
        self._service = service
        self._read_timeout, self._retries = read_timeout, retries
        self._session = requests.Session()
        self._session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=POOL))
        self._session.mount("https://", requests.adapters.HTTPAdapter(pool_maxsize=POOL))
        self._by_block: dict[int, BlobServiceClient] = {}
        self._lock = threading.Lock()
        self._round_trip: float | None = None

    def _client(self, block: int) -> BlobServiceClient:
        with self._lock:
            if block not in self._by_block:
                self._by_block[block] = BlobServiceClient(
                    self._service.url, credential=self._service.credential,
                    transport=RequestsTransport(session=self._session, session_owner=False,
                                                connection_timeout=20, read_timeout=self._read_timeout,
                                                connection_data_block_size=READ_CHUNK),
                    retry_policy=retry_policy(self._retries),
                    max_block_size=block, max_single_put_size=block,
                    max_chunk_get_size=block, max_single_get_size=block,
                )
            return self._by_block[block]

    def container(self, container: ContainerClient, block: int) -> ContainerClient:
        return self._client(block).get_container_client(container.container_name)

    def round_trip(self, container: ContainerClient) -> float:
        """Seconds a request to the storage takes, measured once per process at the first
        transfer: the fastest of three reads of ``container``'s properties on the pool the
        transfers use (the first also opens the connection)."""
        if self._round_trip is None:
            probe = self.container(container, NEAR[0][1].block)
            times = []
            for _ in range(3):
                started = time.perf_counter()
                try:
                    probe.get_container_properties()
                except ResourceNotFoundError:
                    pass  # an answer all the same
                times.append(time.perf_counter() - started)
            self._round_trip = min(times)
        return self._round_trip

    def plan(self, container: ContainerClient, size: int) -> Plan:
        """The plan for an object of ``size`` bytes in ``container``, by the storage's distance."""
        return plan_for(size, self.round_trip(container))

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
