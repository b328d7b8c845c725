"""bagpipe's STAC API against the standard it claims, and a job's STAC catalog against the
STAC specification: ``stac-api-validator`` run on the local stack's API with the conformance
classes its landing page claims (signed in with the bearer token) reports no errors, and
``stac-validator`` finds every item and collection a job writes valid, a job without
products included. Then each defect the validators found, on its own: paging by GET,
``datetime`` read as RFC 3339 has it, ``bbox`` of 4 or 6 numbers, ``intersects`` on GET,
``limit`` capped, 400 naming the parameter (never 422 nor 500), media types, links, and a
year's last composite ending with the year.

The validators run in their own virtualenv (``.tools/stac``, ``make setup``) with the JSON
schemas they would fetch served from local copies (``tests/stac_offline.py``): no test here
reaches the network."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pystac
import pytest

from bagpipe.azurite import Azurite
from bagpipe.client import Api, download_results
from bagpipe.stack import LocalStack
from pipeline.modis.products import CATALOG, last_day, periods
from pipeline.storage import names
from pipeline.storage.clients import clients_for
from pipeline.web.stacapi import GEOJSON, MAX_PAGE, OPENAPI, Search, instant, span
from tests.conftest import wait_for

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".tools" / "stac" / "bin" / "python"
OFFLINE = ROOT / "tests" / "stac_offline.py"
BOX = [-110.5, 34.2, -109.6, 34.8]  # two 1° target tiles
INSIDE_WEST = {"type": "Point", "coordinates": [-110.2, 34.5]}  # in the western tile only
# the year's last 8-day composite (27 December) and the next year's first (1 January), and a reduction
PRODUCTS = {"region": {"bbox": BOX}, "grid": {"tile_size": 1.0, "resolution": 0.01}, "start": "2021-12-27",
            "end": "2022-01-02", "products": ["MOD10A2"], "reducer": {"name": "snow_fraction"},
            "label": "new year", "email": "scientist@example.org"}
# Terra's outage of February 2016: every task NO_DATA, a job that succeeds with no products
NOTHING = PRODUCTS | {"start": "2016-02-19", "end": "2016-02-25", "reducer": None, "label": "outage"}
# the validator's names of the conformance classes a landing page may claim
CLASSES = {r"https://api\.stacspec\.org/v1\.0\.0/core": "core",
           r"https://api\.stacspec\.org/v1\.0\.0/collections": "collections",
           r"https://api\.stacspec\.org/v1\.0\.0/ogcapi-features": "features",
           r"https://api\.stacspec\.org/v1\.0\.0/item-search": "item-search",
           r"https://api\.stacspec\.org/v1\.0\.0/(item-search|ogcapi-features)#(fields|sort|query)": r"\1#\2",
           r"http://www\.opengis\.net/spec/ogcapi-features-3/1\.0/conf/filter": "filter",
           # OGC API - Features Part 1, which the validator checks with STAC's features
           r"http://www\.opengis\.net/spec/ogcapi-features-1/1\.0/conf/(core|geojson)": "features"}


@dataclass
class Served:
    api_url: str
    token: str
    job: str  # the job with products
    empty: str  # the job without
    folders: dict[str, Path]  # each job's results, as `bagpipe results` writes them
    stored: dict[str, dict[str, Any]]  # each job's collection and items as the API keeps them in products/{job}/

    @property
    def stac(self) -> str:
        return f"{self.api_url}/api/stac"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def get(self, path: str, **params: Any) -> httpx.Response:
        return httpx.get(f"{self.stac}{path}", params=params, headers=self.headers, timeout=60)

    def post(self, path: str, body: Any) -> httpx.Response:
        return httpx.post(f"{self.stac}{path}", json=body, headers=self.headers, timeout=60)


@pytest.fixture(scope="module")
def served(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("stacapi")
    with LocalStack(tmp / "stack", workers=1, slots=2, connection=azurite.connection_string,
                    namespace=f"sapi{tmp.name[-6:].replace('_', '')}") as stack:
        api = Api(stack.api_url, stack.token)
        jobs = {label: api.submit({k: v for k, v in body.items() if v is not None})["job"]
                for label, body in (("products", PRODUCTS), ("nothing", NOTHING))}
        for job in jobs.values():
            status = wait_for(lambda job=job: (s := api.status(job))["state"] in ("SUCCEEDED", "FAILED") and s,
                              240, "the job")
            assert status["state"] == "SUCCEEDED", status  # type: ignore[index]
        folders = {}
        for job in jobs.values():
            download_results(api, job, tmp / job)
            folders[job] = tmp / job
        served = Served(stack.api_url, stack.token, jobs["products"], jobs["nothing"], folders, {})
        for job in jobs.values():  # the API makes and keeps a job's items at the first ask
            assert served.get(f"/collections/{job}").status_code == 200
            blob = clients_for(stack.settings).products.download_blob(names.stac_blob(job)).readall()
            served.stored[job] = json.loads(blob)
        yield served


def validator(tool: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """Run one of the validators (``stac-api-validator``, ``stac-validator``), offline."""
    if not TOOLS.exists():
        pytest.fail(f"the STAC validators are not installed in {TOOLS.parent.parent}: `make setup` installs them")
    return subprocess.run([str(TOOLS), "-W", "ignore::DeprecationWarning", str(OFFLINE), tool, *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def claimed_classes(landing: dict[str, Any]) -> list[str]:
    """The validator's names of the conformance classes the landing page claims (each claim
    must have one: a claim the validator cannot check fails here)."""
    found = []
    for uri in landing["conformsTo"]:
        names_of = [re.sub(pattern, name, uri) for pattern, name in CLASSES.items() if re.fullmatch(pattern, uri)]
        assert names_of, f"the landing page claims {uri}, which stac-api-validator has no class for"
        found.append(names_of[0])
    return sorted(set(found))


# --- the validators -----------------------------------------------------------------------------
def test_stac_api_validator_finds_no_error_in_the_classes_the_landing_page_claims(served: Served) -> None:
    landing = served.get("").json()
    classes = claimed_classes(landing)
    assert {"core", "collections", "features", "item-search"} <= set(classes)
    args = ["--root-url", served.stac, "--collection", served.job, "--auth-bearer-token", served.token,
            # the validator's last check (pystac over the whole catalog) sends only these headers
            "-H", f"Authorization: Bearer {served.token}", "--geometry", json.dumps(INSIDE_WEST),
            "--validate-pagination", "--log-level", "WARNING"]
    for name in classes:
        args += ["--conformance", name]
    ran = validator("stac-api-validator", *args)
    report = ran.stdout + ran.stderr
    errors = [line for line in report.split("Errors:", 1)[-1].splitlines() if line.startswith("- ")]
    assert "no local copy" not in report, report  # every schema it asked for was served
    assert "Failed." not in report and "Errors: none" in report, f"{len(errors)} errors:\n" + report[-20000:]


def test_stac_validator_finds_every_item_and_collection_a_job_writes_valid(served: Served, tmp_path: Path) -> None:
    checked: dict[str, int] = {}
    for job, folder in served.folders.items():
        # the catalog `bagpipe results` writes: its collection, and every item it links, links and assets opened
        log = tmp_path / f"{job}.json"
        ran = validator("stac-validator", "--recursive", "--links", "--assets", "--no_output", "--log_file",
                        str(log), str(folder / "collection.json"))
        found = json.loads(log.read_text())
        assert ran.returncode == 0 and all(entry["valid_stac"] for entry in found), ran.stdout + log.read_text()
        checked[job] = len(found)
        # what the API keeps in products/{job}/: the collection and each item, as stored
        stored = served.stored[job]
        for number, entry in enumerate([stored["collection"], *stored["items"]]):
            path = tmp_path / f"{job}-stored-{number}.json"
            path.write_text(json.dumps(entry))
            ran = validator("stac-validator", "--no_output", "--log_file", str(log), str(path))
            assert ran.returncode == 0 and json.loads(log.read_text())[0]["valid_stac"], log.read_text()
    # the job with products: 2 tiles × 2 periods, 2 reductions, the region's 2 mosaics and its reductions'
    assert checked == {served.job: 1 + 4 + 2 + 2 + 1, served.empty: 1}
    assert len(served.stored[served.job]["items"]) == 6 and served.stored[served.empty]["items"] == []


# --- each defect on its own -----------------------------------------------------------------------
def test_get_paging_follows_next_and_prev_links_on_items_and_search(served: Served) -> None:
    for path, params in ((f"/collections/{served.job}/items", {}), ("/search", {"collections": served.job})):
        first = served.get(path, limit=2, **params)
        assert first.status_code == 200, first.text
        pages, url, seen = [first.json()], None, []
        while (following := [link for link in pages[-1]["links"] if link["rel"] == "next"]):
            assert following[0]["method"] == "GET" and following[0]["type"] == GEOJSON
            url = following[0]["href"]
            answer = httpx.get(url, headers=served.headers, timeout=60)
            assert answer.status_code == 200, (url, answer.text)
            assert answer.headers["content-type"] == GEOJSON
            pages.append(answer.json())
            (self_link,) = [link["href"] for link in pages[-1]["links"] if link["rel"] == "self"]
            assert self_link == url
        seen = [f["id"] for page in pages for f in page["features"]]
        assert [len(page["features"]) for page in pages] == [2, 2, 2] and len(set(seen)) == 6, path
        (back,) = [link["href"] for link in pages[1]["links"] if link["rel"] == "prev"]
        previous = httpx.get(back, headers=served.headers, timeout=60).json()
        assert [f["id"] for f in previous["features"]] == [f["id"] for f in pages[0]["features"]]
        assert not [link for link in pages[0]["links"] if link["rel"] == "prev"]


def test_a_datetime_without_a_time_zone_is_a_400_and_the_connection_goes_on(served: Served) -> None:
    with httpx.Client(headers=served.headers, timeout=60) as http:
        for _ in range(2):
            refused = http.get(f"{served.stac}/search", params={"datetime": "2022-01-02T00:00:00"})
            assert refused.status_code == 400, refused.text
            assert refused.json()["field"] == "datetime" and refused.json()["code"] == "InvalidParameterValue"
            assert http.get(f"{served.stac}/search", params={"collections": served.job}).status_code == 200


INVALID_DATETIMES = ["/", "../..", "/..", "../", "2022-01-01T00:00:00Z/2022-01-02T00:00:00Z/", "2022-01-02",
                     "2022-01-02T00:00:00+0100", "2022-01-02T00:00:00,5Z", "2022-01-02T00:00:00.Z",
                     "22-01-02T00:00:00Z", "2022-13-02T00:00:00Z", "2022-01-32T00:00:00Z", "2022-01-02T24:00:00Z",
                     "2022-01-02T00:60:00Z", "2022-01-02T00:00:61Z", "2022-01-09T00:00:00Z/2022-01-02T00:00:00Z",
                     "2022-01-02 00:00:00Z", "2022-01-02T00:00:00+24:00"]


def test_invalid_datetimes_are_refused_naming_the_parameter(served: Served) -> None:
    for text in INVALID_DATETIMES:
        for answer in (served.get("/search", datetime=text), served.post("/search", {"datetime": text}),
                       served.get(f"/collections/{served.job}/items", datetime=text)):
            assert answer.status_code == 400, (text, answer.status_code, answer.text)
            assert answer.json()["field"] == "datetime" and "datetime" in answer.json()["description"], text
    # the job's items: two tiles on 27 December and on 1 January, two reductions over both periods
    for text, found in (("2022-01-02T12:00:00Z", 4), ("2022-01-02t12:00:00.123456789z", 4),
                        ("2022-01-02T12:00:00-05:00", 4), ("../2021-12-31T23:59:60Z", 4), ("2022-01-01T00:00:00Z/", 4),
                        ("/2021-12-26T23:59:59+00:00", 0), ("2022-01-09T00:00:00+00:00/..", 0),
                        ("2021-12-20T00:00:00Z/2022-01-20T00:00:00Z", 6)):
        answer = served.get("/search", collections=served.job, datetime=text)
        assert answer.status_code == 200 and answer.json()["numberMatched"] == found, (text, answer.text)


def test_the_last_composite_of_a_year_ends_with_the_year(served: Served) -> None:
    product = CATALOG["MOD10A2"]
    assert last_day(product, date(2021, 12, 27)) == date(2021, 12, 31)  # five days, not eight
    assert last_day(product, date(2022, 1, 1)) == date(2022, 1, 8)
    assert periods(product, date(2022, 1, 2), date(2022, 1, 2)) == [date(2022, 1, 1)]
    items = served.get(f"/collections/{served.job}/items").json()["features"]
    ends = {(i["properties"]["bagpipe:stage"], i["properties"]["start_datetime"][:10]): i["properties"]["end_datetime"]
            for i in items}
    assert ends == {("modis", "2021-12-27"): "2021-12-31T23:59:59Z", ("modis", "2022-01-01"): "2022-01-08T23:59:59Z",
                    ("reduce", "2021-12-27"): "2022-01-02T23:59:59Z"}
    # (a reduction covers its group of dates: here the request's span)
    # 2 January is in one period only: the new year's tiles and the reductions over both
    found = served.get("/search", collections=served.job, datetime="2022-01-02T12:00:00Z").json()["features"]
    assert sorted((f["properties"]["bagpipe:stage"], f["properties"]["start_datetime"][:10]) for f in found) == \
        [("modis", "2022-01-01")] * 2 + [("reduce", "2021-12-27")] * 2
    # the results folder's items say the same
    folder = pystac.Collection.from_file(str(served.folders[served.job] / "collection.json"))
    last = [i for i in folder.get_items() if i.properties["start_datetime"].startswith("2021-12-27")
            and "bagpipe:reducer" not in i.properties]  # its tiles and their mosaic
    assert len(last) == 3 and {i.properties["end_datetime"] for i in last} == {"2021-12-31T23:59:59Z"}


def test_get_search_takes_intersects_and_refuses_a_geometry_that_is_not_one(served: Served) -> None:
    west = served.get("/search", collections=served.job, intersects=json.dumps(INSIDE_WEST)).json()["features"]
    everything = served.get("/search", collections=served.job).json()["features"]
    assert 0 < len(west) < len(everything) and len({f["properties"]["bagpipe:tile"] for f in west}) == 1
    posted = served.post("/search", {"collections": [served.job], "intersects": INSIDE_WEST}).json()["features"]
    assert sorted(f["id"] for f in posted) == sorted(f["id"] for f in west)
    elsewhere = {"type": "Point", "coordinates": [10.0, 45.0]}
    assert served.get("/search", collections=served.job, intersects=json.dumps(elsewhere)).json()["features"] == []
    for params in ({"intersects": "{not json"}, {"intersects": json.dumps({"type": "Circle", "coordinates": [1, 2]})},
                   {"intersects": json.dumps({"type": "Polygon", "coordinates": "x"})},
                   {"intersects": json.dumps(INSIDE_WEST), "bbox": "0,0,1,1"}):
        refused = served.get("/search", **params)
        assert refused.status_code == 400 and refused.json()["field"] == "intersects", (params, refused.text)


def test_a_bbox_is_four_or_six_numbers_south_of_its_north(served: Served) -> None:
    flat = served.get("/search", collections=served.job, bbox=",".join(map(str, BOX))).json()
    high = served.get("/search", collections=served.job, bbox=f"{BOX[0]},{BOX[1]},-100,{BOX[2]},{BOX[3]},9000").json()
    posted = served.post("/search", {"collections": [served.job], "bbox": [BOX[0], BOX[1], -100, BOX[2], BOX[3], 9000]})
    assert flat["numberMatched"] == high["numberMatched"] == posted.json()["numberMatched"] == 6, posted.text
    for bbox in ("-110,35,-109,34", "0", "0,0", "0,0,0", "0,0,0,1,1", "0,0,0,1,1,1,1", "[-110,34,-109,35]",
                 "-110,34,-109,95", "-190,34,-109,35", "0,0,5,1,1,4"):
        refused = served.get("/search", bbox=bbox)
        assert refused.status_code == 400 and refused.json()["field"].split(".")[0] == "bbox", (bbox, refused.text)
    for bbox in ("-110, 34, -109, 35", [-110, 35, -109, 34], [0, 0, 0, 1, 1], [True, 34, -109, 35]):
        refused = served.post("/search", {"bbox": bbox})
        assert refused.status_code == 400 and refused.json()["field"].split(".")[0] == "bbox", (bbox, refused.text)


def test_a_limit_above_the_largest_page_is_that_page_and_one_below_one_a_400(served: Served) -> None:
    for limit in (MAX_PAGE + 1, 100_000):
        for answer in (served.get("/search", limit=limit), served.post("/search", {"limit": limit}),
                       served.get(f"/collections/{served.job}/items", limit=limit)):
            assert answer.status_code == 200 and answer.json()["numberReturned"] == 6, answer.text
    for limit in (0, -1, "ten", 2.5):
        for answer in (served.get("/search", limit=limit), served.post("/search", {"limit": limit}),
                       served.get(f"/collections/{served.job}/items", limit=limit)):
            assert answer.status_code == 400 and answer.json()["field"] == "limit", (limit, answer.text)


def test_a_bad_request_is_a_400_naming_what_is_wrong_never_a_422(served: Served) -> None:
    for body in ({"collections": "not a list"}, {"ids": [1, 2]}, {"token": -1}, {"intersects": "x"}):
        refused = served.post("/search", body)
        field = next(iter(body))
        assert refused.status_code == 400, (body, refused.status_code, refused.text)
        assert refused.json()["field"].split(".")[0] == field and refused.json()["code"] == "InvalidParameterValue"
    refused = httpx.post(f"{served.stac}/search", content=b"{not json", timeout=60,
                         headers=served.headers | {"Content-Type": "application/json"})
    assert refused.status_code == 400 and refused.json()["field"] == "body", refused.text
    assert served.get("/search", token="x").status_code == 400


def test_media_types_and_links_are_the_specification_s(served: Served) -> None:
    landing = served.get("")
    assert landing.headers["content-type"] == "application/json"
    rels = {link["rel"]: link for link in landing.json()["links"]}
    assert {"self", "root", "conformance", "data", "search", "service-desc", "service-doc"} <= set(rels)
    desc = httpx.get(rels["service-desc"]["href"], headers={"Accept": rels["service-desc"]["type"]}, timeout=60)
    assert rels["service-desc"]["type"] == OPENAPI and desc.headers["content-type"] == OPENAPI
    assert "/api/stac/search" in desc.json()["paths"]
    assert httpx.get(rels["service-doc"]["href"], timeout=60).headers["content-type"].startswith("text/html")
    for path in ("/conformance", "/collections", f"/collections/{served.job}"):
        assert served.get(path).headers["content-type"] == "application/json", path
    items = served.get(f"/collections/{served.job}/items")
    item_url = next(link["href"] for link in items.json()["features"][0]["links"] if link["rel"] == "self")
    for answer in (items, served.get("/search"), served.post("/search", {}),
                   httpx.get(item_url, headers=served.headers, timeout=60)):
        assert answer.status_code == 200 and answer.headers["content-type"] == GEOJSON, answer.request.url
    page_rels = {link["rel"] for link in items.json()["links"]}
    assert {"self", "root", "parent", "collection"} <= page_rels
    item_rels = {link["rel"] for link in httpx.get(item_url, headers=served.headers, timeout=60).json()["links"]}
    assert {"self", "root", "parent", "collection"} <= item_rels


def test_a_job_without_products_is_a_valid_collection_of_no_items(served: Served) -> None:
    collection = served.get(f"/collections/{served.empty}").json()
    assert all(values for values in collection.get("summaries", {}).values()), collection["summaries"]
    west, south, east, north = collection["extent"]["spatial"]["bbox"][0]
    assert (west, south, east, north) == tuple(BOX)  # the request's region, as nothing was made
    assert served.get(f"/collections/{served.empty}/items").json()["features"] == []
    assert served.empty in {c["id"] for c in served.get("/collections").json()["collections"]}


# --- without a stack --------------------------------------------------------------------------------
def test_a_limit_is_capped_at_the_largest_page() -> None:
    capped = [Search(limit=limit).limit for limit in (1, MAX_PAGE, MAX_PAGE + 1, 10**6)]
    assert capped == [1, MAX_PAGE, MAX_PAGE, MAX_PAGE]


def test_rfc3339_date_times_and_intervals() -> None:
    assert instant("2022-01-02T03:04:05Z") == datetime(2022, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert instant("2022-01-02t03:04:05.123456789z") == datetime(2022, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    assert instant("2022-01-02T03:04:05-08:00") == datetime(2022, 1, 2, 3, 4, 5,
                                                             tzinfo=timezone(-timedelta(hours=8)))
    assert instant("2016-12-31T23:59:60Z") == datetime(2016, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)  # leap second
    assert span("2022-01-02T00:00:00Z/..") == (datetime(2022, 1, 2, tzinfo=UTC), None)
    assert span("/2022-01-02T00:00:00Z") == (None, datetime(2022, 1, 2, tzinfo=UTC))
    assert span(None) == (None, None)
    for text in INVALID_DATETIMES:
        with pytest.raises(ValueError):
            span(text)
