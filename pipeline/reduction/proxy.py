"""The only way out of a cell whose reducer lists hosts: an HTTP proxy, run by the sandbox in
the stage process, on a listening socket the jail made inside the cell's own network
namespace (where the program finds it on its loopback, at ``HTTPS_PROXY``) and handed out.

A program's request goes on only to a host and port its reducer's manifest lists
(``"network": {"hosts": ["data.example.org:443"]}``), and only when every address that name
resolves to is a public one: never loopback, link-local (the cloud's metadata endpoint),
a private network (the worker's own services) or any other non-global address, whatever the
name says; it is then connected to the address that was checked, not resolved again.
It takes a ``CONNECT host:port`` (HTTPS, or any TCP a client tunnels) or a plain HTTP
request in absolute form (``GET http://host:port/…``), forwarded as it came; anything else
gets an HTTP error that says why.
"""

from __future__ import annotations

import ipaddress
import logging
import selectors
import socket
import threading
from collections.abc import Iterable
from typing import cast
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

MAX_HEAD = 16 * 1024  # a request's line and headers
TIMEOUT_S = 30.0  # to read a request's head, and to connect
CHUNK = 64 * 1024


class Refused(Exception):
    """A request the proxy does not relay: ``status`` and why, for the program."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def public(address: str) -> bool:
    """Whether a program may be connected to ``address``: a global unicast address only."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class Proxy:
    """Relays what ``listener`` accepts to ``hosts`` ("host:port", lower case), in threads of
    its own, until :meth:`close`."""

    def __init__(self, listener: socket.socket, hosts: Iterable[str]) -> None:
        self.listener = listener
        self.hosts = frozenset(hosts)
        self._stop = threading.Event()
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="reduce-proxy", daemon=True)

    def start(self) -> Proxy:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting and cut every connection still relayed (the program has ended)."""
        self._stop.set()
        self._thread.join()
        self.listener.close()
        with self._lock:
            for sock in self._open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _accept(self) -> None:
        with selectors.DefaultSelector() as ready:  # not select(): descriptors may number past 1,024
            ready.register(self.listener, selectors.EVENT_READ)
            while not self._stop.is_set():
                if ready.select(0.2):
                    self._accept_one()

    def _accept_one(self) -> None:
        try:
            client, _ = self.listener.accept()
        except OSError:
            return
        threading.Thread(target=self._serve, args=(client,), name="reduce-proxy-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        self._hold(client)
        try:
            head, rest = _read_head(client)
            upstream, tunnel = self._open_upstream(head)
            self._hold(upstream)
            if tunnel:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                pending = rest
            else:
                pending = head + rest
            if pending:
                upstream.sendall(pending)
            _relay(client, upstream)
        except Refused as exc:
            log.info("reducer's request refused: %s", exc)
            _answer(client, exc.status, str(exc))
        except OSError as exc:
            _answer(client, 502, f"could not relay: {exc}")
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with self._lock:
                        self._open.discard(sock)
                    sock.close()

    def _hold(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.add(sock)

    def _open_upstream(self, head: bytes) -> tuple[socket.socket, bool]:
        """The connection a request's head asks for, if allowed, and whether it is a tunnel."""
        try:
            method, target, _ = head.split(b"\r\n", 1)[0].decode("ascii").split(" ")
        except (UnicodeDecodeError, ValueError):
            raise Refused(400, "not an HTTP request") from None
        if method == "CONNECT":
            host, _, port_text = target.rpartition(":")
            host = host.strip("[]")
        else:
            url = urlsplit(target)
            if url.scheme != "http" or not url.hostname:
                raise Refused(400, f"{method} {target[:100]}: a proxy request names an http:// URL (or CONNECT)")
            host, port_text = url.hostname, str(url.port or 80)
        if not port_text.isdigit():
            raise Refused(400, f"{target[:100]}: no port")
        port = int(port_text)
        wanted = f"{host.lower()}:{port}"
        if wanted not in self.hosts:
            raise Refused(403, f"{wanted[:100]} is not among the hosts the reducer lists")
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise Refused(502, f"{wanted}: {exc}") from None
        addresses = [str(info[4][0]) for info in found]
        if not addresses or not all(public(address) for address in addresses):
            raise Refused(403, f"{wanted} resolves to an address that is not public ({', '.join(addresses)})")
        family, kind, proto, _, sockaddr = found[0]
        upstream = socket.socket(family, kind, proto)
        try:
            upstream.settimeout(TIMEOUT_S)
            upstream.connect(sockaddr)
            upstream.settimeout(None)
        except OSError:
            upstream.close()
            raise
        return upstream, method == "CONNECT"


def _read_head(client: socket.socket) -> tuple[bytes, bytes]:
    """A request's line and headers (through the blank line), and what came after them."""
    client.settimeout(TIMEOUT_S)
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD:
            raise Refused(431, "request head too large")
        chunk = client.recv(4096)
        if not chunk:
            raise OSError("closed before its request was complete")
        data += chunk
    client.settimeout(None)
    end = data.index(b"\r\n\r\n") + 4
    return data[:end], data[end:]


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy both ways until one side closes."""
    peers = {a: b, b: a}
    with selectors.DefaultSelector() as ready:
        for sock in peers:
            ready.register(sock, selectors.EVENT_READ)
        while True:
            for key, _ in ready.select():
                sock = cast(socket.socket, key.fileobj)
                data = sock.recv(CHUNK)
                if not data:
                    return
                peers[sock].sendall(data)


def _answer(client: socket.socket, status: int, why: str) -> None:
    """The refusal, its reason in the status line too (where a client's error message shows it)."""
    reason = "".join(c if c.isprintable() and c.isascii() else "?" for c in why)[:200]
    body = (why + "\n").encode()
    try:
        client.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                       f"Connection: close\r\n\r\n".encode() + body)
    except OSError:
        pass
