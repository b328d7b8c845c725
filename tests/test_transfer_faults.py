"""Connections cut or stalled in the middle of a transfer, through a real Toxiproxy in front of
Azurite: a cut is retried (each block or range on a new connection) to a byte-exact success;
a fault that outlasts the retries ends as a classified, transient failure, and neither side
ever sees a partial object: no half-written blob replaces the old one, no truncated bytes
are handed back."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
from azure.storage.blob import BlobServiceClient

from bagpipe.azurite import ACCOUNT, ACCOUNT_KEY, Azurite
from bagpipe.toxiproxy import Toxiproxy
from pipeline.failures import FailureClass, classify
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.storage.transfer import NEAR_S, WIDE_RATE, MiB, Transfers, md5_of

# it times workers, attempts or links: `make test` runs it alone, not beside other tests
pytestmark = pytest.mark.alone

SIZE = 10 * MiB + 12345  # through a narrow WAN, 1 MiB blocks and ranges, all in flight


@pytest.fixture
def proxy(azurite: Azurite) -> Iterator[tuple[Toxiproxy, int]]:
    """Azurite behind a narrow WAN: 15 ms each way and 100 Mbit/s a connection, so that
    transfers take the plans for storage far away, as from a scientist's laptop, with
    many blocks in flight."""
    with Toxiproxy() as toxiproxy:
        port = toxiproxy.proxy("blob", azurite.blob_port)
        _wan(toxiproxy)
        yield toxiproxy, port


def _wan(toxiproxy: Toxiproxy) -> None:
    for stream in ("upstream", "downstream"):
        toxiproxy.toxic("blob", "latency", stream, latency=15)
        toxiproxy.toxic("blob", "bandwidth", stream, rate=12_500)


def _heal(toxiproxy: Toxiproxy) -> None:
    """The narrow WAN again, without the faults, and without the connections they stalled."""
    toxiproxy.heal("blob")
    _wan(toxiproxy)


def _service(port: int) -> BlobServiceClient:
    return BlobServiceClient.from_connection_string(
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};")


def _through(clients: Clients, port: int, retries: int = 5, read_timeout: float = 60) -> Transfers:
    """Transfers to the storage behind the proxy, its link measured (as a process's first
    transfer measures it) before any fault is set."""
    transfers = Transfers(_service(port), read_timeout=read_timeout, retries=retries)
    transfers.link(clients.products)
    return transfers


def test_the_plan_follows_the_link_to_storage(clients: Clients, proxy: tuple[Toxiproxy, int]) -> None:
    toxiproxy, port = proxy
    narrow = _through(clients, port)
    for stream in ("upstream", "downstream"):
        toxiproxy.remove("blob", f"bandwidth_{stream}")
    wide = _through(clients, port)
    near_link, narrow_link, wide_link = (t.link(clients.products) for t in (clients.transfers, narrow, wide))
    assert near_link.round_trip < NEAR_S <= 0.030 <= min(narrow_link.round_trip, wide_link.round_trip)
    assert narrow_link.rate < WIDE_RATE <= wide_link.rate
    data = os.urandom(SIZE)
    for transfers, name in ((clients.transfers, "near"), (narrow, "narrow"), (wide, "wide")):
        plan = transfers.plan(clients.products, SIZE)
        transfers.upload(clients.products, f"plans/{name}", data, "application/octet-stream")
        blocks = clients.products.get_blob_client(f"plans/{name}").get_block_list("committed")[0]
        if name == "narrow":  # small blocks, all in flight: latency and a connection's rate rule
            assert len(blocks) == -(-SIZE // plan.block) > 1 and plan.concurrency >= len(blocks)
        else:  # one request: a round trip costs more than the bytes
            assert blocks == [] and plan.block >= SIZE
        assert transfers.download(clients.products, f"plans/{name}", SIZE)[0] == data
    # the probe is an uncommitted block: it shows in no listing
    assert [b.name for b in clients.products.list_blobs(name_starts_with="plans/")] == [
        "plans/narrow", "plans/near", "plans/wide"]
    assert not [b for b in clients.products.list_blobs() if b.name.startswith(names.probe_blob(""))]
    # storage that refuses the probe (here: no such container) gets the narrow plans, safe anywhere
    service = _service(port)
    refused = Transfers(service)
    assert refused.link(service.get_container_client("nosuch")).rate == 0
    assert refused.plan(clients.products, SIZE) == narrow.plan(clients.products, SIZE)
    for transfers in (narrow, wide, refused):
        transfers.close()


def test_connections_cut_mid_transfer_are_retried_to_a_byte_exact_result(
    clients: Clients, proxy: tuple[Toxiproxy, int]
) -> None:
    toxiproxy, port = proxy
    transfers = _through(clients, port)
    data = os.urandom(SIZE)
    # every connection is closed after 1.5 MiB, in each direction: block PUTs and range GETs
    # are cut half way through the body, over and over
    toxiproxy.toxic("blob", "limit_data", "upstream", bytes=3 * MiB // 2)
    toxiproxy.toxic("blob", "limit_data", "downstream", bytes=3 * MiB // 2)
    assert transfers.upload(clients.products, "faults/cut.bin", data, "application/octet-stream") == md5_of(data)
    back, md5 = transfers.download(clients.products, "faults/cut.bin", SIZE)
    assert back == data and md5 == md5_of(data)

    # connections reset by the peer at random (a third of them, 50 ms in)
    _heal(toxiproxy)
    toxiproxy.toxic("blob", "reset_peer", "upstream", toxicity=0.33, timeout=50)
    again = os.urandom(SIZE)
    transfers.upload(clients.products, "faults/reset.bin", again, "application/octet-stream")
    assert transfers.download(clients.products, "faults/reset.bin", SIZE)[0] == again
    assert clients.products.download_blob("faults/reset.bin").readall() == again  # as stored, not as cached
    transfers.close()


def test_a_fault_that_outlasts_the_retries_is_classified_and_leaves_nothing_partial(
    clients: Clients, proxy: tuple[Toxiproxy, int]
) -> None:
    toxiproxy, port = proxy
    old, new = os.urandom(SIZE), os.urandom(SIZE)
    clients.transfers.upload(clients.products, "faults/x.bin", old, "application/octet-stream")
    transfers = _through(clients, port, retries=1, read_timeout=2)

    # the link stalls in the middle of an upload (every byte dropped from then on)
    toxiproxy.toxic("blob", "bandwidth", "upstream", rate=400, name="slow")  # ~2.6 s a block
    stall = threading.Timer(0.8, lambda: toxiproxy.toxic("blob", "timeout", "upstream", timeout=0))
    stall.start()
    with pytest.raises(Exception) as caught:
        transfers.upload(clients.products, "faults/x.bin", new, "application/octet-stream")
    stall.join()
    assert classify(caught.value) in (FailureClass.OPERATION_TIMEOUT, FailureClass.CONNECTION)
    assert classify(caught.value).transient
    # the blocks that got through were never committed: the blob is still the old object
    assert clients.transfers.download(clients.products, "faults/x.bin", SIZE)[0] == old

    # a download that stalls mid-way hands back nothing
    _heal(toxiproxy)
    toxiproxy.toxic("blob", "limit_data", "downstream", bytes=3 * MiB // 2)
    toxiproxy.toxic("blob", "reset_peer", "downstream", toxicity=1.0, timeout=200)
    with pytest.raises(Exception) as caught:
        transfers.download(clients.products, "faults/x.bin", SIZE)
    assert classify(caught.value) in (FailureClass.OPERATION_TIMEOUT, FailureClass.CONNECTION)

    # once the network heals, the same call (the task's retry) succeeds
    _heal(toxiproxy)
    transfers.upload(clients.products, "faults/x.bin", new, "application/octet-stream")
    assert clients.transfers.download(clients.products, "faults/x.bin", SIZE)[0] == new
    transfers.close()
