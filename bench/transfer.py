"""Blob transfer speed: the SDK's defaults single-threaded, bagpipe's pick (``pipeline.transfer``)
and a sweep of block size × concurrency, on loopback and through a WAN made with Toxiproxy
(30 ms each way, 100 Mbit/s per connection; and 30 ms uncapped); then 4,096 small objects,
one PUT each vs packed into one blob.

    python -m bench.transfer [--sizes 1,10,100,256] [--quick]

Installs Toxiproxy into ``.bench/bin`` with ``go install`` if it is missing. The last line
is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from azure.storage.blob import BlobServiceClient, ContainerClient

from bagpipe.azurite import ACCOUNT, ACCOUNT_KEY, Azurite, free_port
from pipeline.transfer import MiB, Transfers, plan_for

TOXIPROXY = "github.com/Shopify/toxiproxy/v2/cmd/server@v2.12.0"
BIN = Path(__file__).resolve().parent.parent / ".bench" / "bin"
BLOCKS = (256 * 1024, 1 * MiB, 4 * MiB, 8 * MiB)
CONCURRENCY = (1, 4, 16)
SMALL, SMALL_COUNT = 32 * 1024, 4096


def toxiproxy_server() -> Path:
    server = BIN / "server"
    if not server.exists():
        BIN.mkdir(parents=True, exist_ok=True)
        subprocess.run(["go", "install", TOXIPROXY], check=True, env=os.environ | {"GOBIN": str(BIN)})
    return server


@contextmanager
def wan(upstream_port: int, latency_ms: int, rate_kbps: int | None) -> Iterator[int]:
    """A Toxiproxy in front of a local port: yields the port to talk to."""
    api_port, listen = free_port(), free_port()
    process = subprocess.Popen([str(toxiproxy_server()), "-host", "127.0.0.1", "-port", str(api_port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    api = httpx.Client(base_url=f"http://127.0.0.1:{api_port}", timeout=10)
    try:
        for _ in range(100):
            try:
                api.get("/version")
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        api.post("/proxies", json={"name": "blob", "listen": f"127.0.0.1:{listen}",
                                   "upstream": f"127.0.0.1:{upstream_port}"}).raise_for_status()
        for stream in ("upstream", "downstream"):
            api.post("/proxies/blob/toxics", json={"type": "latency", "stream": stream,
                                                   "attributes": {"latency": latency_ms}}).raise_for_status()
            if rate_kbps:
                api.post("/proxies/blob/toxics", json={"name": f"rate_{stream}", "type": "bandwidth", "stream": stream,
                                                       "attributes": {"rate": rate_kbps}}).raise_for_status()
        yield listen
    finally:
        process.terminate()
        process.wait(10)


def connection(port: int) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};")


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def sdk_round_trip(conn: str, data: bytes, block: int | None, concurrency: int) -> tuple[float, float]:
    kwargs = {} if block is None else {"max_block_size": block, "max_single_put_size": block,
                                       "max_chunk_get_size": block, "max_single_get_size": block}
    with BlobServiceClient.from_connection_string(conn, **kwargs) as service:
        blob = service.get_container_client("bench").get_blob_client(f"x{len(data)}")
        up = timed(lambda: blob.upload_blob(data, overwrite=True, max_concurrency=concurrency))
        down = timed(lambda: blob.download_blob(max_concurrency=concurrency).readall())
    return up, down


def bagpipe_round_trip(conn: str, data: bytes) -> tuple[float, float]:
    with BlobServiceClient.from_connection_string(conn) as service:
        transfers = Transfers(service)
        container = service.get_container_client("bench")
        up = timed(lambda: transfers.upload(container, f"b{len(data)}", data, "application/octet-stream"))
        down = timed(lambda: transfers.download(container, f"b{len(data)}", len(data)))
        transfers.close()
    return up, down


def network(conn: str, sizes: list[int], quick: bool) -> dict[str, dict]:
    found: dict[str, dict] = {}
    for size in sizes:
        data = os.urandom(size * MiB)
        single = sdk_round_trip(conn, data, None, 1)
        sweep = {(b, c): sdk_round_trip(conn, data, b, c) for b in BLOCKS for c in CONCURRENCY
                 if not quick or (b, c) in ((1 * MiB, 1), (4 * MiB, 8), (8 * MiB, 16), (4 * MiB, 16))}
        pick = bagpipe_round_trip(conn, data)
        best = min(sweep.items(), key=lambda kv: kv[1][0] + kv[1][1])
        found[f"{size}MiB"] = {"single_s": [round(t, 3) for t in single], "pick_s": [round(t, 3) for t in pick],
                               "pick": [plan_for(len(data)).block // 1024, plan_for(len(data)).concurrency],
                               "best": [best[0][0] // 1024, best[0][1]], "best_s": [round(t, 3) for t in best[1]],
                               "sweep": {f"{b // 1024}K×{c}": round(u + d, 3) for (b, c), (u, d) in sweep.items()}}
        print(f"  {size:>4} MiB  single {sum(single):7.2f} s  bagpipe {sum(pick):7.2f} s "
              f"(x{sum(single) / sum(pick):5.1f})  best {best[0][0] // 1024}K×{best[0][1]} {sum(best[1]):7.2f} s",
              flush=True)
    return found


def small_objects(conn: str) -> dict[str, float]:
    payloads = [os.urandom(SMALL) for _ in range(SMALL_COUNT)]
    with BlobServiceClient.from_connection_string(conn) as service:
        container: ContainerClient = service.get_container_client("bench")
        each = timed(lambda: [container.upload_blob(f"small/{i}", p, overwrite=True) for i, p in enumerate(payloads)])
        packed = b"".join(payloads)
        index = {f"small/{i}": [i * SMALL, SMALL] for i in range(SMALL_COUNT)}
        transfers = Transfers(service)
        listing = json.dumps(index).encode()
        pack = timed(lambda: (transfers.upload(container, "small.pack", packed, "application/octet-stream"),
                              transfers.upload(container, "small.pack.json", listing, "application/json")))
        transfers.close()
    return {"one_put_each_s": round(each, 2), "packed_s": round(pack, 3), "speedup": round(each / pack, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1,10,100,256")
    parser.add_argument("--quick", action="store_true", help="a few sweep points instead of all")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        azurite = Azurite(Path(tmp) / "azurite").start()
        try:
            BlobServiceClient.from_connection_string(azurite.connection_string).create_container("bench")
            print("loopback", flush=True)
            results["loopback"] = network(azurite.connection_string, sizes, args.quick)
            results["loopback_small"] = small_objects(azurite.connection_string)
            for name, rate in (("wan_100mbit", 12_500), ("wan_uncapped", None)):
                print(f"{name} (30 ms each way)", flush=True)
                with wan(azurite.blob_port, 30, rate) as port:
                    results[name] = network(connection(port), sizes, args.quick)
                    if rate:
                        results["wan_small"] = small_objects(connection(port))
        finally:
            azurite.stop()
    for name in ("loopback_small", "wan_small"):
        print(f"{name}: {results[name]}")
    big = f"{max(sizes)}MiB"

    def ratio(net: str, key: str) -> float:
        r = results[net][big]
        return round(sum(r["single_s"]) / sum(r[key]), 2)

    def pick_vs_best(net: str) -> float:
        return round(min(sum(r["best_s"]) / sum(r["pick_s"]) for r in results[net].values()), 3)

    print(json.dumps({
        "wan_speedup_256mib": ratio("wan_100mbit", "pick_s"),
        "wan_uncapped_speedup_256mib": ratio("wan_uncapped", "pick_s"),
        "loopback_speedup_256mib": ratio("loopback", "pick_s"),
        "pick_vs_best": {"loopback": pick_vs_best("loopback"), "wan_100mbit": pick_vs_best("wan_100mbit"),
                         "wan_uncapped": pick_vs_best("wan_uncapped")},
        "small_packed_speedup": {"loopback": results["loopback_small"]["speedup"],
                                 "wan": results["wan_small"]["speedup"]},
        "results": results,
    }))


if __name__ == "__main__":
    shutil.which("go") or print("note: Go is needed to install Toxiproxy")
    main()
