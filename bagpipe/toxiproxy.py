"""Toxiproxy (Shopify's fault-injection TCP proxy) between bagpipe and a local service: a
WAN on one machine (latency, a bandwidth cap) and connection faults (resets, stalls, cuts).

``make setup`` installs the server into ``.tools/toxiproxy`` with ``go install``; the
benchmarks and the tests drive it through its HTTP API.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from bagpipe.serving import free_port

VERSION = "v2.12.0"
PACKAGE = f"github.com/Shopify/toxiproxy/v2/cmd/server@{VERSION}"
SERVER = Path(__file__).resolve().parent.parent / ".tools" / "toxiproxy" / "server"


def install() -> Path:
    """The server binary, built with ``go install`` if it is missing."""
    if not SERVER.exists():
        go = shutil.which("go") or "/usr/local/go/bin/go"
        SERVER.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([go, "install", PACKAGE], check=True, env=os.environ | {"GOBIN": str(SERVER.parent)})
    return SERVER


class Toxiproxy:
    """One Toxiproxy server on free ports, with one proxy per upstream added by :meth:`proxy`."""

    def __init__(self) -> None:
        self.api_port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self._proxies: dict[str, dict[str, str]] = {}
        # removing a toxic waits for its links to hand over what they hold (a slow bandwidth
        # toxic's chunk), which on a loaded machine can take well over ten seconds
        self.api = httpx.Client(base_url=f"http://127.0.0.1:{self.api_port}", timeout=60)

    def start(self) -> Toxiproxy:
        self._process = subprocess.Popen([str(install()), "-host", "127.0.0.1", "-port", str(self.api_port)],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                self.api.get("/version").raise_for_status()
                return self
            except httpx.HTTPError:
                if time.monotonic() > deadline or self._process.poll() is not None:
                    raise RuntimeError("toxiproxy did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(10)
            self._process = None
        self.api.close()

    def __enter__(self) -> Toxiproxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def proxy(self, name: str, upstream_port: int) -> int:
        """A proxy to ``127.0.0.1:upstream_port``; returns the port that reaches it."""
        listen = free_port()
        self._proxies[name] = {"name": name, "listen": f"127.0.0.1:{listen}",
                               "upstream": f"127.0.0.1:{upstream_port}"}
        self.api.post("/proxies", json=self._proxies[name]).raise_for_status()
        return listen

    def heal(self, proxy: str) -> None:
        """The link as new, on the same port: every connection through it closed, no toxic left.

        Removing a toxic waits for each connection that holds it to hand over what it holds,
        and a connection stalled mid-transfer may never do so (the server gives up after 25 s
        with a 503); replacing the proxy closes those connections instead of waiting on them.
        """
        self.api.delete(f"/proxies/{proxy}").raise_for_status()
        self.api.post("/proxies", json=self._proxies[proxy]).raise_for_status()

    def toxic(self, proxy: str, kind: str, stream: str = "downstream", toxicity: float = 1.0,
              name: str | None = None, **attributes: Any) -> str:
        """Add a toxic (``latency``, ``bandwidth``, ``reset_peer``, ``timeout``,
        ``limit_data``…) to one direction of a proxy; returns its name."""
        name = name or f"{kind}_{stream}"
        self.api.post(f"/proxies/{proxy}/toxics", json={
            "name": name, "type": kind, "stream": stream, "toxicity": toxicity, "attributes": attributes,
        }).raise_for_status()
        return name

    def remove(self, proxy: str, toxic: str) -> None:
        self.api.delete(f"/proxies/{proxy}/toxics/{toxic}").raise_for_status()
