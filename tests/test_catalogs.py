"""The two catalogs on recorded answers (Planetary Computer's STAC API replayed with
``responses``, NASA CMR's with ``respx``, both built from the real STAC item and the real
granule's ECS metadata in data/modis) and on the local imitations: granules named with their
production timestamp, Terra told from Aqua, every page read, boxes across ±180°, one search
per product per job; a collection the catalog does not hold fails the job at planning."""

from __future__ import annotations

import copy
import json
import re
from datetime import date, timedelta

import httpx
import pytest
import responses
import respx

from bagpipe import modis_world as world
from bagpipe.azurite import Azurite
from bagpipe.earthdata import Earthdata
from bagpipe.planetary import Planetary
from pipeline.lifecycle import jobs, planner
from pipeline.lifecycle.status import JobState
from pipeline.modis import catalogs
from pipeline.modis.cmr import CmrCatalog
from pipeline.modis.granules import Granule, pick
from pipeline.modis.products import CATALOG, periods
from pipeline.modis.stac import StacCatalog
from pipeline.modis.targets import GridSpec
from pipeline.planning import RequestError
from pipeline.requests import application, search
from pipeline.requests.expansion import expand
from pipeline.settings import NASA_CMR, PLANETARY_COMPUTER_STAC, Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import on_cmr, on_stac, small_request

ITEM = json.loads((world.STAC_DATA / "MOD10A2.A2022033.h09v05.061.json").read_text())
COLLECTION = next(c for c in json.loads((world.STAC_DATA / "pc-modis-061-collections.json").read_text())["collections"]
                  if c["id"] == "modis-10A2-061")
NAME = "MOD10A2.A2022033.h09v05.061.2022042050729"
PC_BLOB = "https://modiseuwest.blob.core.windows.net"


def recorded_item(short: str, tile: str, made: str) -> dict:
    """The real item, with Planetary Computer's hrefs (a granule of ``short``/``tile``)."""
    item = copy.deepcopy(ITEM)
    name = NAME.replace("MOD10A2", short).replace("h09v05", tile).replace("2022042050729", made)
    item["id"] = name.rsplit(".", 1)[0]
    item["properties"]["platform"] = "aqua" if short.startswith("MYD") else "terra"
    folder = f"{short}/{tile[1:3]}/{tile[4:6]}/2022033"
    item["assets"]["hdf"]["href"] = f"{PC_BLOB}/modis-061/{folder}/{name}.hdf"
    for layer in ("Maximum_Snow_Extent", "Eight_Day_Snow_Cover"):
        item["assets"][layer]["href"] = f"{PC_BLOB}/modis-061-cogs/{folder}/{name}_{layer}.tif"
    del item["assets"]["metadata"]
    return item


@respx.mock
@responses.activate
def test_stac_search_on_recorded_planetary_computer_answers() -> None:
    root = PLANETARY_COMPUTER_STAC
    respx.get(f"{root}/collections/modis-10A2-061").mock(return_value=httpx.Response(200, json=COLLECTION))
    responses.get(root, json={"type": "Catalog", "id": "microsoft-pc", "stac_version": "1.0.0", "description": "",
                              "conformsTo": ["https://api.stacspec.org/v1.0.0/core",
                                             "https://api.stacspec.org/v1.0.0/item-search"],
                              "links": [{"rel": "search", "href": f"{root}/search", "method": "POST"},
                                        {"rel": "root", "href": root}, {"rel": "self", "href": root}]})
    first = {"type": "FeatureCollection",
             "features": [recorded_item("MOD10A2", "h09v05", "2022042050729"),
                          recorded_item("MYD10A2", "h09v05", "2022042061111")],  # Aqua: same collection
             "links": [{"rel": "next", "href": f"{root}/search", "method": "POST", "body": {"token": "next:2"},
                        "merge": True}]}
    second = {"type": "FeatureCollection", "links": [],
              "features": [recorded_item("MOD10A2", "h08v05", "2022042050001")]}
    search = responses.post(f"{root}/search", json=first)
    responses.post(f"{root}/search", json=second)
    found = StacCatalog(root).search(CATALOG["MOD10A2"], (-112.0, 34.0, -108.0, 37.0), date(2022, 2, 2),
                                     date(2022, 2, 9))
    assert [g.id for g in found] == [NAME, "MOD10A2.A2022033.h08v05.061.2022042050001"]  # both pages, Terra only
    assert dict(found[0].files)["Maximum_Snow_Extent"].startswith(f"{PC_BLOB}/modis-061-cogs/MOD10A2/09/05/")
    asked = json.loads(search.calls[0].request.body)
    assert asked["collections"] == ["modis-10A2-061"] and asked["bbox"] == [-112.0, 34.0, -108.0, 37.0]
    assert asked["datetime"] == "2022-02-02T00:00:00Z/2022-02-09T23:59:59Z"
    aqua = StacCatalog(root)
    responses.post(f"{root}/search", json={**first, "links": []})
    assert [g.product for g in aqua.search(CATALOG["MYD10A2"], (-112.0, 34.0, -108.0, 37.0), date(2022, 2, 2),
                                           date(2022, 2, 9))] == ["MYD10A2"]


@respx.mock
def test_cmr_search_on_recorded_answers_pages_with_search_after(monkeypatch: pytest.MonkeyPatch) -> None:
    url = NASA_CMR + "granules.json"
    xml_entry = Earthdata.entry.__get__(_NoServers())  # the answer built from the real .hdf.xml
    real = xml_entry(CATALOG["MOD10A2"], "h09v05", date(2022, 2, 2))
    other = xml_entry(CATALOG["MOD10A2"], "h08v05", date(2022, 2, 2))
    assert real["title"] == "SC:MOD10A2.061:239609649" and real["producer_granule_id"] == f"{NAME}.hdf"
    pages = [httpx.Response(200, json={"feed": {"entry": [real]}}, headers={"CMR-Search-After": "a1"}),
             httpx.Response(200, json={"feed": {"entry": [other]}})]
    route = respx.get(url).mock(side_effect=pages)
    respx.get(NASA_CMR + "collections.json").mock(return_value=httpx.Response(200, json={"feed": {"entry": [
        {"short_name": "MOD10A2", "version_id": "61", "title": "MODIS/Terra Snow Cover 8-Day L3 Global 500m SIN "
                                                               "Grid V061"}]}}))
    monkeypatch.setattr("pipeline.modis.cmr.PAGE", 1)  # one granule a page: the second page is asked for
    found = CmrCatalog(NASA_CMR).search(CATALOG["MOD10A2"], (170.0, -20.0, -170.0, -10.0), date(2022, 2, 2),
                                        date(2022, 2, 9))
    assert [g.id for g in found] == [NAME, other["producer_granule_id"].removesuffix(".hdf")]
    first, second = (call.request for call in route.calls)
    assert first.url.params["short_name"] == "MOD10A2" and first.url.params["version"] == "61"
    assert first.url.params.get_list("bounding_box[]") == ["170,-20,180,-10", "-180,-20,-170,-10"]
    assert first.url.params["options[bounding_box][or]"] == "true"
    assert "CMR-Search-After" not in first.headers and second.headers["CMR-Search-After"] == "a1"


class _NoServers:
    """Just enough of an Earthdata imitation to build CMR entries (no servers started)."""

    class archive:
        url = "https://n5eil01u.ecs.nsidc.org"

    path_of = Earthdata.path_of


def test_one_search_per_product_finds_the_granules_of_every_task(
        settings: Settings, planetary: Planetary, nasa: Earthdata) -> None:
    request = small_request(products=["MOD10A2", "MYD10A2"], region={"bbox": [-132.5, 36.2, -121.5, 36.8]})
    specs = expand(request, 1000, "modis")
    for mine in (settings.with_(catalog="stac", stac_url=planetary.stac_url, stac_sas_url=planetary.sas_url),
                 settings.with_(catalog="cmr", cmr_url=nasa.cmr_url)):
        resolved = search.resolve(mine, specs, "modis")
        assert len(resolved) == len(specs)
        tiles = [s for s in resolved if s.stage == "modis"]
        assert all(s.granules is not None for s in tiles)
        assert all(g.product == s.product and g.day == s.date for s in tiles for g in s.granules or ())
        # the Pacific tiles have no land: their tasks have no granule; the coast's have h08v05
        assert {len(s.granules or ()) for s in tiles} == {0, 1}, mine.catalog
        found = {g.tile for s in tiles for g in s.granules or ()}
        assert found == {"h08v05"}


def test_the_footprint_of_targets_across_the_antimeridian_crosses_it() -> None:
    box = catalogs.footprint(GridSpec().tiles_for_lonlat_box(178.5, -17.5, -179.5, -16.5))  # 1° target tiles
    assert box == (178.0, -18.0, -179.0, -16.0)
    assert catalogs.split((178.0, -18.0, -179.0, -16.0)) == [(178.0, -18.0, 180.0, -16.0),
                                                             (-180.0, -18.0, -179.0, -16.0)]
    assert catalogs.footprint(GridSpec().tiles_for_lonlat_box(-112, 34, -108, 37)) == (-112.0, 34.0, -108.0, 37.0)


def test_a_reprocessed_granule_supersedes_the_one_it_replaces_and_is_a_new_source() -> None:
    old = Granule.named(NAME, {"hdf": "https://example.org/old.hdf"})
    new = Granule.named(NAME.replace("2022042050729", "2023001120000"), {"hdf": "https://example.org/new.hdf"})
    assert old is not None and new is not None and (old.product, old.tile, old.day) == (new.product, new.tile, new.day)
    key = ("MOD10A2", "h09v05", date(2022, 2, 2))
    assert pick([old, new]) == {key: new} and pick([new, old]) == {key: new}  # the latest production, either order
    assert names.source_blob("MOD10A2", old.id, "f") != names.source_blob("MOD10A2", new.id, "f")


def test_the_imitations_have_no_granule_before_it_is_produced(planetary: Planetary, nasa: Earthdata) -> None:
    """As the real archives: a period still running, or ended days ago, has no granule yet;
    one ended a fortnight ago has (MOD10A2's periods are 8 days; produced 2–9 days after)."""
    product, box = CATALOG["MOD10A2"], (-107.5, 35.0, -107.0, 35.5)
    days = periods(product, date.today() - timedelta(days=40), date.today())
    produced = [day for day in days if day + timedelta(days=18) <= date.today()]
    assert produced and len(produced) < len(days)
    for catalog in (StacCatalog(planetary.stac_url), CmrCatalog(nasa.cmr_url)):
        found = {g.day for g in catalog.search(product, box, days[0], date.today())}
        assert set(produced) <= found and max(found) < days[-1], (type(catalog).__name__, found, days)


def test_the_imitations_answer_for_the_collections_they_hold_and_no_other(planetary: Planetary,
                                                                          nasa: Earthdata) -> None:
    assert httpx.get(f"{planetary.stac_url}/collections/modis-10A2-061").json()["id"] == "modis-10A2-061"
    assert httpx.get(f"{planetary.stac_url}/collections/modis-10A2-006").status_code == 404
    known = httpx.get(nasa.cmr_url + "collections.json", params={"short_name": "MOD10A2", "version": "61"}).json()
    assert [e["short_name"] for e in known["feed"]["entry"]] == ["MOD10A2"]
    for params in ({"short_name": "MOD10A2", "version": "6"}, {"short_name": "MOD10A9", "version": "61"}):
        assert httpx.get(nasa.cmr_url + "collections.json", params=params).json()["feed"]["entry"] == []


def test_a_collection_the_catalog_does_not_hold_fails_the_job_at_planning(
        settings: Settings, azurite: Azurite) -> None:
    """A wrong BAGPIPE_STAC_URL or a retired collection answers every search with nothing:
    every task ended NO_DATA and the job SUCCEEDED. Planning checks the collection and fails
    the job, saying which and why; CMR's short name and version likewise."""
    request = small_request(products=["MOD10A2"])
    with Planetary(azurite.connection_string) as planetary, Earthdata() as nasa:
        del planetary.collections["modis-10A2-061"]  # a STAC API without it
        del nasa.collections["MOD10A2"]  # a CMR that does not know it
        for mine, said in ((on_stac(settings, planetary), "has no collection modis-10A2-061 (MOD10A2's): is "
                                                          "BAGPIPE_STAC_URL the right catalog?"),
                           (on_cmr(settings, nasa), "has no collection MOD10A2 version 61: is BAGPIPE_CMR_URL")):
            with pytest.raises(catalogs.CollectionMissing, match=re.escape(said)):
                catalogs.catalog_for(mine, CATALOG["MOD10A2"]).search(CATALOG["MOD10A2"], (-112.0, 34.0, -108.0, 37.0),
                                                                      date(2022, 1, 1), date(2022, 1, 31))
            with pytest.raises(RequestError, match=re.escape(said)) as refused:
                search.resolve(mine, expand(request, 1000, "modis"), "modis")
            assert refused.value.field == "products"
            clients = Clients(mine)
            clients.ensure_resources()
            job = application.submit(clients, request).job
            planner.plan(clients, job)
            row = jobs.get(clients, job)
            assert row.outcome is JobState.FAILED and said in row.error, row.error
            assert row.planned == 0  # no task was made to end NO_DATA
        # the products they hold are planned as ever
        mine = on_stac(settings, planetary)
        job = application.submit(Clients(mine), small_request(products=["MYD13A1"])).job
        planner.plan(Clients(mine), job)
        assert jobs.get(Clients(mine), job).state is JobState.RUNNING
