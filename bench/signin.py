"""What signing every request in costs, and what an upload costs: the median time of a
signed-in API request (``GET /api/me``: a token's row and its user's, two point reads) beside
one that reads nothing (``GET /api/auth``), on uvicorn against a fresh Azurite; and the time
to check, digest and store a reducer bundle of 1, 10 and 30 MiB (``POST /api/reducers``), and
for a worker to fetch, check and unpack it into its cache.

    python -m bench.signin [--requests 300]

The last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tarfile
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bagpipe.stack import LocalStack
from bench.throughput import fresh_azurite
from pipeline.reduction import bundlecache
from pipeline.storage.clients import Clients


def _timed(call: object, times: int) -> float:
    """Median milliseconds of ``times`` calls."""
    seconds = []
    for _ in range(times):
        started = time.perf_counter()
        call()  # type: ignore[operator]
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds) * 1000


def _bundle(mib: int) -> bytes:
    """A reducer bundle with ``mib`` MiB of incompressible data beside its program."""
    raw = io.BytesIO()
    files = {"reducer.json": json.dumps({"name": f"bench{mib}", "argv": ["{python}", "{here}/run.py"]}).encode(),
             "run.py": b"print('ok')\n", "weights.bin": np.random.default_rng(mib).bytes(mib * 1024 * 1024)}
    with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-signin-") as top, fresh_azurite(Path(top)) as azurite, \
            LocalStack(Path(top, "home"), workers=0, connection=azurite.connection_string) as stack:
        http = httpx.Client(base_url=stack.api_url, timeout=120)
        http.get("/api/me", headers=stack.headers).raise_for_status()  # warm: connections, the day's audit
        figures["open_request_ms"] = _timed(lambda: http.get("/api/auth").raise_for_status(), args.requests)
        figures["signed_request_ms"] = _timed(lambda: http.get("/api/me", headers=stack.headers).raise_for_status(),
                                              args.requests)
        for mib in (1, 10, 30):
            body = _bundle(mib)
            started = time.perf_counter()
            gzip = stack.headers | {"content-type": "application/gzip"}
            pushed = http.post("/api/reducers", content=body, headers=gzip)
            pushed.raise_for_status()
            figures[f"upload_{mib}mib_s"] = time.perf_counter() - started
            cache = Path(top, f"cache{mib}")
            clients = Clients(stack.settings.with_(bundle_cache=str(cache)))
            started = time.perf_counter()
            bundlecache.folder_for(clients, pushed.json()["digest"])
            figures[f"first_fetch_{mib}mib_s"] = time.perf_counter() - started
            started = time.perf_counter()
            bundlecache.folder_for(clients, pushed.json()["digest"])  # cached: checked again, not fetched
            figures[f"cached_use_{mib}mib_s"] = time.perf_counter() - started
            clients.close()
    for name, value in figures.items():
        print(f"{name:>24}: {value:8.3f}")
    print(json.dumps({k: round(v, 4) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
