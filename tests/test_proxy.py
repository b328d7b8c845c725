"""The storage clients and the environment, against Azurite: a proxy the environment names
(``HTTP_PROXY``) carries every storage request, on the blocking and the asynchronous
clients; with none named, the clients do not look the environment over on each request,
and a login that ``~/.netrc`` holds for the storage host does not replace a request's own
signature (it did: the blocking client sent it instead, refused, and the asynchronous one
refused to send at all)."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from pipeline.settings import Settings
from pipeline.storage import cache
from pipeline.storage.clients import Clients

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


class _Forward(BaseHTTPRequestHandler):
    """A forward proxy for plain HTTP: each request (its target in absolute form) sent on
    to its host, and the answer back; the targets are kept in ``server.seen``."""

    def do_GET(self) -> None:
        target = urlsplit(self.path)
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        upstream = http.client.HTTPConnection(target.netloc, timeout=30)
        try:
            path = target.path + (f"?{target.query}" if target.query else "")
            headers = {k: v for k, v in self.headers.items() if k.lower() != "proxy-connection"}
            upstream.request("GET", path, headers=headers)
            answer = upstream.getresponse()
            body = answer.read()
        finally:
            upstream.close()
        self.send_response(answer.status)
        for key, value in answer.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def proxy() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Forward)
    server.seen = []  # type: ignore[attr-defined]
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def no_proxy_named(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def reads(settings: Settings) -> tuple[bytes, int, dict[str, bytes]]:
    """A blob read and a table read on the blocking clients, a look on the asynchronous one,
    by clients made now (they take the environment as it is when they are made)."""
    clients = Clients(settings)
    blob = clients.tiles.download_blob("a.tif").readall()
    entity = clients.jobs.get_entity("p", "r")
    with cache.Looks(clients) as looks:
        looked = looks.present(clients.tiles.container_name, ["a.tif"])
    return blob, int(entity["Value"]), looked


@pytest.fixture
def stored(clients: Clients) -> Settings:
    clients.tiles.upload_blob("a.tif", b"a tile")
    clients.jobs.upsert_entity({"PartitionKey": "p", "RowKey": "r", "Value": 7})
    return clients.settings


def test_a_proxy_the_environment_names_carries_the_storage_requests(
        stored: Settings, proxy: ThreadingHTTPServer, no_proxy_named: None, monkeypatch: pytest.MonkeyPatch) -> None:
    blob, value, looked = reads(stored)
    assert proxy.seen == []  # type: ignore[attr-defined]
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
    assert reads(stored) == (blob, value, looked) and value == 7 and set(looked) == {"a.tif"}
    seen = [urlsplit(target).path for target in proxy.seen]  # type: ignore[attr-defined]
    assert any(path.endswith("/a.tif") for path in seen)  # the blob, read and looked at
    assert any("(PartitionKey='p',RowKey='r')" in path for path in seen)  # the table row
    assert sum(path.endswith("/a.tif") for path in seen) == 2


def test_a_netrc_login_for_the_storage_host_does_not_replace_a_request_signature(
        stored: Settings, no_proxy_named: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = urlsplit(Clients(stored).blob_service.url).hostname
    netrc = tmp_path / ".netrc"
    netrc.write_text(f"machine {host}\n  login someone\n  password not-the-account-key\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(netrc))
    blob, value, looked = reads(stored)
    assert (blob, value, set(looked)) == (b"a tile", 7, {"a.tif"})
