"""Blobs made once, against Azurite: a maker that is alive keeps its marker fresh however
long it works, so nobody makes the blob twice; a maker that died (its marker untouched)
is taken over after seconds. And many cached blobs looked at together (``cache.Looks``,
the planner's look before it settles a repeat): the whole blob's MD5 by a one-byte read,
only for a blob surely there and whole."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any

import pytest
from azure.core.exceptions import AzureError

from pipeline.storage import cache, names
from pipeline.storage import clients as clients_module
from pipeline.storage.clients import Clients


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    # Last-Modified has whole seconds: a marker can look up to 1 s older than it is
    monkeypatch.setattr(cache, "TOUCH_S", 0.5)
    monkeypatch.setattr(cache, "STALE_S", 3.0)
    monkeypatch.setattr(cache, "POLL_S", 0.1)


def test_a_slow_live_maker_is_not_taken_over(clients: Clients) -> None:
    made: list[str] = []

    def slow() -> bytes:
        made.append(threading.current_thread().name)
        time.sleep(3 * cache.STALE_S)  # far longer than a marker may stay untouched
        return b"tile bytes"

    results: list[cache.Cached] = []
    threads = [threading.Thread(target=lambda: results.append(cache.ensure(
        clients.transfers, clients.tiles, "slow.tif", slow, "image/tiff")), name=f"task{i}") for i in range(3)]
    for thread in threads:
        thread.start()
        time.sleep(0.2)
    for thread in threads:
        thread.join(30)
    assert len(made) == 1
    assert [r.data for r in results] == [b"tile bytes"] * 3 and sum(r.made for r in results) == 1
    assert [b.name for b in clients.tiles.list_blobs()] == ["slow.tif"]  # the marker is gone


def test_the_marker_of_a_dead_maker_is_taken_over(clients: Clients) -> None:
    clients.tiles.upload_blob(names.marker_blob("dead.tif"), b"")  # a maker killed mid-way
    started = time.monotonic()
    found = cache.ensure(clients.transfers, clients.tiles, "dead.tif", lambda: b"made again", "image/tiff")
    waited = time.monotonic() - started
    assert found.made and found.data == b"made again"
    assert cache.STALE_S - 1 <= waited < cache.STALE_S + 5
    assert [b.name for b in clients.tiles.list_blobs()] == ["dead.tif"]


def test_a_retry_removes_the_marker_a_maker_killed_after_its_upload_left(clients: Clients) -> None:
    clients.tiles.upload_blob("left.tif", b"made")  # the maker uploaded, then died
    clients.tiles.upload_blob(names.marker_blob("left.tif"), b"")
    first = cache.ensure(clients.transfers, clients.tiles, "left.tif", lambda: b"never", "image/tiff")
    assert first.data == b"made" and not first.made
    marker = clients.tiles.get_blob_client(names.marker_blob("left.tif"))
    assert marker.exists()  # a first attempt cannot know
    again = cache.ensure(clients.transfers, clients.tiles, "left.tif", lambda: b"never", "image/tiff", tidy=True)
    assert again.data == b"made" and not again.made
    assert [b.name for b in clients.tiles.list_blobs()] == ["left.tif"]


def test_a_retry_takes_over_its_own_dead_attempts_marker_at_once(clients: Clients) -> None:
    clients.tiles.upload_blob(names.marker_blob("mine.tif"), b"", metadata={"owner": "j1/000000007"})
    started = time.monotonic()
    found = cache.ensure(clients.transfers, clients.tiles, "mine.tif", lambda: b"made by the retry", "image/tiff",
                         owner="j1/000000007", tidy=True)
    assert found.made and found.data == b"made by the retry"
    assert time.monotonic() - started < cache.STALE_S / 2  # not held up for a stale marker's time (30 s)
    assert [b.name for b in clients.tiles.list_blobs()] == ["mine.tif"]
    # another task's fresh marker is not its to take: it waits for that maker
    clients.tiles.upload_blob(names.marker_blob("theirs.tif"), b"", metadata={"owner": "j1/000000008"})
    cache._take_over_if_stale(clients.tiles.get_blob_client(names.marker_blob("theirs.tif")), "j1/000000007")
    assert clients.tiles.get_blob_client(names.marker_blob("theirs.tif")).exists()


def test_the_sweep_removes_the_markers_of_makers_that_are_gone(clients: Clients) -> None:
    """A marker no task comes back for (its maker died, its task was cancelled) is the sweep's
    to remove: once untouched for STALE_S, or at once when its owner's task has ended."""
    clients.tiles.upload_blob(names.marker_blob("old.tif"), b"")  # a maker that died long ago
    time.sleep(cache.STALE_S + 1.5)
    clients.tiles.upload_blob(names.marker_blob("ended.tif"), b"", metadata={"owner": "j1/000000001"})
    clients.tiles.upload_blob(names.marker_blob("live.tif"), b"", metadata={"owner": "j1/000000002"})
    clients.tiles.upload_blob("kept.tif", b"a tile")
    ended = {"j1/000000001": True, "j1/000000002": False}
    assert cache.sweep_markers([clients.tiles, clients.sources], ended.__getitem__) == 2
    assert sorted(b.name for b in clients.tiles.list_blobs()) == [names.marker_blob("live.tif"), "kept.tif"]


def test_many_blobs_are_looked_at_by_a_one_byte_read_each_and_only_whole_ones_count(
        clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    whole = {name: f"{name} made".encode() * 100 for name in ("ab/plain.tif", "cd/a name, 50% #1 é.tif")}
    for name, data in whole.items():
        clients.tiles.upload_blob(name, data)
    unhashed = clients.tiles.get_blob_client("ef/staged.tif")  # a block list committed: no MD5 stored
    unhashed.stage_block("b1", b"staged")
    unhashed.commit_block_list(["b1"])
    clients.tiles.upload_blob("gh/making.tif", b"half")
    clients.tiles.upload_blob(names.marker_blob("gh/making.tif"), b"")  # a maker at work on it
    clients.sources.upload_blob("src.hdf", b"source")
    sent: list[tuple[str, str]] = []
    monkeypatch.setitem(clients_module.HOOKS, "raw_request_hook",
                        lambda r: sent.append((r.http_request.method, r.http_request.headers.get("x-ms-range", ""))))
    asked = [*whole, "ef/staged.tif", "gh/making.tif", "ij/missing.tif"]
    with cache.Looks(clients) as looks:
        found = looks.present(clients.tiles.container_name, asked + asked)
        sources = looks.present(clients.sources.container_name, ["src.hdf"])
    assert found == {name: hashlib.md5(data).digest() for name, data in whole.items()}  # the whole blob's
    assert sources == {"src.hdf": hashlib.md5(b"source").digest()}
    reads = [request for request in sent if request[0] != "GET" or request[1]]
    assert sorted(reads) == [("GET", "bytes=0-0")] * 5  # one read each (an access), no look at the marked one


def test_a_look_that_fails_leaves_the_blob_out_and_the_others_in(clients: Clients, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    for name in ("a.tif", "b.tif"):
        clients.tiles.upload_blob(name, name.encode())

    def refuse(request: Any) -> None:
        if request.http_request.url.split("?")[0].endswith("/b.tif"):
            request.http_request.headers["x-ms-range"] = "bytes=100-200"  # past its end: refused (416)
    monkeypatch.setitem(clients_module.HOOKS, "raw_request_hook", refuse)
    caplog.set_level(logging.INFO, logger=cache.__name__)
    with cache.Looks(clients) as looks:
        found = looks.present(clients.tiles.container_name, ["a.tif", "b.tif"])
    assert found == {"a.tif": hashlib.md5(b"a.tif").digest()}
    told = [r.getMessage() for r in caplog.records if "not looked at" in r.getMessage()]
    assert len(told) == 1 and "b.tif" in told[0] and "InvalidRange" in told[0]  # a failure, not a blob without MD5


def test_a_look_whose_listing_of_markers_fails_raises_for_the_planner_to_leave_its_tasks(
        clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which blobs have a maker at work is not known: nothing may count as there. The error
    goes up, an AzureError, which the planner takes as "leave these tasks to the ordinary way"."""
    clients.tiles.upload_blob("a.tif", b"a")

    def refuse(request: Any) -> None:
        if "comp=list" in request.http_request.url:
            request.http_request.url += "&maxresults=-1"  # a listing the service refuses (400)
    monkeypatch.setitem(clients_module.HOOKS, "raw_request_hook", refuse)
    with cache.Looks(clients) as looks, pytest.raises(AzureError):
        looks.present(clients.tiles.container_name, ["a.tif"])
