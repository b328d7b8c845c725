"""The storage clients and the environment, against Azurite: a proxy the environment names
(``HTTP_PROXY``) carries every storage request, on the blocking and the asynchronous
clients, and a CA bundle it names for requests (``REQUESTS_CA_BUNDLE``) is trusted by the
blocking clients (aiohttp, under the asynchronous one, trusts the system's store); with no
proxy named, a CA bundle named or not, the clients do not look the environment over on each
request, and a login that ``~/.netrc`` holds for the storage host does not replace a
request's own signature (it did: the blocking client sent it instead, refused, and the
asynchronous one refused to send at all)."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import os
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import certifi
import pytest
from azure.core.exceptions import HttpResponseError
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from pipeline.settings import Settings
from pipeline.storage import cache
from pipeline.storage.clients import CA_BUNDLE_VARIABLES, Clients


class _Forward(BaseHTTPRequestHandler):
    """A forward proxy for plain HTTP: each request (its target in absolute form) sent on
    to its host, and the answer back; the targets are kept in ``server.seen``, each with the
    range it asked for (``x-ms-range``)."""

    def do_GET(self) -> None:
        target = urlsplit(self.path)
        self.server.seen.append((self.path, self.headers.get("x-ms-range")))  # type: ignore[attr-defined]
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


class _NothingThere(BaseHTTPRequestHandler):
    """Storage that has nothing: every request answered 404."""

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@contextmanager
def _serving(server: ThreadingHTTPServer) -> Iterator[ThreadingHTTPServer]:
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Forward)
    server.seen = []  # type: ignore[attr-defined]
    with _serving(server) as serving:
        yield serving


@pytest.fixture
def nothing_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy (any ``*_proxy`` variable) and no CA bundle in the environment."""
    for name in list(os.environ):
        if name.lower().endswith("_proxy") or name in CA_BUNDLE_VARIABLES:
            monkeypatch.delenv(name)


def reads(settings: Settings) -> tuple[bytes, bytes, int, dict[str, bytes]]:
    """A blob read (the SDK's and Transfers') and a table read on the blocking clients, a
    look on the asynchronous one, by clients made now (they take the environment as it is
    when they are made)."""
    clients = Clients(settings)
    try:
        blob = clients.tiles.download_blob("a.tif").readall()
        transferred, _ = clients.transfers.download(clients.tiles, "a.tif")
        entity = clients.jobs.get_entity("p", "r")
        with cache.Looks(clients) as looks:
            looked = looks.present(clients.tiles.container_name, ["a.tif"])
    finally:
        clients.close()
    return blob, transferred, int(entity["Value"]), looked


@pytest.fixture
def stored(clients: Clients) -> Settings:
    clients.tiles.upload_blob("a.tif", b"a tile")
    clients.jobs.upsert_entity({"PartitionKey": "p", "RowKey": "r", "Value": 7})
    return clients.settings


def test_a_proxy_the_environment_names_carries_the_storage_requests(
        stored: Settings, proxy: ThreadingHTTPServer, nothing_named: None, monkeypatch: pytest.MonkeyPatch) -> None:
    before = reads(stored)
    assert before[:3] == (b"a tile", b"a tile", 7) and set(before[3]) == {"a.tif"}
    assert proxy.seen == []  # type: ignore[attr-defined]
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
    assert reads(stored) == before
    seen = [(urlsplit(target).path, asked) for target, asked in proxy.seen]  # type: ignore[attr-defined]
    assert sum(path.endswith("/a.tif") for path, _ in seen) >= 3  # the blob read, transferred and looked at
    assert any(path.endswith("/a.tif") and asked == "bytes=0-0" for path, asked in seen)  # the look's read
    assert any("(PartitionKey='p',RowKey='r')" in path for path, _ in seen)  # the table row


@pytest.mark.parametrize("bundle", [False, True], ids=["nothing named", "a CA bundle named"])
def test_a_netrc_login_for_the_storage_host_does_not_replace_a_request_signature(
        stored: Settings, nothing_named: None, bundle: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    host = urlsplit(Clients(stored).blob_service.url).hostname
    netrc = tmp_path / ".netrc"
    netrc.write_text(f"machine {host}\n  login someone\n  password not-the-account-key\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("NO_PROXY", "example.org")  # names no proxy
    if bundle:  # as many systems do (Debian's, Nix's): the transports read nothing else from it
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", certifi.where())
    blob, transferred, value, looked = reads(stored)
    assert (blob, transferred, value, set(looked)) == (b"a tile", b"a tile", 7, {"a.tif"})


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key: trusted only where it is named."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bagpipe test storage")])
    now = datetime.datetime.now(datetime.UTC)
    here = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(hours=1))
                   .add_extension(here, critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    cert, private = folder / "storage.pem", folder / "storage.key"
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert, private


def test_a_ca_bundle_the_environment_names_is_trusted_by_the_blocking_clients(
        nothing_named: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, private = _self_signed(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NothingThere)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, private)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    with _serving(server) as serving:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
        endpoint = f"https://127.0.0.1:{serving.server_address[1]}/devstoreaccount1"
        clients = Clients(Settings(storage_connection=(
            "DefaultEndpointsProtocol=https;AccountName=devstoreaccount1;AccountKey=a2V5;"
            f"BlobEndpoint={endpoint};QueueEndpoint={endpoint};TableEndpoint={endpoint};"), namespace="tls"))
        try:  # each answered over TLS, 404 (an untrusted certificate: ServiceRequestError)
            for call in (clients.tiles.get_container_properties, lambda: clients.jobs.get_entity("p", "r"),
                         lambda: clients.transfers.download(clients.tiles, "a.tif")):
                with pytest.raises(HttpResponseError) as answer:
                    call()
                assert answer.value.status_code == 404
        finally:
            clients.close()
