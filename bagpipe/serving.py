"""An ASGI app served by uvicorn from a thread on a free port of a loopback address: how the
local stack runs its API and its imitations of Planetary Computer and NASA."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def is_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


class Served:
    """One app on ``host``; ``url`` once started."""

    def __init__(self, app: Any, host: str = "127.0.0.1", name: str = "http", own_headers: bool = True,
                 port: int = 0) -> None:
        """``own_headers``: uvicorn adds its ``server`` and ``date`` headers (not to a
        pass-through's answers, which carry their origin's); ``port``: this one if it is free."""
        self.host, self.port = host, port if port and is_free(host, port) else free_port(host)
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="warning",
                                                    access_log=False, server_header=own_headers,
                                                    date_header=own_headers))
        self.thread = threading.Thread(target=self.server.run, name=name, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> Served:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"{self.thread.name} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
