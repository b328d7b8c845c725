"""An ASGI app served by uvicorn from a thread on a free port of a loopback address: how the
local stack runs its API and its imitations of Planetary Computer and NASA."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, let go: for a separate program told to listen there (Toxiproxy), or
    for an address nothing is to listen on. A server of this process takes :func:`bound`."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def bound(host: str, port: int = 0) -> socket.socket:
    """A socket listening on ``host``: on ``port`` if it is free, else on any free one. It is
    held from here on and handed to the server, so that no other process takes the port before
    the server serves, as one could take a port found free and let go. It listens at once: a
    socket only bound shares its port with any other that asks for reuse (SO_REUSEADDR), as
    servers do. It is made as a TCP socket by name (``IPPROTO_TCP``, where ``socket()`` says
    0): asyncio turns Nagle's algorithm off only on connections it accepts from such a
    socket, and with it on, an answer written in pieces (an SMTP reply of several lines, a
    header and then a body) waited out the client's delayed acknowledgement, 40 ms."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds its own
    try:
        try:
            sock.bind((host, port))
        except OSError:
            if not port:
                raise
            sock.bind((host, 0))  # the port asked for is taken: any free one
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


class Served:
    """One app on ``host``; ``url`` once started."""

    def __init__(self, app: Any, host: str = "127.0.0.1", name: str = "http", own_headers: bool = True,
                 port: int = 0, sock: socket.socket | None = None) -> None:
        """``own_headers``: uvicorn adds its ``server`` and ``date`` headers (not to a
        pass-through's answers, which carry their origin's); ``port``: this one if it is free;
        ``sock``: a socket :func:`bound` already, whose address the app was told before it was made."""
        self.socket = sock or bound(host, port)
        self.host, self.port = host, int(self.socket.getsockname()[1])
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=self.port, log_level="warning",
                                                    access_log=False, server_header=own_headers,
                                                    date_header=own_headers))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, name=name,
                                       daemon=True)

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
