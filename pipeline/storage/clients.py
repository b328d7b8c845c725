"""The Azure Storage clients of one process, built once from the settings.

Not an abstraction over storage: callers use the SDK clients directly. This module only
chooses how to authenticate (a connection string locally, ``DefaultAzureCredential`` in
Azure) and shares one connection pool per process.
"""

from __future__ import annotations

import os
import threading
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from azure.core.credentials import TokenCredential
from azure.core.exceptions import ResourceExistsError
from azure.data.tables import TableClient, TableServiceClient
from azure.storage.blob import BlobServiceClient, ContainerClient
from azure.storage.blob.aio import BlobServiceClient as AsyncBlobServiceClient
from azure.storage.blob.aio import ExponentialRetry as AsyncExponentialRetry
from azure.storage.queue import BinaryBase64EncodePolicy, QueueClient, QueueServiceClient

from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.transactions import TransactionTable
from pipeline.storage.transfer import Transfers, pooled, retry_policy

# Keyword arguments every SDK client of this process is built with, beside bagpipe's own:
# none in production. The fault-injection harness (bagpipe.faults) puts the SDK's
# per-request hooks here (``raw_request_hook``, ``raw_response_hook``) to number every
# storage call and fault one.
HOOKS: dict[str, Any] = {}


CA_BUNDLE_VARIABLES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")  # the CA bundle requests takes, the first named
ASYNC_PROXY_SCHEMES = ("http", "https", "ws", "wss")  # the proxies aiohttp takes from the environment


def sdk_options(asynchronous: bool = False) -> dict[str, Any]:
    """The keyword arguments an SDK client is built with beside its own: :data:`HOOKS`, and
    ``use_env_settings=False`` unless the environment names a proxy the client's transport
    would use (requests': any but ``NO_PROXY``; aiohttp's, for an ``asynchronous`` client:
    :data:`ASYNC_PROXY_SCHEMES`), with, for the blocking clients, the CA bundle the
    environment names for requests (:data:`CA_BUNDLE_VARIABLES`), read here once, as
    ``connection_verify`` (aiohttp reads none: it trusts the system's store, and the
    SDK's aiohttp transport would load a bundle given it on every request). Left to
    themselves, the transports look the environment over on every request, and
    ``~/.netrc`` with it (aiohttp in two hops to a thread): measured against Azurite, about
    half the CPU of a small asynchronous read and a sixth of a table read's (``python -m
    bench.looks``); and a ``~/.netrc`` login for the storage host took the place of a
    request's signature. With a proxy named, the transports look as the SDK has them
    (``NO_PROXY`` is matched per request), the login's hazard included."""
    proxies = set(urllib.request.getproxies()) - {"no"}
    if proxies & set(ASYNC_PROXY_SCHEMES) if asynchronous else proxies:
        return dict(HOOKS)
    bundle = None if asynchronous else next(
        (os.environ[name] for name in CA_BUNDLE_VARIABLES if os.environ.get(name)), None)
    return {"use_env_settings": False, **({"connection_verify": bundle} if bundle else {})} | HOOKS


@dataclass
class Clients:
    """SDK clients for one deployment (settings); safe to share between threads."""

    settings: Settings

    def _credential(self) -> TokenCredential:
        from azure.identity import DefaultAzureCredential

        return DefaultAzureCredential()

    def _url(self, service: str) -> str:
        return f"https://{self.settings.storage_account}.{service}.core.windows.net"

    # Blob and queue calls retry as transfers do (waits of about 0.5, 2.5, 4.5 s, where the
    # SDK's default waits 15, 18, 24 s: a worker would stall that long on a blip).
    @cached_property
    def blob_service(self) -> BlobServiceClient:
        if self.settings.storage_connection:
            return BlobServiceClient.from_connection_string(self.settings.storage_connection,
                                                            retry_policy=retry_policy(), **pooled(sdk_options()))
        return BlobServiceClient(self._url("blob"), credential=self._credential(), retry_policy=retry_policy(),
                                 **pooled(sdk_options()))

    @cached_property
    def queue_service(self) -> QueueServiceClient:
        if self.settings.storage_connection:
            return QueueServiceClient.from_connection_string(self.settings.storage_connection,
                                                             retry_policy=retry_policy(), **pooled(sdk_options()))
        return QueueServiceClient(self._url("queue"), credential=self._credential(), retry_policy=retry_policy(),
                                  **pooled(sdk_options()))

    @cached_property
    def table_service(self) -> TableServiceClient:
        if self.settings.storage_connection:
            return TableServiceClient.from_connection_string(self.settings.storage_connection,
                                                             **pooled(sdk_options()))
        return TableServiceClient(endpoint=self._url("table"), credential=self._credential(),
                                  **pooled(sdk_options()))

    @asynccontextmanager
    async def async_blob_service(self) -> AsyncIterator[AsyncBlobServiceClient]:
        """A new asynchronous blob client (bound to the event loop that uses it), for many
        small blobs at once; closed, with its credential, on leaving the block."""
        retry = AsyncExponentialRetry(  # its hints say int; it sleeps any number of seconds
            initial_backoff=0.5, increment_base=2, retry_total=5, random_jitter_range=0.5)  # type: ignore[arg-type]  # annotated int, takes seconds as a float
        if self.settings.storage_connection:
            async with AsyncBlobServiceClient.from_connection_string(
                    self.settings.storage_connection, retry_policy=retry, **sdk_options(asynchronous=True)) as service:
                yield service
            return
        from azure.identity.aio import DefaultAzureCredential

        async with DefaultAzureCredential() as credential, \
                AsyncBlobServiceClient(self._url("blob"), credential=credential, retry_policy=retry,
                                       **sdk_options(asynchronous=True)) as service:
            yield service

    # --- the resources bagpipe uses, by role -------------------------------------------
    def table(self, name: str) -> TableClient:
        return self.table_service.get_table_client(name)

    @cached_property
    def jobs(self) -> TableClient:
        return self.table(self.settings.names.jobs)

    @cached_property
    def tasks(self) -> TableClient:
        """The tasks table, whose transactions (two per task) go on the lean wire format."""
        name = self.settings.names.tasks
        if self.settings.storage_connection:
            return TransactionTable.from_connection_string(self.settings.storage_connection, table_name=name,
                                                           **pooled(sdk_options()))
        return TransactionTable(self._url("table"), table_name=name, credential=self._credential(),
                                **pooled(sdk_options()))

    @cached_property
    def runtimes(self) -> TableClient:
        return self.table(self.settings.names.table(names.RUNTIMES_TABLE))

    @cached_property
    def workers(self) -> TableClient:
        return self.table(self.settings.names.table(names.WORKERS_TABLE))

    @cached_property
    def sources_table(self) -> TableClient:
        return self.table(self.settings.names.table(names.SOURCES_TABLE))

    @cached_property
    def users(self) -> TableClient:
        return self.table(self.settings.names.table(names.USERS_TABLE))

    @cached_property
    def audit(self) -> TableClient:
        return self.table(self.settings.names.table(names.AUDIT_TABLE))

    @cached_property
    def reducers(self) -> TableClient:
        return self.table(self.settings.names.table(names.REDUCERS_TABLE))

    def queue(self, name: str) -> QueueClient:
        # Messages are JSON, base64 on the wire as the Functions queue trigger expects. They
        # are received undecoded (see tasks.message_bytes) so that one malformed message
        # cannot break the receipt of a whole batch.
        return self.queue_service.get_queue_client(name, message_encode_policy=BinaryBase64EncodePolicy())

    @cached_property
    def plan_queue(self) -> QueueClient:
        return self.queue(self.settings.names.plan_queue)

    @cached_property
    def done_queue(self) -> QueueClient:
        return self.queue(self.settings.names.done_queue)

    @cached_property
    def shard_queues(self) -> list[QueueClient]:
        return [self.queue(self.settings.names.shard_queue(i)) for i in range(self.settings.shards)]

    def container(self, base: str) -> ContainerClient:
        return self.blob_service.get_container_client(self.settings.names.container(base))

    @cached_property
    def products(self) -> ContainerClient:
        return self.container(names.PRODUCTS_CONTAINER)

    @cached_property
    def sources(self) -> ContainerClient:
        return self.container(names.SOURCES_CONTAINER)

    @cached_property
    def tiles(self) -> ContainerClient:
        return self.container(names.TILES_CONTAINER)

    @cached_property
    def logs(self) -> ContainerClient:
        return self.container(names.LOGS_CONTAINER)

    @cached_property
    def bundles(self) -> ContainerClient:
        return self.container(names.BUNDLES_CONTAINER)

    @cached_property
    def transfers(self) -> Transfers:
        """Verified, size-shaped blob transfers (every stage's data goes through them)."""
        return Transfers(self.blob_service, options=sdk_options())

    def close(self) -> None:
        """Close the connection pools (those that were opened)."""
        for name in ("transfers", "blob_service", "queue_service", "table_service", "tasks"):
            if name in self.__dict__:
                self.__dict__[name].close()

    def ensure_resources(self) -> None:
        """Create every table, queue and container if missing (Bicep does it in Azure)."""
        for base in names.TABLES:
            self.table_service.create_table_if_not_exists(self.settings.names.table(base))
        for queue in self.settings.names.all_queues(self.settings.shards):
            try:
                self.queue(queue).create_queue()
            except ResourceExistsError:
                pass
        for base in names.CONTAINERS:
            try:
                self.container(base).create_container()
            except ResourceExistsError:
                pass


_shared: dict[Settings, Clients] = {}
_shared_lock = threading.Lock()


def clients_for(settings: Settings) -> Clients:
    """The process-wide clients of these settings (one connection pool per deployment)."""
    with _shared_lock:
        found = _shared.get(settings)
        if found is None:
            found = _shared[settings] = Clients(settings)
        return found


def close_shared() -> None:
    """Close and forget every process-wide client (a process that serves one deployment
    after another, as the tests do, would otherwise keep each one's connections open)."""
    with _shared_lock:
        for found in _shared.values():
            found.close()
        _shared.clear()
