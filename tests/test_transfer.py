"""Transfers round-trip byte-exact at every awkward size, store every object's MD5, and a
blob whose bytes changed behind the SDK's back is caught as a corrupt read, never used. A
file goes up from disk in blocks, no more of them in flight than its caller allows."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from azure.storage.blob import ContentSettings

from pipeline.failures import FailureClass, StageFailure
from pipeline.storage import cache
from pipeline.storage.clients import Clients
from pipeline.storage.transfer import MiB, Plan, md5_of, plan_for

# it times workers, attempts or links: `make test` runs it alone, not beside other tests
pytestmark = pytest.mark.alone

SINGLE = plan_for(1).block  # near the storage, objects up to this size go in one request
BLOCK = plan_for(SINGLE + 1).block  # and larger ones in blocks of this size


@pytest.mark.parametrize("size", [0, 1, SINGLE - 1, SINGLE, SINGLE + 1, BLOCK * 3 - 1, BLOCK * 3, BLOCK * 3 + 1,
                                  70 * MiB + 3])
def test_round_trip_is_byte_exact_and_stores_the_md5(clients: Clients, size: int) -> None:
    data = os.urandom(size)
    name = f"roundtrip/{size}.bin"
    md5 = clients.transfers.upload(clients.products, name, data, "application/octet-stream")
    assert md5 == md5_of(data)
    stored = clients.products.get_blob_client(name).get_blob_properties()
    assert stored.size == size and bytes(stored.content_settings.content_md5) == md5
    for hint in (None, size):
        back, back_md5 = clients.transfers.download(clients.products, name, hint)
        assert back == data and back_md5 == md5
    plan = clients.transfers.plan(clients.products, size)
    assert plan == plan_for(size), "Azurite on this machine is near"
    if size > plan.block:  # a large object went up as blocks, not one request
        blocks = clients.products.get_blob_client(name).get_block_list("committed")[0]
        assert len(blocks) == -(-size // plan.block)


def test_a_file_goes_up_in_blocks_with_no_more_in_flight_than_allowed(clients: Clients, tmp_path: Path) -> None:
    data = os.urandom(BLOCK * 3 + 5)
    path = tmp_path / "cube.nc"
    path.write_bytes(data)
    md5 = clients.transfers.upload_file(clients.products, "files/cube.nc", path, "application/x-netcdf",
                                        in_flight=BLOCK + 1)
    assert md5 == md5_of(data)
    back, back_md5 = clients.transfers.download(clients.products, "files/cube.nc")
    assert back == data and back_md5 == md5
    blocks = clients.products.get_blob_client("files/cube.nc").get_block_list("committed")[0]
    assert len(blocks) == 4
    plan = plan_for(len(data))
    assert plan.concurrency > 1, "the plan itself has several blocks in flight"
    assert plan.within(BLOCK + 1) == Plan(plan.block, 1) and plan.within(3 * BLOCK) == Plan(plan.block, 3)
    assert plan.within(1) == Plan(plan.block, 1), "one block at least"
    assert plan.within(None) == plan


def test_a_blob_changed_behind_our_back_is_a_corrupt_read(clients: Clients) -> None:
    data = os.urandom(300_000)
    clients.transfers.upload(clients.products, "corrupt/x.bin", data, "application/octet-stream")
    tampered = bytearray(data)
    tampered[12345] ^= 0xFF
    # the bytes change, the stored MD5 stays: what a bad disk or a bad write leaves
    blob = clients.products.get_blob_client("corrupt/x.bin")
    blob.upload_blob(bytes(tampered), overwrite=True)
    blob.set_http_headers(ContentSettings(content_md5=bytearray(md5_of(data))))
    with pytest.raises(StageFailure) as caught:
        clients.transfers.download(clients.products, "corrupt/x.bin")
    assert caught.value.failure is FailureClass.CORRUPT_BLOB and caught.value.failure.transient
    # and the cache never hands it to a stage as a source
    with pytest.raises(StageFailure):
        cache.ensure(clients.transfers, clients.products, "corrupt/x.bin", lambda: b"never called", "x")
