"""Each feed kind against a real server: HTTP (the local stack's feed server), FTP
(pyftpdlib), an Azure Blob container (Azurite) and a local directory."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from azure.storage.blob import BlobServiceClient, ContainerSasPermissions, ContentSettings, generate_container_sas
from pyftpdlib.authorizers import DummyAuthorizer
from pyftpdlib.handlers import FTPHandler
from pyftpdlib.servers import FTPServer

from bagpipe.azurite import ACCOUNT, ACCOUNT_KEY, Azurite
from bagpipe.feedserver import REAL_DATA, FeedServer
from pipeline.failures import FailureClass, StageFailure
from pipeline.feeds import SourceMissing, feed_for, granule_name, source_url
from pipeline.transfer import md5_of

DAY = date(2022, 2, 2)  # A2022033: the real MOD10A2 h09v05 granule
REAL = (REAL_DATA / "MOD10A2.A2022033.h09v05.061.2022042050729_Maximum_Snow_Extent.tif").read_bytes()


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    """A directory laid out as a feed: {product}/{year}/{doy}/{name}."""
    folder = tmp_path / "archive" / "MOD10A2" / "2022" / "033"
    folder.mkdir(parents=True)
    (folder / granule_name("MOD10A2", "h09v05", DAY)).write_bytes(REAL)
    return tmp_path / "archive"


@pytest.fixture
def ftp(archive: Path) -> Iterator[str]:
    authorizer = DummyAuthorizer()
    authorizer.add_anonymous(str(archive))
    handler = type("Handler", (FTPHandler,), {"authorizer": authorizer})
    server = FTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"timeout": 0.2}, daemon=True)
    thread.start()
    yield f"ftp://127.0.0.1:{server.address[1]}"
    server.close_all()
    thread.join(5)


def test_http_feed_serves_the_real_granule_with_length_and_md5() -> None:
    with FeedServer() as feed:
        url = source_url(feed.template, "MOD10A2", "h09v05", DAY)
        got = feed_for(url).fetch(url)
        assert got.data == REAL and got.length == len(REAL) and got.md5 == md5_of(REAL)
        synthesized = source_url(feed.template, "MOD10A2", "h08v05", DAY)
        again = feed_for(synthesized).fetch(synthesized)
        assert again.data == feed_for(synthesized).fetch(synthesized).data  # deterministic
        with pytest.raises(SourceMissing):
            off_globe = source_url(feed.template, "MOD10A2", "h00v00", DAY)
            feed_for(off_globe).fetch(off_globe)


def test_ftp_feed(ftp: str) -> None:
    url = source_url(ftp + "/{product}/{year}/{doy}/{name}", "MOD10A2", "h09v05", DAY)
    got = feed_for(url).fetch(url)
    assert got.data == REAL and got.length == len(REAL)
    with pytest.raises(SourceMissing):
        missing = source_url(ftp + "/{product}/{year}/{doy}/{name}", "MOD10A2", "h10v05", DAY)
        feed_for(missing).fetch(missing)


def test_local_directory_feed(archive: Path) -> None:
    url = source_url(archive.as_uri() + "/{product}/{year}/{doy}/{name}", "MOD10A2", "h09v05", DAY)
    assert feed_for(url).fetch(url).data == REAL
    with pytest.raises(SourceMissing):
        missing = source_url(archive.as_uri() + "/{product}/{year}/{doy}/{name}", "MOD10A2", "h09v05",
                             date(2022, 2, 10))
        feed_for(missing).fetch(missing)


def test_blob_container_feed(azurite: Azurite, settings: object) -> None:
    service = BlobServiceClient.from_connection_string(azurite.connection_string)
    container = service.get_container_client(f"feed{datetime.now(UTC):%H%M%S%f}")
    container.create_container()
    name = f"MOD10A2.061/2022.02.02/{granule_name('MOD10A2', 'h09v05', DAY)}"
    container.upload_blob(name, REAL, content_settings=ContentSettings(content_md5=bytearray(md5_of(REAL))))
    sas = generate_container_sas(ACCOUNT, container.container_name, account_key=ACCOUNT_KEY,
                                 permission=ContainerSasPermissions(read=True),
                                 expiry=datetime.now(UTC) + timedelta(minutes=10))
    template = "blob+" + container.url + "/{product}.{collection}/{ymd}/{name}?" + sas
    url = source_url(template, "MOD10A2", "h09v05", DAY)
    got = feed_for(url).fetch(url)
    assert got.data == REAL and got.md5 == md5_of(REAL) and got.length == len(REAL)
    with pytest.raises(SourceMissing):
        missing = source_url(template, "MOD10A2", "h10v05", DAY)
        feed_for(missing).fetch(missing)


def test_an_unknown_scheme_is_a_classified_failure() -> None:
    with pytest.raises(StageFailure) as caught:
        feed_for("gopher://example.org/x")
    assert caught.value.failure is FailureClass.SOURCE_DOWNLOAD
