"""Small storage calls side by side in one run: the planner's look at cached blobs, through
the SDK's downloader and as bagpipe makes it (``cache.Looks``), and the SDK's transports
with and without their look at the environment on every request (``clients.sdk_options``).

A repeat request is settled at planning after a look at each of its cached sources and
tiles (the demo's: 12 and 72), and the looks were most of a repeat's time. Each look is a
read of the blob's first byte: the read records an access, by which the retention rule
keeps the cache, and its answer names the whole blob's MD5. Through the SDK
(``BlobClient.download_blob(offset=0, length=1)``) a look also makes a client for the blob
and decodes every header of the answer into the blob's properties; ``cache._apeek`` sends
the same request through the same pipeline (authentication, retries) and reads the one
header it needs. Left to themselves, the SDK's transports also look the environment over
on every request, for a proxy and a ``~/.netrc`` login (aiohttp in two hops to a thread);
bagpipe's clients skip that when the environment names no proxy. Three looks, on one
asynchronous client each, :data:`cache.PEEKS_AT_ONCE` reads in flight, alternating round
by round: ``sdk`` (the downloader, the environment looked at), ``pipeline`` (bagpipe's
look, the environment looked at) and ``bagpipe`` (as bagpipe's clients make it). Then a
table read and a whole small blob's read on the blocking clients, with and without the
look at the environment. Medians of wall and CPU (this process's) times, against a fresh
Azurite, and the ratios. Last line: one JSON object.

    python -m bench.looks [--blobs 72] [--rounds 15] [--calls 300]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from azure.data.tables import TableServiceClient
from azure.storage.blob import BlobServiceClient
from azure.storage.blob.aio import BlobServiceClient as AsyncBlobServiceClient
from azure.storage.blob.aio import ContainerClient as AsyncContainerClient

from bagpipe.azurite import Azurite
from pipeline.settings import Settings
from pipeline.storage import cache
from pipeline.storage.clients import Clients

Look = Callable[[AsyncContainerClient, str], Awaitable[bytes]]
Timed = dict[str, list[tuple[float, float]]]  # (wall, CPU) seconds of each round, by label
ENVIRONMENT_LOOKED_AT = {"use_env_settings": True}  # the SDK's default


async def _sdk_look(blobs: AsyncContainerClient, name: str) -> bytes:
    """The look through the SDK's downloader (as bagpipe looked before ``cache._apeek``)."""
    downloader = await blobs.get_blob_client(name).download_blob(offset=0, length=1)
    await downloader.readall()
    return bytes(downloader.properties.content_settings.content_md5 or b"")


async def _looks(clients: Clients, names: list[str], rounds: int) -> Timed:
    """Each look's times per round of ``names``, the three alternating."""
    connection = clients.settings.storage_connection
    timed: Timed = {"sdk": [], "pipeline": [], "bagpipe": []}
    async with AsyncBlobServiceClient.from_connection_string(connection, **ENVIRONMENT_LOOKED_AT) as looked, \
            clients.async_blob_service() as built:
        gate = asyncio.Semaphore(cache.PEEKS_AT_ONCE)
        looks: dict[str, tuple[Look, AsyncContainerClient]] = {
            "sdk": (_sdk_look, looked.get_container_client(clients.tiles.container_name)),
            "pipeline": (cache._apeek, looked.get_container_client(clients.tiles.container_name)),
            "bagpipe": (cache._apeek, built.get_container_client(clients.tiles.container_name))}

        async def one(look: Look, blobs: AsyncContainerClient, name: str) -> bytes:
            async with gate:
                return await look(blobs, name)

        for round_ in range(rounds + 1):
            for label, (look, blobs) in looks.items():
                wall, cpu = time.perf_counter(), time.process_time()
                found = await asyncio.gather(*(one(look, blobs, name) for name in names))
                if round_:  # the first round opens the connections
                    timed[label].append((time.perf_counter() - wall, time.process_time() - cpu))
                assert all(found), f"{label}: a blob without its MD5"
    return timed


def _blocking(clients: Clients, name: str, calls: int, rounds: int) -> Timed:
    """A table read and a small blob's read, ``calls`` a round, on blocking clients made with
    and without the look at the environment, alternating; times per call."""
    connection = clients.settings.storage_connection
    tables = {"looked": TableServiceClient.from_connection_string(connection, **ENVIRONMENT_LOOKED_AT),
              "built": clients.table_service}
    blobs = {"looked": BlobServiceClient.from_connection_string(connection, **ENVIRONMENT_LOOKED_AT),
             "built": clients.blob_service}
    table = clients.settings.names.jobs
    calls_of: dict[str, Callable[[], Any]] = {}
    for which in ("looked", "built"):
        calls_of[f"table_read_{which}"] = lambda t=tables[which]: t.get_table_client(table).get_entity("p", "r")
        calls_of[f"blob_read_{which}"] = lambda b=blobs[which]: b.get_blob_client(
            clients.tiles.container_name, name).download_blob().readall()
    timed: Timed = {label: [] for label in calls_of}
    for round_ in range(rounds + 1):
        for label, call in calls_of.items():
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                call()
            if round_:
                timed[label].append(((time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls))
    return timed


def _medians(timed: Timed, unit: str) -> dict[str, float]:
    figures: dict[str, float] = {}
    for label, rounds in timed.items():
        wall = statistics.median(w for w, _ in rounds)
        cpu = statistics.median(c for _, c in rounds)
        figures |= {f"{label}_wall_ms": round(wall * 1000, 3), f"{label}_cpu_ms": round(cpu * 1000, 3)}
        print(f"{label:18s} {unit}: {wall * 1000:8.3f} ms wall, {cpu * 1000:8.3f} ms CPU (medians)")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blobs", type=int, default=72, help="blobs looked at a round (the demo's tiles: 72)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=300, help="blocking calls a round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        azurite = Azurite(Path(home, "azurite")).start()
        try:
            clients = Clients(Settings(storage_connection=azurite.connection_string, namespace="looks"))
            clients.ensure_resources()
            names = [f"{i:064x}/MOD10A2.Maximum_Snow_Extent.2022-01-01.h08v05.tif" for i in range(args.blobs)]
            for name in names:
                clients.tiles.upload_blob(name, b"\x00" * 40_000)
            clients.jobs.upsert_entity({"PartitionKey": "p", "RowKey": "r", "Value": 1})
            clients.tiles.upload_blob("small.json", b"{}" * 100)
            figures = _medians(asyncio.run(_looks(clients, names, args.rounds)), f"{args.blobs} looks")
            figures |= _medians(_blocking(clients, "small.json", args.calls, args.rounds), "a call")
        finally:
            azurite.stop()
    for kind in ("wall", "cpu"):
        figures[f"look_sdk_over_bagpipe_{kind}"] = round(figures[f"sdk_{kind}_ms"] / figures[f"bagpipe_{kind}_ms"], 2)
        figures[f"look_environment_{kind}"] = round(figures[f"pipeline_{kind}_ms"] / figures[f"bagpipe_{kind}_ms"], 2)
        for call in ("table_read", "blob_read"):
            figures[f"{call}_environment_{kind}"] = round(
                figures[f"{call}_looked_{kind}_ms"] / figures[f"{call}_built_{kind}_ms"], 2)
    print(f"a look through the SDK's downloader over bagpipe's: {figures['look_sdk_over_bagpipe_wall']}× wall, "
          f"{figures['look_sdk_over_bagpipe_cpu']}× CPU; of which the environment looked at: "
          f"{figures['look_environment_wall']}× wall, {figures['look_environment_cpu']}× CPU")
    print(f"the environment looked at, blocking: a table read {figures['table_read_environment_cpu']}× CPU, "
          f"a blob read {figures['blob_read_environment_cpu']}× CPU")
    print(json.dumps({"blobs": args.blobs, "rounds": args.rounds, "calls": args.calls, **figures}))


if __name__ == "__main__":
    main()
