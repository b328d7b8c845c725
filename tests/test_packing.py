"""Small outputs packed into few blobs: every member comes back byte-exact by ranged reads in
few requests; large and missing outputs stay out; corruption on either side is caught."""

from __future__ import annotations

import os
import time
import tracemalloc

import pytest
from azure.storage.blob import ContentSettings

from pipeline.failures import FailureClass, StageFailure
from pipeline.storage import names, packing
from pipeline.storage.clients import Clients
from pipeline.storage.transfer import md5_of


def _put(clients: Clients, name: str, data: bytes) -> packing.Output:
    clients.transfers.upload(clients.products, name, data, "application/octet-stream")
    return packing.Output(name, clients.products.container_name, name)


def test_small_outputs_pack_and_come_back_byte_exact_in_few_ranges(clients: Clients) -> None:
    sizes = [0, 1, 7, 32 * 1024, 100_000] + [5_000 + i for i in range(200)]
    stored = {f"jobp/out/{i:04d}.bin": os.urandom(size) for i, size in enumerate(sizes)}
    outputs = [_put(clients, name, data) for name, data in stored.items()]
    big = _put(clients, "jobp/out/big.bin", os.urandom(packing.MEMBER_MAX + 1))
    missing = packing.Output("jobp/out/gone.bin", clients.products.container_name, "jobp/out/gone.bin")

    members = packing.pack(clients, "jobp", [*outputs, big, missing])

    assert set(members) == set(stored)  # the large and the missing one are not packed
    assert {m.pack for m in members.values()} == {names.pack_blob("jobp", 0)}
    assert packing.spans(members) and len(packing.spans(members)) <= 2  # ~1.1 MiB: one or two ranges
    assert packing.read_members(clients, members) == stored
    some = {name: members[name] for name in list(stored)[3:9]}
    assert packing.read_members(clients, some) == {name: stored[name] for name in some}
    # deterministic: packing again writes the same pack
    assert packing.pack(clients, "jobp", reversed([*outputs, big])) == members


def test_packs_close_at_their_size_limit(clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packing, "PACK_MAX", 50_000)
    stored = {f"jobq/{i}.bin": os.urandom(20_000) for i in range(7)}
    members = packing.pack(clients, "jobq", [_put(clients, n, d) for n, d in stored.items()])
    assert len({m.pack for m in members.values()}) == 4  # 2 + 2 + 2 + 1 members of 20 kB
    assert all(m.offset + m.length <= 50_000 for m in members.values())
    assert packing.read_members(clients, members) == stored


def test_ranges_coalesce_neighbours_and_split_far_or_long_ones() -> None:
    def member(offset: int, length: int, pack: str = "p") -> packing.Member:
        return packing.Member(pack, offset, length, "")

    near = {"a": member(0, 10), "b": member(10, 10), "c": member(20 + packing.RANGE_GAP, 5)}
    assert [(s.start, s.end) for s in packing.spans(near)] == [(0, 25 + packing.RANGE_GAP)]
    far = {"a": member(0, 10), "b": member(11 + packing.RANGE_GAP, 5)}
    assert len(packing.spans(far)) == 2
    long = {f"m{i}": member(i * packing.MiB, packing.MiB) for i in range(20)}
    assert [s.end - s.start for s in packing.spans(long)] == [packing.RANGE_MAX, packing.RANGE_MAX, 4 * packing.MiB]
    two_packs = {"a": member(0, 1, "p"), "b": member(1, 1, "q")}
    assert {s.pack for s in packing.spans(two_packs)} == {"p", "q"}


def test_a_corrupt_member_is_refused_when_packing_and_when_unpacking(clients: Clients) -> None:
    data = os.urandom(4000)
    good = _put(clients, "jobr/good.bin", data)
    # a stored blob whose bytes no longer match its stored MD5
    bad = bytearray(data)
    bad[10] ^= 1
    blob = clients.products.get_blob_client("jobr/bad.bin")
    blob.upload_blob(bytes(bad), overwrite=True)
    blob.set_http_headers(ContentSettings(content_md5=bytearray(md5_of(data))))
    corrupt = packing.Output("jobr/bad.bin", clients.products.container_name, "jobr/bad.bin")
    with pytest.raises(StageFailure) as caught:
        packing.pack(clients, "jobr", [good, corrupt])
    assert caught.value.failure is FailureClass.CORRUPT_BLOB

    members = packing.pack(clients, "jobr", [good])
    (span,) = packing.spans(members)
    flipped = bytearray(data)
    flipped[0] ^= 1
    with pytest.raises(StageFailure) as caught:
        packing.unpack(span, bytes(flipped))
    assert caught.value.failure is FailureClass.CORRUPT_BLOB
    with pytest.raises(StageFailure):
        packing.unpack(span, data[:-1])  # a short range read


def test_packing_holds_one_round_of_members_not_the_pack(clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    """Members are staged into their pack a round at a time: the memory packing takes is
    a round's, far below the pack's 24 MiB."""
    monkeypatch.setattr(packing, "READ_BATCH", 4)
    stored = {f"jobm/{i:02d}.bin": os.urandom(packing.MEMBER_MAX - i) for i in range(24)}
    outputs = [_put(clients, name, data) for name, data in stored.items()]
    tracemalloc.start()
    try:
        members = packing.pack(clients, "jobm", outputs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert {m.pack for m in members.values()} == {names.pack_blob("jobm", 0)}
    assert peak < 6 * packing.READ_BATCH * packing.MEMBER_MAX // 2, peak / packing.MiB  # 12 MiB of 24
    assert packing.read_members(clients, members) == stored
    data, _ = clients.transfers.download(clients.products, names.pack_blob("jobm", 0))  # its MD5 checked
    assert len(data) == sum(len(d) for d in stored.values())


def test_packs_of_cached_tiles_are_made_once_and_a_repeat_names_them(clients: Clients) -> None:
    stored = {f"ab/{i:02d}{'0' * 62}/MOD10A2.Snow.2022-02-02.t{i}.tif": os.urandom(3_000 + i) for i in range(40)}
    for name, data in stored.items():
        clients.transfers.upload(clients.tiles, name, data, "image/tiff")
    tiles = [packing.Output(names.TILE_OUTPUT_PREFIX + n, clients.tiles.container_name, n) for n in stored]
    wanted = {names.TILE_OUTPUT_PREFIX + n: d for n, d in stored.items()}

    first = packing.pack(clients, "jobt1", tiles)
    packs = {m.pack for m in first.values()}
    assert packs and all(p.startswith(names.PACK_CACHE_PREFIX) for p in packs)
    assert not list(clients.products.list_blobs(name_starts_with="jobt1/"))  # nothing of the job's own
    assert packing.read_members(clients, first) == wanted
    written = {p: clients.products.get_blob_client(p).get_blob_properties().last_modified for p in packs}

    for name in stored:  # a repeat reads none of its members: their packs are named again
        clients.tiles.delete_blob(name)
    time.sleep(1.1)  # Last-Modified counts whole seconds
    assert packing.pack(clients, "jobt2", reversed(tiles)) == first
    assert packing.read_members(clients, first) == wanted
    for pack, then in written.items():  # and touched: retention keeps them for the repeat's time
        assert clients.products.get_blob_client(pack).get_blob_properties().last_modified > then

    # a pack retention has deleted is made again, from the members (here: put back)
    for name, data in stored.items():
        clients.transfers.upload(clients.tiles, name, data, "image/tiff")
    clients.products.delete_blob(next(iter(packs)))
    assert packing.pack(clients, "jobt3", tiles) == first
    assert packing.read_members(clients, first) == wanted

    # one output of the job's own (a reduction's): the job's own packs
    own = _put(clients, "jobt4/tasks/r/a001/mean.tif", b"reduced")
    mixed = packing.pack(clients, "jobt4", [*tiles, own])
    assert {m.pack for m in mixed.values()} == {names.pack_blob("jobt4", 0)}
    assert packing.read_members(clients, mixed) == wanted | {own.name: b"reduced"}
