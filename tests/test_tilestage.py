"""The tile stage against Azurite and the local Planetary Computer and NASA: collection
fetches each granule's file once and verifies it before caching it under the granule's id;
the reprojected tile is content-addressed, reused (CACHED) and made once however many tasks
ask for it together; a task the catalog has no granule for ends NO_DATA; the HDF4 path of
NASA makes the same pixels as the COG path of Planetary Computer."""

from __future__ import annotations

import threading
from datetime import date

import numpy as np
import pytest
import rasterio
from rasterio.io import MemoryFile

from bagpipe import modis_world as world
from bagpipe.earthdata import Earthdata
from bagpipe.planetary import Planetary
from pipeline import stages
from pipeline.failures import FailureClass, StageFailure
from pipeline.modis import tilestage
from pipeline.modis.granules import from_param
from pipeline.modis.products import CATALOG
from pipeline.modis.reprojection import Source, warp
from pipeline.modis.targets import GridSpec
from pipeline.requests import search
from pipeline.requests.expansion import TaskSpec
from pipeline.settings import Settings
from pipeline.stages import StageContext
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import on_cmr, on_stac

SNOW = world.REAL_DATA / "MOD10A2.A2022033.h09v05.061.2022042050729_Maximum_Snow_Extent.tif"


def params_for(settings: Settings, west: float, south: float, day: date, product: str = "MOD10A2",
               layers: tuple[str, ...] = ()) -> dict[str, str]:
    """The tile task of the 1° target tile whose south-west corner is (west, south), its
    granules found as the planner finds them."""
    (target,) = GridSpec().tiles_for_lonlat_box(west + 0.1, south + 0.1, west + 0.2, south + 0.2)
    (spec,) = search.resolve(settings, [TaskSpec("modis", product, target, day, layers=layers)], "modis")
    return spec.params()


def run(settings: Settings, params: dict[str, str], job: str = "j1", attempt: int = 1) -> StageContext:
    ctx = StageContext(job=job, part=job, task="000000000", attempt=attempt, params=params, clients=Clients(settings),
                       output_prefix=names.output_prefix(job, "000000000", attempt))
    stages.STAGES["modis"](ctx)
    return ctx


def tile_of(clients: Clients, output: str) -> bytes:
    return clients.tiles.download_blob(output.removeprefix(names.TILE_OUTPUT_PREFIX)).readall()


def test_collect_reproject_then_reuse(clients: Clients, settings: Settings, planetary: Planetary) -> None:
    mine = on_stac(settings, planetary)
    params = params_for(mine, -108.0, 35.0, date(2022, 2, 2))  # inside h09v05: the real granule
    assert params["sources"] == "h09v05"
    (granule,) = from_param(params["granules"])
    assert granule.id == "MOD10A2.A2022033.h09v05.061.2022042050729"
    first = run(mine, params)
    assert not first.cached and not first.no_data
    (output,) = first.outputs
    with MemoryFile(tile_of(clients, output)) as memory, memory.open() as made:
        expected = warp([Source(granule.id, {"Maximum_Snow_Extent": SNOW})], CATALOG["MOD10A2"],
                        "Maximum_Snow_Extent", tilestage.target_of(params))
        with MemoryFile(expected) as e, e.open() as direct:
            assert np.array_equal(made.read(1), direct.read(1))
        assert made.tags()["TARGET_TILE"] == params["tile"] and made.crs == rasterio.crs.CRS.from_epsg(4326)
        assert made.tags()["SOURCES"] == granule.id
    (row,) = clients.sources_table.query_entities("PartitionKey eq 'MOD10A2'")
    assert row["RowKey"] == f"{granule.id}~Maximum_Snow_Extent" and row["Bytes"] == SNOW.stat().st_size
    assert row["Blob"] == f"MOD10A2/{granule.id}/{granule.id}_Maximum_Snow_Extent.tif"
    assert "sig=" not in row["Url"]  # the unsigned href: no credential in a row
    issued = planetary.tokens_issued

    again = run(mine, params, job="j2")  # another request, same tile: nothing recomputed or fetched
    assert again.cached and again.outputs == first.outputs
    assert planetary.tokens_issued == issued and len(list(clients.sources.list_blobs())) == 1


def test_concurrent_tasks_fetch_each_source_once_and_make_the_tile_once(
    clients: Clients, settings: Settings, planetary: Planetary
) -> None:
    mine = on_stac(settings, planetary)
    params = params_for(mine, -110.0, 34.0, date(2022, 3, 6))  # straddles h08v05 | h09v05, synthesized
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
    assert len(list(clients.sources.list_blobs())) == 2  # each granule's layer fetched and cached once
    with MemoryFile(tile_of(clients, results[0].outputs[0])) as memory, memory.open() as tile:
        assert not (tile.read(1) == 255).any()  # both sources: no gap at the border
    leftovers = [b.name for c in (clients.sources, clients.tiles)
                 for b in c.list_blobs(name_starts_with=names.MARKER_PREFIX)]
    assert leftovers == []


def test_several_layers_each_an_output(clients: Clients, settings: Settings, planetary: Planetary) -> None:
    mine = on_stac(settings, planetary)
    params = params_for(mine, -108.0, 35.0, date(2022, 2, 2), layers=("Maximum_Snow_Extent", "Eight_Day_Snow_Cover"))
    made = run(mine, params)
    assert len(made.outputs) == 2
    for output, layer in zip(made.outputs, ("Maximum_Snow_Extent", "Eight_Day_Snow_Cover"), strict=True):
        assert f".{layer}." in output
        with MemoryFile(tile_of(clients, output)) as memory, memory.open() as tile:
            assert tile.tags()["LAYER"] == layer


def test_a_tile_task_over_the_ocean_ends_no_data(clients: Clients, settings: Settings, planetary: Planetary) -> None:
    mine = on_stac(settings, planetary)
    params = params_for(mine, -135.0, 35.0, date(2022, 2, 2))  # the Pacific, west of California
    assert params["sources"] and params["granules"] == "{}"
    ctx = run(mine, params)
    assert ctx.no_data and ctx.outputs == []
    assert list(clients.sources.list_blobs()) == [] and list(clients.tiles.list_blobs()) == []


def test_the_hdf4_path_of_nasa_makes_the_pixels_of_the_cog_path(
    clients: Clients, settings: Settings, planetary: Planetary, nasa: Earthdata
) -> None:
    from_stac = run(on_stac(settings, planetary), params_for(on_stac(settings, planetary), -108.0, 35.0,
                                                             date(2022, 2, 2)))
    cmr = on_cmr(settings, nasa)
    params = params_for(cmr, -108.0, 35.0, date(2022, 2, 2))
    (granule,) = from_param(params["granules"])
    assert dict(granule.files)["hdf"].endswith("/DP4/MOST/MOD10A2.061/2022.02.02/"
                                               "MOD10A2.A2022033.h09v05.061.2022042050729.hdf")
    from_cmr = run(cmr, params, job="j2")
    with MemoryFile(tile_of(clients, from_stac.outputs[0])) as a, a.open() as one, \
            MemoryFile(tile_of(clients, from_cmr.outputs[0])) as b, b.open() as other:
        assert np.array_equal(one.read(1), other.read(1))
    assert any(b.name.endswith(".hdf") for b in clients.sources.list_blobs())


def test_a_broken_source_is_a_classified_failure_and_never_cached(
    clients: Clients, settings: Settings, azurite: object
) -> None:
    with Planetary(azurite.connection_string, prefix=settings.namespace) as broken:  # type: ignore[attr-defined]
        mine = on_stac(settings, broken)
        params = params_for(mine, -108.0, 35.0, date(2022, 2, 2))
        (granule,) = from_param(params["granules"])
        href = dict(granule.files)["Maximum_Snow_Extent"]
        container, blob = href.split("/devstoreaccount1/", 1)[1].split("/", 1)
        clients.blob_service.get_blob_client(container, blob).upload_blob(b"<html>503 try later</html>",
                                                                          overwrite=True)
        with pytest.raises(StageFailure) as caught:
            run(mine, params)
        assert caught.value.failure is FailureClass.BAD_SOURCE
        assert list(clients.sources.list_blobs()) == [] and list(clients.tiles.list_blobs()) == []
