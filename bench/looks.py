"""The planner's look at cached blobs, side by side in one run: the SDK's downloader against
the look bagpipe makes (``cache.Looks``: the same one-byte read on the client's pipeline).

A repeat request is settled at planning after a look at each of its cached sources and
tiles (the demo's: 12 and 72), and the looks were most of a repeat's time. Each look is a
read of the blob's first byte: the read records an access, by which the retention rule
keeps the cache, and its answer names the whole blob's MD5. Through the SDK
(``BlobClient.download_blob(offset=0, length=1)``) a look also makes a client for the blob
and decodes every header of the answer into the blob's properties; ``cache._apeek`` sends
the same request through the same pipeline (authentication, retries) and reads the one
header it needs. Both run on one asynchronous client, :data:`cache.PEEKS_AT_ONCE` reads in
flight, against a fresh Azurite, alternating round by round; the medians of the rounds'
wall and CPU (this process's) times are printed, and the ratios. Last line: one JSON object.

    python -m bench.looks [--blobs 72] [--rounds 15]
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

from azure.storage.blob.aio import ContainerClient as AsyncContainerClient

from bagpipe.azurite import Azurite
from pipeline.settings import Settings
from pipeline.storage import cache
from pipeline.storage.clients import Clients

Look = Callable[[AsyncContainerClient, str], Awaitable[bytes]]


async def _sdk_look(blobs: AsyncContainerClient, name: str) -> bytes:
    """The look through the SDK's downloader (as bagpipe looked before ``cache._apeek``)."""
    downloader = await blobs.get_blob_client(name).download_blob(offset=0, length=1)
    await downloader.readall()
    return bytes(downloader.properties.content_settings.content_md5 or b"")


async def _rounds(clients: Clients, names: list[str], rounds: int) -> dict[str, list[tuple[float, float]]]:
    """Each look's (wall, CPU) seconds per round of ``names``, the two looks alternating."""
    looks: dict[str, Look] = {"sdk": _sdk_look, "bagpipe": cache._apeek}
    timed: dict[str, list[tuple[float, float]]] = {label: [] for label in looks}
    async with clients.async_blob_service() as service:
        blobs = service.get_container_client(clients.tiles.container_name)
        gate = asyncio.Semaphore(cache.PEEKS_AT_ONCE)

        async def one(look: Look, name: str) -> bytes:
            async with gate:
                return await look(blobs, name)

        for round_ in range(rounds + 1):
            for label, look in looks.items():
                wall, cpu = time.perf_counter(), time.process_time()
                found = await asyncio.gather(*(one(look, name) for name in names))
                if round_:  # the first round opens the connections
                    timed[label].append((time.perf_counter() - wall, time.process_time() - cpu))
                assert all(found), f"{label}: a blob without its MD5"
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blobs", type=int, default=72, help="blobs looked at a round (the demo's tiles: 72)")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        azurite = Azurite(Path(home, "azurite")).start()
        try:
            clients = Clients(Settings(storage_connection=azurite.connection_string, namespace="looks"))
            clients.ensure_resources()
            names = [f"{i:064x}/MOD10A2.Maximum_Snow_Extent.2022-01-01.h08v05.tif" for i in range(args.blobs)]
            for name in names:
                clients.tiles.upload_blob(name, b"\x00" * 40_000)
            timed = asyncio.run(_rounds(clients, names, args.rounds))
        finally:
            azurite.stop()
    figures: dict[str, float] = {}
    for label, rounds in timed.items():
        wall = statistics.median(w for w, _ in rounds)
        cpu = statistics.median(c for _, c in rounds)
        figures |= {f"{label}_wall_ms": round(wall * 1000, 1), f"{label}_cpu_ms": round(cpu * 1000, 1)}
        print(f"{label:8s} {args.blobs} looks: {wall * 1000:6.1f} ms wall, {cpu * 1000:6.1f} ms CPU (medians)")
    figures["wall_ratio"] = round(figures["sdk_wall_ms"] / figures["bagpipe_wall_ms"], 2)
    figures["cpu_ratio"] = round(figures["sdk_cpu_ms"] / figures["bagpipe_cpu_ms"], 2)
    print(f"the SDK's downloader over bagpipe's look: {figures['wall_ratio']}× wall, {figures['cpu_ratio']}× CPU")
    print(json.dumps({"blobs": args.blobs, "rounds": args.rounds, **figures}))


if __name__ == "__main__":
    main()
