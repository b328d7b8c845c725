"""A finished job's results folder is a STAC catalog: it validates (offline), names the
granules its products were made of, is the same after an all-CACHED rerun, and loads with
``odc.stac`` into arrays equal to the files. The API serves the same items as a STAC API,
opened with ``pystac_client`` and loaded over signed links, to their owner only."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import numpy as np
import odc.stac
import pystac
import pystac_client
import pytest
import rasterio
from PIL import Image
from pystac.validation import JsonSchemaSTACValidator, set_validator
from pystac.validation.local_validator import get_local_schema_cache
from pystac_client.conformance import ConformanceClasses

from bagpipe import modis_world as world
from bagpipe.azurite import Azurite
from bagpipe.client import Api, download_results
from bagpipe.stack import LocalStack
from pipeline.modis.products import CATALOG
from pipeline.modis.quicklook import LEGEND_ROW, SNOW_CLASSES
from pipeline.modis.stac import StacCatalog
from pipeline.reduction import reducers
from pipeline.reduction.bundles import digest_of
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import clients_for
from tests.conftest import make_user, wait_for

SCHEMAS = Path(__file__).parent / "fixtures" / "stac-schemas"
BOX = [-110.5, 34.2, -108.6, 34.8]
REQUEST = {"region": {"bbox": BOX}, "grid": {"tile_size": 1.0, "resolution": 0.01},
           "start": "2022-02-02", "end": "2022-02-12", "products": ["MOD10A2"],
           "reducer": {"name": "snow_fraction"}, "label": "stac", "email": "scientist@example.org"}


@dataclass
class Finished:
    first: Path  # the first job's results folder
    again: Path  # the rerun's (every tile CACHED)
    granules: list[str]  # what the catalog lists for the region and span
    email: str  # the first job's notification, as text
    job: str  # the first job's id
    api_url: str  # the stack's API, up while the module's tests run
    token: str  # its owner's token
    stranger: str  # another scientist's token
    settings: Settings  # the stack's


@pytest.fixture(scope="module")
def finished(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Finished]:
    tmp = tmp_path_factory.mktemp("stac")
    with LocalStack(tmp / "stack", workers=1, slots=2, connection=azurite.connection_string,
                    namespace=f"stac{tmp.name[-6:].replace('_', '')}") as stack:
        api = Api(stack.api_url, stack.token)

        def run(label: str) -> tuple[str, dict[str, Any]]:
            job = api.submit(REQUEST | {"label": label})["job"]
            status = wait_for(lambda: (s := api.status(job))["state"] in ("SUCCEEDED", "FAILED") and s, 180, "the job")
            return job, status  # type: ignore[return-value]

        first, status = run("stac")
        assert status["state"] == "SUCCEEDED", status
        again, rerun = run("stac again")
        assert rerun["counts"].get("CACHED") == 2, rerun  # a tile task per period, of the 3 target tiles
        download_results(api, first, tmp / "first")
        here = os.getcwd()
        os.chdir(tmp)  # the rerun's folder named as a scientist names it, from where they are (`--out again`)
        try:
            download_results(api, again, Path("again"))
        finally:
            os.chdir(here)
        email = wait_for(lambda: [m for _, m in stack.mail.messages() if first in str(m["Subject"])], 30, "the email")
        found = StacCatalog(stack.planetary.stac_url).search(CATALOG["MOD10A2"], tuple(BOX),  # type: ignore[arg-type]
                                                             date(2022, 2, 2), date(2022, 2, 17))
        yield Finished(tmp / "first", tmp / "again", sorted(g.id for g in found),
                       email[0].get_body().get_content(), first, stack.api_url, stack.token,  # type: ignore[index]
                       make_user(clients_for(stack.settings), "stranger"), stack.settings)


@pytest.fixture
def offline_validator() -> Iterator[None]:
    """pystac's validator with the extension schemas from tests/fixtures (it bundles only the
    core ones, and this machine has no internet to fetch the others from)."""
    validator = JsonSchemaSTACValidator()
    vendored = {f"https://stac-extensions.github.io/{p.relative_to(SCHEMAS).as_posix()}": json.loads(p.read_text())
                for p in SCHEMAS.glob("*/*/schema.json")}
    assert {"eo", "raster"} <= {url.split("/")[3] for url in vendored}, vendored.keys()
    validator.schema_cache = get_local_schema_cache() | vendored
    set_validator(validator)
    yield
    set_validator(JsonSchemaSTACValidator())


def items_of(folder: Path) -> dict[str, pystac.Item]:
    collection = pystac.Collection.from_file(str(folder / "collection.json"))
    return {item.id: item for item in collection.get_items()}


def test_the_results_folder_is_a_valid_stac_collection_linked_from_the_manifest(
        finished: Finished, offline_validator: None) -> None:
    manifest = json.loads((finished.first / "manifest.json").read_text())
    assert manifest["stac"] == "collection.json" and manifest["catalog"]["kind"] == "stac"
    collection = pystac.Collection.from_file(str(finished.first / manifest["stac"]))
    assert collection.id == manifest["job"]
    collection.validate()
    items = list(collection.get_items())
    # 3 tiles × 2 periods, a reduction per tile; the region's mosaic of each period and of the reductions
    assert len(items) == 6 + 3 + 3
    for item in items:
        assert item.validate()  # core, projection and raster schemas
    for task in manifest["tasks"]:  # each product's item lies beside its files
        assert (finished.first / task["item"]).parent == (finished.first / task["files"][0]).parent
    west, south, east, north = collection.extent.spatial.bboxes[0]
    assert west <= BOX[0] + 0.5 and east >= BOX[2] - 0.5 and south <= BOX[1] and north >= BOX[3]
    # every link and href is relative: the folder opens wherever it is moved
    for path in finished.first.rglob("*.json"):
        text = path.read_text()
        assert str(finished.first) not in text, path


def test_items_describe_the_rasters_and_name_their_granules(finished: Finished) -> None:
    items = items_of(finished.first)
    tile = next(i for i in items.values() if i.properties["bagpipe:stage"] == "modis")
    asset = tile.assets["Maximum_Snow_Extent"]
    with rasterio.open(asset.get_absolute_href()) as src:
        assert tile.properties["proj:code"] == "EPSG:4326" and tile.properties["proj:shape"] == [src.height, src.width]
        assert tile.properties["proj:transform"][:6] == list(src.transform)[:6]
        (band,) = asset.extra_fields["raster:bands"]
        assert band["data_type"] == "uint8" and band["nodata"] == src.nodata == 255
        assert src.tags()["SOURCES"].split(",") == tile.properties["bagpipe:sources"]
    first_day = date.fromisoformat(tile.properties["datetime"][:10])
    assert tile.properties["start_datetime"] == f"{first_day}T00:00:00Z"  # an 8-day composite's period
    assert tile.properties["end_datetime"] == f"{date.fromordinal(first_day.toordinal() + 7)}T23:59:59Z"
    assert tile.properties["bagpipe:stage_version"].startswith("reproject-")
    assert tile.properties["bagpipe:catalog"]["collection"] == "modis-10A2-061"
    assert tile.properties["bagpipe:version"] and tile.bbox[0] >= -111 and tile.bbox[2] <= -108
    # provenance: the ids the catalog lists, production time included; the real granule among them
    named = {g for i in items.values() for g in i.properties["bagpipe:sources"]}
    assert named == set(finished.granules)
    real = {p.name.split("_")[0] for p in world.REAL_DATA.glob("MOD10A2.A2022033.h09v05.*.tif")}
    assert real and real <= named
    # a tile made of a synthesized granule says so (here every tile needs h08v05, synthesized)
    tiles = [i for i in items.values() if i.properties["bagpipe:stage"] == "modis"]
    for one in tiles:
        assert one.properties.get("bagpipe:synthetic", False) is (not set(one.properties["bagpipe:sources"]) <= real)
    assert any(i.properties.get("bagpipe:synthetic") for i in tiles)
    reductions = [i for i in items.values() if i.properties["bagpipe:stage"] == "reduce"]
    assert len(reductions) == 3
    for reduction in reductions:
        assert reduction.properties["bagpipe:reducer"]["name"] == "snow_fraction"
        assert reduction.properties["bagpipe:reducer"]["installed"] is True  # shipped in reducers/, named by digest
        assert reduction.properties["bagpipe:reducer"]["digest"] == digest_of(reducers.BUILTIN_DIR / "snow_fraction")
        made_of = [link.resolve_stac_object().target for link in reduction.links if link.rel == "derived_from"]
        assert len(made_of) == 2 and all(i.properties["bagpipe:tile"] == reduction.properties["bagpipe:tile"]
                                         for i in made_of)
        assert reduction.properties["bagpipe:sources"] == sorted(
            {g for i in made_of for g in i.properties["bagpipe:sources"]})
        roles = sorted(role for a in reduction.assets.values() for role in a.roles or [])
        assert roles == ["data", "overview"]  # snow_fraction's GeoTIFF and its PNG
        (data,) = [a for a in reduction.assets.values() if a.roles == ["data"]]
        assert data.extra_fields["raster:bands"][0]["data_type"] == "float32"


def test_an_all_cached_rerun_writes_the_same_items(finished: Finished) -> None:
    def comparable(item: pystac.Item) -> dict[str, Any]:
        found = item.to_dict(include_self_link=False, transform_hrefs=False)
        found.pop("collection")
        found["links"] = [link for link in found["links"] if link["rel"] not in ("collection", "parent", "root")]
        return found

    first, again = items_of(finished.first), items_of(finished.again)
    assert set(first) == set(again) and len(first) == 12
    for key, item in first.items():
        assert comparable(item) == comparable(again[key]), key


def test_every_asset_of_an_item_is_a_file_beside_it_whatever_the_folder_was_named(finished: Finished) -> None:
    for folder in (finished.first, finished.again):  # named absolute, and relative to where it was fetched
        items = items_of(folder)
        assert len(items) == 12
        for item in items.values():
            for asset in item.assets.values():
                assert Path(asset.get_absolute_href() or "").is_file(), (folder.name, item.id, asset.href)


def test_the_folder_loads_with_odc_stac_equal_to_the_files(finished: Finished) -> None:
    tiles = [i for i in items_of(finished.first).values() if i.properties["bagpipe:stage"] == "modis"]
    data = odc.stac.load(tiles, bands=["Maximum_Snow_Extent"], groupby="time")
    loaded = data["Maximum_Snow_Extent"]
    assert loaded.sizes["time"] == 2
    checked = 0
    for item in tiles:
        with rasterio.open(item.assets["Maximum_Snow_Extent"].get_absolute_href()) as src:
            pixels = src.read(1)
            west, south, east, north = src.bounds
        when = np.datetime64(item.properties["datetime"][:19])
        part = loaded.sel(time=when).sel(longitude=slice(west, east), latitude=slice(north, south))
        assert part.shape == pixels.shape
        np.testing.assert_array_equal(part.values, pixels)
        checked += 1
    assert checked == 6
    # the region's mosaics load as the same pixels, over the requested box snapped to the grid
    regions = [i for i in items_of(finished.first).values()
               if i.properties["bagpipe:stage"] == "mosaic" and "Maximum_Snow_Extent" in i.assets]
    assert len(regions) == 2 and all(len([link for link in i.links if link.rel == "derived_from"]) == 3
                                     for i in regions)
    mosaics = odc.stac.load(regions, bands=["Maximum_Snow_Extent"], groupby="time")["Maximum_Snow_Extent"]
    assert mosaics.longitude.min() > BOX[0] - 0.01 and mosaics.longitude.max() < BOX[2] + 0.01
    same_place = loaded.sel(longitude=mosaics.longitude, latitude=mosaics.latitude, method="nearest", tolerance=1e-6)
    np.testing.assert_array_equal(mosaics.values, same_place.values)


def test_the_overview_shows_the_region_in_the_class_colours_and_the_email_links_it(finished: Finished) -> None:
    manifest = json.loads((finished.first / "manifest.json").read_text())
    shown = {(o["layer"], o["date"], o["last"]): o for o in manifest["overviews"]}
    assert set(shown) == {("snow_fraction", "2022-02-02", "2022-02-12"), ("Maximum_Snow_Extent", "2022-02-02", None),
                          ("Maximum_Snow_Extent", "2022-02-10", None)}
    first = manifest["overviews"][0]  # a reduction's: the span at a glance (the request's, as its group)
    assert first["layer"] == "snow_fraction"
    link = next(line for line in finished.email.splitlines() if "/overview/" in line)
    assert "Overview of the region (MOD10A2 snow_fraction" in finished.email
    picture = httpx.get(link, timeout=30)
    assert picture.status_code == 200 and picture.content == (finished.first / first["file"]).read_bytes()
    # the snow overview of 2 February, each of its pixels in the colour of the class at that place
    snow = shown[("Maximum_Snow_Extent", "2022-02-02", None)]
    picture = np.asarray(Image.open(finished.first / snow["file"]).convert("RGBA"))
    image = picture[LEGEND_ROW:]  # below the line of its corners' coordinates
    west, south, east, north = snow["bounds"]
    colours = {value: (*colour, 255) for value, _, colour in SNOW_CLASSES}
    tiles = [finished.first / t["files"][0] for t in manifest["tasks"] if t["stage"] == "modis"
             and t["date"] == "2022-02-02"]
    height = round(1024 * (north - south) / (east - west)) if east - west > north - south else 1024
    seen = set()
    for row in range(5, height, 37):
        for col in range(5, image.shape[1] if east - west > north - south else 1024, 41):
            lon = west + (col + 0.5) * (east - west) / image.shape[1]
            lat = north - (row + 0.5) * (north - south) / height
            for path in tiles:
                with rasterio.open(path) as src:
                    if src.bounds.left <= lon < src.bounds.right and src.bounds.bottom < lat <= src.bounds.top:
                        value = int(next(src.sample([(lon, lat)]))[0])
                        if value in colours:
                            assert tuple(image[row, col]) == colours[value], (lon, lat, value)
                            seen.add(value)
    assert {25, 200} <= seen  # snow and bare ground both appear, each in its colour


def opened(finished: Finished, token: str) -> pystac_client.Client:
    return pystac_client.Client.open(f"{finished.api_url}/api/stac", headers={"Authorization": f"Bearer {token}"})


def test_the_api_serves_the_job_as_a_stac_collection_that_loads_over_signed_links(
        finished: Finished, offline_validator: None) -> None:
    client = opened(finished, finished.token)
    assert client.conforms_to(ConformanceClasses.ITEM_SEARCH) and client.conforms_to(ConformanceClasses.COLLECTIONS)
    collection = client.get_collection(finished.job)
    assert collection.id == finished.job
    assert {finished.job} < {c.id for c in client.get_collections()}  # the rerun's too
    served = {item.id: item for item in collection.get_items()}
    in_folder = {i.id: i for i in items_of(finished.first).values() if i.properties["bagpipe:stage"] != "mosaic"}
    assert sorted(served) == sorted(in_folder) and len(served) == 6 + 3  # the region mosaics are made by results
    for item_id, item in served.items():
        assert item.validate()
        assert item.properties == in_folder[item_id].properties  # the same provenance, period, stage
        assert item.geometry == in_folder[item_id].geometry and item.bbox == in_folder[item_id].bbox
        for asset in item.assets.values():
            query = parse_qs(urlsplit(asset.href).query)
            assert query["sp"] == ["r"] and query["sig"] and query["se"]  # a short-lived read-only link
    reductions = [i for i in served.values() if i.properties["bagpipe:stage"] == "reduce"]
    assert all(len([link for link in i.links if link.rel == "derived_from"]) == 2 for i in reductions)
    tiles = [i for i in served.values() if i.properties["bagpipe:stage"] == "modis"]
    loaded = odc.stac.load(tiles, bands=["Maximum_Snow_Extent"], groupby="time")["Maximum_Snow_Extent"]
    local = odc.stac.load([in_folder[i.id] for i in tiles], bands=["Maximum_Snow_Extent"], groupby="time")
    np.testing.assert_array_equal(loaded.values, local["Maximum_Snow_Extent"].values)
    # what is kept names blobs, never a signature
    kept = clients_for(finished.settings).products.download_blob(names.stac_blob(finished.job)).readall()
    assert b"sig=" not in kept and b"tiles:" in kept


def test_the_stac_search_finds_by_box_time_and_id_a_page_at_a_time(finished: Finished) -> None:
    client = opened(finished, finished.token)
    everything = list(client.search(collections=[finished.job], max_items=None).items())
    assert len(everything) == 9
    paged = client.search(collections=[finished.job], limit=4)
    assert [len(page.items) for page in paged.pages()] == [4, 4, 1]
    first = min(everything, key=lambda i: i.bbox[0])  # type: ignore[index]
    west, south = first.bbox[:2]  # type: ignore[index]
    corner = [west + 0.1, south + 0.1, west + 0.2, south + 0.2]  # inside the westernmost tile only
    inside = list(client.search(collections=[finished.job], bbox=corner).items())
    assert {i.properties["bagpipe:tile"] for i in inside} == {first.properties["bagpipe:tile"]}
    assert len(inside) == 3  # its two periods and its reduction
    early = [i.id for i in client.search(collections=[finished.job], datetime="2022-02-02/2022-02-05").items()]
    assert sorted(early) == sorted(i.id for i in everything if i.properties["start_datetime"] <= "2022-02-05")
    assert 0 < len(early) < 9
    assert [i.id for i in client.search(ids=[first.id], collections=[finished.job]).items()] == [first.id]
    # a geometry: the corner as a polygon finds what the corner's box does; one elsewhere, nothing
    polygon = {"type": "Polygon", "coordinates": [[[corner[0], corner[1]], [corner[2], corner[1]],
                                                   [corner[2], corner[3]], [corner[0], corner[1]]]]}
    assert sorted(i.id for i in client.search(collections=[finished.job], intersects=polygon).items()) == \
        sorted(i.id for i in inside)
    elsewhere = {"type": "Point", "coordinates": [10.0, 45.0]}
    assert list(client.search(collections=[finished.job], intersects=elsewhere).items()) == []
    headers = {"Authorization": f"Bearer {finished.token}"}
    # a box across ±180° (west > east): from 170° east, over the antimeridian, to 100° west takes them all
    across = [httpx.get(f"{finished.api_url}/api/stac/search", headers=headers,
                        params={"collections": finished.job, "bbox": box}).json()["features"]
              for box in ("170,30,-100,40", "170,30,-112,40")]
    assert [len(found) for found in across] == [9, 0]
    for body in ({"intersects": {"type": "Polygon", "coordinates": "x"}},
                 {"intersects": polygon, "bbox": corner}):
        refused = httpx.post(f"{finished.api_url}/api/stac/search", json=body, headers=headers)
        assert refused.status_code == 400 and "intersects" in refused.json()["detail"], refused.text
    wrong = httpx.get(f"{finished.api_url}/api/stac/search", params={"bbox": "1,2,x,4"}, headers=headers)
    assert wrong.status_code == 400 and "bbox" in wrong.json()["detail"]
    wrong = httpx.get(f"{finished.api_url}/api/stac/search", params={"datetime": "2022-02-09/2022-02-01"},
                      headers=headers)
    assert wrong.status_code == 400 and "datetime" in wrong.json()["detail"]


def test_another_scientist_sees_none_of_it(finished: Finished) -> None:
    headers = {"Authorization": f"Bearer {finished.stranger}"}
    for path in (f"collections/{finished.job}", f"collections/{finished.job}/items",
                 f"search?collections={finished.job}"):
        answer = httpx.get(f"{finished.api_url}/api/stac/{path}", headers=headers)
        assert answer.status_code == 404, path
    assert httpx.get(f"{finished.api_url}/api/stac/collections", headers=headers).json()["collections"] == []
    assert list(opened(finished, finished.stranger).search(max_items=None).items()) == []
    assert httpx.get(f"{finished.api_url}/api/stac/collections/{finished.job}").status_code == 401
