"""The tile stage against Azurite and the feed server: collection fetches each source once
and verifies it before caching; the reprojected tile is content-addressed, reused (CACHED)
and made once however many tasks ask for it together."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import numpy as np
import pytest
import rasterio
from rasterio.io import MemoryFile

from bagpipe.feedserver import REAL_DATA, FeedServer
from pipeline import names, stages, tilestage
from pipeline.clients import Clients
from pipeline.failures import FailureClass, StageFailure
from pipeline.feeds import granule_name
from pipeline.reprojection import warp
from pipeline.request import TaskSpec
from pipeline.settings import Settings
from pipeline.stages import StageContext
from pipeline.targets import GridSpec

SNOW = REAL_DATA / "MOD10A2.A2022033.h09v05.061.2022042050729_Maximum_Snow_Extent.tif"


@pytest.fixture
def feed() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


def params_for(west: float, south: float, day: date) -> dict[str, str]:
    """The tile task of the 1° target tile whose south-west corner is (west, south)."""
    (target,) = GridSpec().tiles_for_lonlat_box(west + 0.1, south + 0.1, west + 0.2, south + 0.2)
    return TaskSpec("modis", "MOD10A2", target, day).params()


def run(settings: Settings, params: dict[str, str], job: str = "j1") -> StageContext:
    ctx = StageContext(job=job, task="000000000", attempt=1, params=params, clients=Clients(settings),
                       output_prefix=names.output_prefix(job, "000000000", 1))
    stages.STAGES["modis"](ctx)
    return ctx


def tile_of(clients: Clients, ctx: StageContext) -> bytes:
    (output,) = ctx.outputs
    return clients.tiles.download_blob(output.removeprefix(names.TILE_OUTPUT_PREFIX)).readall()


def test_collect_reproject_then_reuse(clients: Clients, settings: Settings, feed: FeedServer) -> None:
    mine = settings.with_(feed_url=feed.template)
    params = params_for(-108.0, 35.0, date(2022, 2, 2))  # inside h09v05: the real granule
    assert params["sources"] == "h09v05"
    first = run(mine, params)
    assert not first.cached
    with MemoryFile(tile_of(clients, first)) as memory, memory.open() as made:
        expected = warp([SNOW], tilestage.target_of(params))
        with MemoryFile(expected) as e, e.open() as direct:
            assert np.array_equal(made.read(1), direct.read(1))
        assert made.tags()["TARGET_TILE"] == params["tile"] and made.crs == rasterio.crs.CRS.from_epsg(4326)
    (row,) = clients.sources_table.query_entities("PartitionKey eq 'MOD10A2'")
    assert row["RowKey"] == "h09v05~2022-02-02" and row["Bytes"] == SNOW.stat().st_size
    fetched = dict(feed.served)
    assert sum(fetched.values()) == 1

    again = run(mine, params, job="j2")  # another request, same tile: nothing recomputed or fetched
    assert again.cached and again.outputs == first.outputs
    assert dict(feed.served) == fetched


def test_concurrent_tasks_fetch_each_source_once_and_make_the_tile_once(
    clients: Clients, settings: Settings, feed: FeedServer
) -> None:
    mine = settings.with_(feed_url=feed.template)
    params = params_for(-110.0, 34.0, date(2022, 3, 6))  # straddles h08v05 | h09v05, synthesized
    assert params["sources"] == "h08v05,h09v05"
    results: list[StageContext] = []
    threads = [threading.Thread(target=lambda i=i: results.append(run(mine, params, job=f"j{i}"))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4
    assert sorted(r.cached for r in results) == [False, True, True, True]
    assert len({tuple(r.outputs) for r in results}) == 1
    assert sorted(feed.served.values()) == [1, 1]
    with MemoryFile(tile_of(clients, results[0])) as memory, memory.open() as tile:
        assert not (tile.read(1) == 255).any()  # both sources mosaicked: no gap at the border
    leftovers = [b.name for c in (clients.sources, clients.tiles) for b in c.list_blobs() if b.name.endswith(".making")]
    assert leftovers == []


def test_a_broken_source_is_a_classified_failure_and_never_cached(
    clients: Clients, settings: Settings, tmp_path: Path
) -> None:
    day = date(2022, 2, 2)
    folder = tmp_path / "feed"
    folder.mkdir()
    (folder / granule_name("MOD10A2", "h09v05", day)).write_bytes(b"<html>503 try later</html>")
    mine = settings.with_(feeds=json.dumps({"MOD10A2": folder.as_uri() + "/{name}"}))
    with pytest.raises(StageFailure) as caught:
        run(mine, params_for(-108.0, 35.0, day))
    assert caught.value.failure is FailureClass.BAD_SOURCE
    assert list(clients.sources.list_blobs()) == [] and list(clients.tiles.list_blobs()) == []
    with pytest.raises(StageFailure) as caught:  # no feed configured at all
        run(settings, params_for(-108.0, 35.0, day))
    assert caught.value.failure is FailureClass.SOURCE_DOWNLOAD
