"""The openEO API against a real Azurite: discovery open and everything else signed in, basic
authentication with a personal token, the MODIS collections, the processes' official specs,
jobs created (not started), changed, listed per user, refused in milliseconds naming the
process, started, cancelled, estimated, and their budgets."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterator
from importlib import resources
from typing import Any
from urllib.parse import unquote

import pytest
from fastapi.testclient import TestClient

from pipeline.lifecycle import jobs, runtimes
from pipeline.modis.products import CATALOG
from pipeline.requests import application
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.storage import clients as clients_module
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web import identity
from pipeline.web.api import create_app
from pipeline.web.openeo import graph, routes, store
from tests.conftest import decided_within, make_user
from tests.test_identity import CLIENT_ID, Issuer

BASE = "/openeo/1.2"
BOX = {"west": -108.0, "south": 35.2, "east": -107.5, "north": 35.8}
MAX = {"process_graph": {"max": {"process_id": "max", "arguments": {"data": {"from_parameter": "data"}},
                                 "result": True}}}


def monthly_max(**load: Any) -> dict[str, Any]:
    """A year of MOD13A1 NDVI over a box, its maximum per month, as GeoTIFF."""
    arguments = {"id": "MOD13A1", "spatial_extent": BOX, "temporal_extent": ["2022-01-01", "2023-01-01"],
                 "bands": ["500m_16_days_NDVI"]} | load
    return {"process_graph": {
        "load": {"process_id": "load_collection", "arguments": arguments},
        "agg": {"process_id": "aggregate_temporal_period",
                "arguments": {"data": {"from_node": "load"}, "period": "month", "reducer": MAX}},
        "save": {"process_id": "save_result", "arguments": {"data": {"from_node": "agg"}, "format": "GTiff"},
                 "result": True}}}


def with_node(process: dict[str, Any], key: str, node: dict[str, Any], save_from: str) -> dict[str, Any]:
    """The process with one more node, the saved cube the new node's (``agg``: the node reads
    the load, the monthly maximum reads the new node)."""
    nodes = json.loads(json.dumps(process["process_graph"]))
    nodes[key] = node
    if save_from == "agg":
        nodes["agg"]["arguments"]["data"] = {"from_node": key}
    else:
        nodes["save"]["arguments"]["data"] = {"from_node": save_from}
    return {"process_graph": nodes}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer basic//{token}"}


@pytest.fixture
def api(settings: Settings, clients: Clients) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture
def token(clients: Clients) -> str:
    return make_user(clients, "ana")


def created(api: TestClient, token: str, process: dict[str, Any] | None = None, **fields: Any) -> str:
    answer = api.post(f"{BASE}/jobs", json={"process": process or monthly_max(), **fields}, headers=bearer(token))
    assert answer.status_code == 201, answer.text
    return answer.headers["OpenEO-Identifier"]


def test_discovery_is_open_and_names_every_endpoint(api: TestClient) -> None:
    known = api.get("/.well-known/openeo").json()
    assert known["versions"][0]["api_version"] == "1.2.0"
    assert known["versions"][0]["url"].endswith("/openeo/1.2/")
    capabilities = api.get(f"{BASE}/").json()
    assert capabilities["api_version"] == "1.2.0" and capabilities["billing"]["currency"] == "USD"
    paths = {e["path"]: set(e["methods"]) for e in capabilities["endpoints"]}
    assert paths["/jobs/{job_id}/results"] == {"GET", "POST", "DELETE"}
    assert paths["/jobs/{job_id}"] == {"GET", "PATCH", "DELETE"}
    for path in paths:  # every endpoint named is served: a GET of it is not the router's 404 or 405
        if "GET" in paths[path]:
            answer = api.get(BASE + path.replace("{collection_id}", "MOD13A1").replace("{job_id}", "none"))
            assert answer.status_code not in (404, 405) or "code" in answer.json(), path
    nowhere = api.get(f"{BASE}/process_graphs")  # not served (user-defined processes): openEO's 404
    assert nowhere.status_code == 404 and nowhere.json()["code"] == "NotFound", nowhere.text
    wrong = api.put(f"{BASE}/jobs")
    assert wrong.status_code == 405 and wrong.json()["code"] == "MethodNotAllowed", wrong.text
    joined = api.get(f"{BASE}//collections//MOD13A1?x=1", follow_redirects=False)  # a slash too many
    assert joined.status_code == 308 and joined.headers["location"].endswith(f"{BASE}/collections/MOD13A1?x=1")
    assert api.get(f"{BASE}//collections").json()["collections"]
    formats = api.get(f"{BASE}/file_formats").json()["output"]
    assert set(formats) == {"GTiff", "netCDF", "Zarr", "CSV", "Parquet", "JSON"}
    assert formats["netCDF"]["gis_data_types"] == ["raster"] and formats["CSV"]["gis_data_types"] == ["table"]
    assert api.get(f"{BASE}/service_types").json() == {}
    oidc = api.get(f"{BASE}/credentials/oidc")  # no Entra on the local stack: not there, nor in the list
    assert oidc.status_code == 404 and oidc.json()["code"] == "NotFound" and "/credentials/oidc" not in paths


def test_entra_is_the_openid_connect_provider_where_the_deployment_signs_in_with_it(
        settings: Settings, clients: Clients, token: str) -> None:
    issuer = Issuer()
    try:
        with TestClient(create_app(settings.with_(entra_issuer=issuer.url, entra_client_id=CLIENT_ID))) as api:
            assert "/credentials/oidc" in {e["path"] for e in api.get(f"{BASE}/").json()["endpoints"]}
            provider = api.get(f"{BASE}/credentials/oidc").json()["providers"][0]
            assert provider["id"] == "entra" and provider["issuer"] == issuer.url
            assert provider["default_clients"][0]["id"] == CLIENT_ID

            def me(id_token: str) -> Any:
                return api.get(f"{BASE}/me", headers={"Authorization": f"Bearer oidc/entra/{id_token}"})

            assert me(issuer.id_token("ana@example.org")).json()["user_id"] == "ana"  # the user an admin added
            assert me(issuer.id_token("eve@example.org", oid="oid-2")).json()["code"] == "PermissionsInsufficient"
            forged = issuer.id_token("ana@example.org", aud="another-app")
            assert me(forged).status_code == 403 and me(forged).json()["code"] == "TokenInvalid"
            assert api.get(f"{BASE}/me", headers={"Authorization": f"Bearer oidc/google/{forged}"}).json()[
                "code"] == "TokenInvalid"
    finally:
        issuer.server.shutdown()


def test_everything_else_wants_a_signed_in_user_with_openeos_error(api: TestClient, token: str) -> None:
    for method, path in (("GET", "/me"), ("GET", "/jobs"), ("POST", "/jobs"), ("GET", "/jobs/x"),
                         ("POST", "/validation"), ("GET", "/jobs/x/results"), ("GET", "/jobs/x/logs")):
        answer = api.request(method, BASE + path, json={})
        assert answer.status_code == 401, (method, path)
        body = answer.json()
        assert body["code"] == "AuthenticationRequired" and body["id"] and body["message"], body
    assert api.get(f"{BASE}/me", headers={"Authorization": f"Bearer {token}"}).json()["code"] == (
        "AuthenticationSchemeInvalid")  # the native form of the token is not openEO's
    assert api.get(f"{BASE}/me", headers=bearer("bgp_0000000000000000_" + "x" * 43)).json()["code"] == "TokenInvalid"


def test_basic_authentication_takes_a_personal_token_as_the_password(
        api: TestClient, clients: Clients, token: str) -> None:
    def basic(name: str, password: str) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}

    answer = api.get(f"{BASE}/credentials/basic", headers=basic("ana", token))
    assert answer.status_code == 200
    access = answer.json()["access_token"]
    me = api.get(f"{BASE}/me", headers=bearer(access)).json()
    assert me["user_id"] == "ana" and me["default_plan"] == "pay-as-you-go"
    other = make_user(clients, "ben")
    assert api.get(f"{BASE}/credentials/basic", headers=basic("ana", other)).json()["code"] == "CredentialsInvalid"
    assert api.get(f"{BASE}/credentials/basic").status_code == 401
    token_id = access.split("_")[1]
    identity.revoke_token(clients, token_id, by="test")
    answer = api.get(f"{BASE}/me", headers=bearer(access))
    assert answer.status_code == 403 and answer.json()["code"] == "TokenInvalid"  # revoked: out at once


def test_collections_are_the_modis_products_as_stac_data_cubes(api: TestClient) -> None:
    listed = api.get(f"{BASE}/collections").json()
    ids = [c["id"] for c in listed["collections"]]
    assert "MOD13A1" in ids and "MCD43A4" in ids and listed["links"]
    one = api.get(f"{BASE}/collections/MOD13A1").json()
    assert one["stac_version"] == "1.1.0" and one["type"] == "Collection"
    assert any(e.startswith("https://stac-extensions.github.io/datacube/") for e in one["stac_extensions"])
    dims = one["cube:dimensions"]
    assert set(dims) == {"x", "y", "t", "bands"} and dims["t"]["step"] == "P16D"
    assert "500m_16_days_NDVI" in dims["bands"]["values"]
    common = {b["name"]: b.get("common_name") for b in one["summaries"]["eo:bands"]}
    assert common["500m_16_days_NIR_reflectance"] == "nir" and common["500m_16_days_red_reflectance"] == "red"
    by_id = {c["id"]: c for c in listed["collections"]}
    assert set(by_id) == set(CATALOG)  # every product of the catalog, each period its own
    steps = {name: c["cube:dimensions"]["t"]["step"] for name, c in by_id.items()}
    assert (steps["MOD11A1"], steps["MOD10A2"], steps["MCD64A1"], steps["MCD12Q1"]) == ("P1D", "P8D", "P1M", "P1Y")
    assert by_id["MCD12Q1"]["extent"]["temporal"]["interval"][0][0] == "2001-01-01T00:00:00Z"
    assert "NSIDC" in by_id["MOD10A2"]["description"] and "nsidc.org" in by_id["MOD10A2"]["providers"][0]["url"]
    surface = {b["name"]: b.get("common_name") for b in by_id["MOD09A1"]["summaries"]["eo:bands"]}
    assert (surface["sur_refl_b01"], surface["sur_refl_b02"]) == ("red", "nir")  # what ndvi finds unnamed
    missing = api.get(f"{BASE}/collections/SENTINEL2_L2A")
    assert missing.status_code == 404 and missing.json()["code"] == "CollectionNotFound"


def test_processes_are_the_official_specs_served_verbatim(api: TestClient) -> None:
    served = {p["id"]: p for p in api.get(f"{BASE}/processes").json()["processes"]}
    assert set(served) == set(graph.PROCESSES)
    folder = resources.files("pipeline.web.openeo") / "specs"
    for process, spec in served.items():
        assert spec == json.loads((folder / f"{process}.json").read_text()), process


def test_a_job_is_created_not_started_and_is_its_owners_alone(
        api: TestClient, clients: Clients, token: str) -> None:
    answer = api.post(f"{BASE}/jobs", json={"title": "NDVI", "process": monthly_max(), "budget": 5},
                      headers=bearer(token))
    assert answer.status_code == 201
    job = answer.headers["OpenEO-Identifier"]
    assert answer.headers["Location"].endswith(f"{BASE}/jobs/{job}")
    found = api.get(f"{BASE}/jobs/{job}", headers=bearer(token)).json()
    assert found["status"] == "created" and found["title"] == "NDVI" and found["budget"] == 5
    assert found["process"] == monthly_max() and found["progress"] == 0
    assert not [e for e in clients.jobs.list_entities() if e["RowKey"] == "job"]  # no bagpipe job: nothing to run
    assert [j["id"] for j in api.get(f"{BASE}/jobs", headers=bearer(token)).json()["jobs"]] == [job]
    other = make_user(clients, "ben")
    assert api.get(f"{BASE}/jobs", headers=bearer(other)).json()["jobs"] == []
    for method, path in (("GET", ""), ("PATCH", ""), ("DELETE", ""), ("POST", "/results"), ("GET", "/logs"),
                         ("GET", "/estimate"), ("GET", "/results")):
        refused = api.request(method, f"{BASE}/jobs/{job}{path}", json={"title": "mine"}, headers=bearer(other))
        assert refused.status_code == 404 and refused.json()["code"] == "JobNotFound", (method, path)
    assert api.patch(f"{BASE}/jobs/{job}", json={"title": "NDVI max", "budget": 2},
                     headers=bearer(token)).status_code == 204
    assert api.get(f"{BASE}/jobs/{job}", headers=bearer(token)).json()["title"] == "NDVI max"
    assert api.delete(f"{BASE}/jobs/{job}", headers=bearer(token)).status_code == 204
    assert api.get(f"{BASE}/jobs/{job}", headers=bearer(token)).status_code == 404


REFUSED = [
    # (what, process, status, code, words the message must hold)
    ("an unknown process", with_node(monthly_max(), "x", {
        "process_id": "frobnicate", "arguments": {"data": {"from_node": "agg"}}}, "x"),
     400, "ProcessUnsupported", ["frobnicate"]),
    ("a point outside the data", with_node(monthly_max(), "x", {
        "process_id": "aggregate_spatial", "arguments": {"data": {"from_node": "load"}, "reducer": MAX, "geometries": {
            "type": "Point", "coordinates": [-100.0, 35.4]}}}, "x"),
     400, "ProcessParameterInvalid", ["aggregate_spatial", "outside the data's spatial extent"]),
    ("resampling across tile edges", with_node(monthly_max(), "x", {
        "process_id": "resample_spatial", "arguments": {"data": {"from_node": "agg"}, "resolution": 0.1}}, "x"),
     400, "ProcessUnsupported", ["resample_spatial", "tile edges"]),
    ("a Python UDF on a whole cube", with_node(monthly_max(), "x", {
        "process_id": "run_udf", "arguments": {"data": {"from_node": "agg"}, "runtime": "Python",
                                                "udf": "def apply_datacube(cube, context):\n    return cube\n"}}, "x"),
     400, "ProcessUnsupported", ["run_udf", "the reducer of reduce_dimension or aggregate_temporal_period over t"]),
    ("model fitting", with_node(monthly_max(), "x", {
        "process_id": "fit_curve", "arguments": {"data": {"from_node": "agg"}}}, "x"),
     400, "ProcessUnsupported", ["fit_curve"]),
    ("an unknown collection", monthly_max(id="SENTINEL2_L2A"), 404, "CollectionNotFound", ["SENTINEL2_L2A"]),
    ("an unknown band", monthly_max(bands=["B04"]), 400, "ProcessParameterInvalid", ["B04"]),
    ("no spatial extent", monthly_max(spatial_extent=None), 400, "ProcessParameterInvalid", ["spatial_extent"]),
    ("an empty polygon as the extent", monthly_max(spatial_extent={"type": "Polygon", "coordinates": []}), 400,
     "ProcessParameterInvalid", ["spatial_extent", "empty"]),
    ("a graph of more than 4 MiB", with_node(monthly_max(), "x", {
        "process_id": "filter_spatial", "arguments": {"data": {"from_node": "load"}, "geometries": {
            "type": "Polygon", "coordinates": [[[-107.9 + i * 1e-7, 35.3] for i in range(200_000)]]}}}, "agg"),
     413, "PayloadTooLarge", ["body larger than 4194304 bytes"]),
    ("an open temporal extent", monthly_max(temporal_extent=["2022-01-01", None]), 400, "ProcessParameterInvalid",
     ["temporal_extent"]),
    ("a reference to no node", with_node(monthly_max(), "x", {
        "process_id": "apply", "arguments": {"data": {"from_node": "nothing"}}}, "x"),
     400, "ProcessGraphInvalid", ["nothing"]),
    ("JSON", {"process_graph": {**monthly_max()["process_graph"], "save": {
        "process_id": "save_result", "arguments": {"data": {"from_node": "agg"}, "format": "JSON"},
        "result": True}}}, 400, "FormatUnsuitable", ["JSON", "netCDF"]),
    ("a week's grouping", {"process_graph": {**monthly_max()["process_graph"], "agg": {
        "process_id": "aggregate_temporal_period", "arguments": {"data": {"from_node": "load"}, "period": "week",
                                                                  "reducer": MAX}}}}, 400,
     "ProcessParameterUnsupported", ["week", "month"]),
    ("a request over the task limit", monthly_max(spatial_extent={"west": -170, "south": -60, "east": 170,
                                                                  "north": 70}), 400, "ProcessGraphInvalid",
     ["region", "limit"]),
]


@pytest.mark.parametrize(("what", "process", "status", "code", "words"), REFUSED, ids=[r[0] for r in REFUSED])
def test_a_graph_bagpipe_cannot_run_is_refused_at_once_naming_the_process(
        api: TestClient, clients: Clients, token: str, what: str, process: dict[str, Any], status: int, code: str,
        words: list[str]) -> None:
    api.post(f"{BASE}/validation", json=monthly_max(), headers=bearer(token))  # the parser imported
    body = json.dumps({"process": process}).encode()  # encoded first: the client's time is not the server's
    with decided_within(1.0):  # decided in milliseconds of CPU (a second: a busy machine's margin)
        answer = api.post(f"{BASE}/jobs", content=body, headers=bearer(token) | {"Content-Type": "application/json"})
    assert answer.status_code == status, answer.text
    found = answer.json()
    assert found["code"] == code and all(w in found["message"] for w in words), found
    assert not list(clients.jobs.query_entities("PartitionKey eq @pk", parameters={"pk": store.partition("ana")}))
    checked = api.post(f"{BASE}/validation", json=process, headers=bearer(token))  # its errors, or its refusal
    assert ([e["code"] for e in checked.json()["errors"]] if checked.status_code == 200 else
            [checked.json()["code"]]) == [code]


def test_validation_of_a_good_graph_finds_no_error(api: TestClient, token: str) -> None:
    assert api.post(f"{BASE}/validation", json=monthly_max(), headers=bearer(token)).json() == {"errors": []}


def test_a_start_submits_a_bagpipe_job_once_and_a_cancel_ends_it(
        api: TestClient, clients: Clients, token: str) -> None:
    job = created(api, token)
    results = api.get(f"{BASE}/jobs/{job}/results", headers=bearer(token))
    assert results.status_code == 400 and results.json()["code"] == "JobNotStarted"
    assert api.post(f"{BASE}/jobs/{job}/results", headers=bearer(token)).status_code == 202
    record = store.get(clients, "ana", job)
    assert record is not None and len(record.run_ids) == 1
    run = jobs.get(clients, record.latest)
    assert run.owner == "ana" and run.total == 23 + 12  # 23 dates of one 1° tile, a reduction a month
    found = api.get(f"{BASE}/jobs/{job}", headers=bearer(token)).json()
    assert found["status"] == "queued" and found["queued"] and "started" not in found
    assert api.post(f"{BASE}/jobs/{job}/results", headers=bearer(token)).status_code == 202
    assert len(store.get(clients, "ana", job).run_ids) == 1  # queued: a second start is nothing  # type: ignore[union-attr]
    locked = api.patch(f"{BASE}/jobs/{job}", json={"title": "x"}, headers=bearer(token))
    assert locked.status_code == 400 and locked.json()["code"] == "JobLocked"
    running = api.get(f"{BASE}/jobs/{job}/results", headers=bearer(token))
    assert running.status_code == 400 and running.json()["code"] == "JobNotFinished"
    assert api.get(f"{BASE}/jobs/{job}/results?partial=true", headers=bearer(token)).json()["openeo:status"] == (
        "queued")
    assert api.delete(f"{BASE}/jobs/{job}/results", headers=bearer(token)).status_code == 204
    assert jobs.get(clients, record.latest).state.value in ("CANCELLING", "FINISHING", "CANCELLED")
    assert api.get(f"{BASE}/jobs/{job}", headers=bearer(token)).json()["status"] == "canceled"


def test_a_look_at_a_job_reads_its_row_once(
        settings: Settings, clients: Clients, token: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script polls openEO's job as often as the native API's: each look, openEO's or the
    native API's, reads the job's row once (the workers' health rows, which openEO's look
    does not read: test_status)."""
    seen: list[str] = []
    monkeypatch.setitem(clients_module.HOOKS, "raw_request_hook", lambda request: seen.append(
        unquote(request.http_request.url)))
    with TestClient(create_app(settings)) as api:  # its clients built with the hook
        job = created(api, token)
        assert api.post(f"{BASE}/jobs/{job}/results", headers=bearer(token)).status_code == 202
        record = store.get(clients, "ana", job)
        assert record is not None
        job_row = f"{settings.names.jobs}(PartitionKey='{record.latest}',RowKey='{names.JOB_ROW}')"
        for path, headers in ((f"{BASE}/jobs/{job}", bearer(token)),
                              (f"/api/jobs/{record.latest}", {names.TOKEN_HEADER: token})):
            seen.clear()
            assert api.get(path, headers=headers).status_code == 200
            assert sum(job_row in url for url in seen) == 1, (path, seen)


def test_the_estimate_prices_the_tasks_and_a_budget_below_it_is_not_started(
        api: TestClient, clients: Clients, settings: Settings, token: str) -> None:
    history = runtimes.Runtime(settings.min_samples, 1.0)  # a history: a second per megapixel of each stage
    for stage, key in (("modis", "MOD13A1"), ("aggregate", "MOD13A1~max")):
        runtimes.merge(clients.runtimes, stage, key, history)
    job = created(api, token, budget=0.0001)
    estimate = api.get(f"{BASE}/jobs/{job}/estimate", headers=bearer(token)).json()
    assert estimate["costs"] > 0.0001 and estimate["duration"].startswith("PT") and estimate["bagpipe:tasks"] == 35
    refused = api.post(f"{BASE}/jobs/{job}/results", headers=bearer(token))
    assert refused.status_code == 402 and refused.json()["code"] == "PaymentRequired", refused.text
    assert "budget" in refused.json()["message"]
    assert store.get(clients, "ana", job).run_ids == []  # type: ignore[union-attr]  # nothing submitted
    assert api.patch(f"{BASE}/jobs/{job}", json={"budget": 100}, headers=bearer(token)).status_code == 204
    assert api.post(f"{BASE}/jobs/{job}/results", headers=bearer(token)).status_code == 202
    run = jobs.get(clients, store.get(clients, "ana", job).latest)  # type: ignore[union-attr]
    assert run.budget_usd == 100  # the sweep stops it past that


def test_a_users_default_budget_applies_to_a_job_that_names_none(
        settings: Settings, clients: Clients, token: str) -> None:
    import dataclasses

    with TestClient(create_app(dataclasses.replace(settings, default_budget_usd=3.0))) as api:
        job = created(api, token)
        assert api.get(f"{BASE}/me", headers=bearer(token)).json()["budget"] == 3.0
        assert api.post(f"{BASE}/jobs/{job}/results", headers=bearer(token)).status_code == 202
    run = jobs.get(clients, store.get(clients, "ana", job).latest)  # type: ignore[union-attr]
    assert run.budget_usd == 3.0


def test_a_burst_of_jobs_past_the_users_rate_is_refused_with_openeos_error(
        settings: Settings, clients: Clients, token: str) -> None:
    """Creating, validating, starting and estimating spend from the user's request rate, the
    same bucket as the native API's submissions and estimates: past it a 429 with Retry-After,
    as openEO's error object, before the graph is compiled; reading is not limited."""
    with TestClient(create_app(settings.with_(requests_per_minute=3))) as api:
        codes = [api.post(f"{BASE}/jobs", json={"process": monthly_max()}, headers=bearer(token)).status_code
                 for _ in range(2)]
        assert api.post("/api/estimate", json={"region": {"bbox": [-108.0, 35.2, -107.5, 35.8]},
                                               "start": "2022-01-01", "end": "2022-01-31", "products": ["MOD13A1"]},
                        headers={"Authorization": f"Bearer {token}"}).status_code == 200  # the native API's third
        with decided_within(1.0):
            refused = api.post(f"{BASE}/jobs", json={"process": monthly_max()}, headers=bearer(token))
        assert codes == [201, 201] and refused.status_code == 429, refused.text
        body = refused.json()
        assert body["code"] == "TooManyRequests" and "at most 3 a minute" in body["message"], body
        assert body["id"] and body["links"] == [] and 1 <= int(refused.headers["retry-after"]) <= 20
        kept = list(clients.jobs.query_entities("PartitionKey eq @pk", parameters={"pk": store.partition("ana")}))
        assert len(kept) == 2  # the refused one stored nothing
        for method, path in (("POST", "/validation"), ("POST", f"/jobs/{kept[0]['RowKey']}/results"),
                             ("GET", f"/jobs/{kept[0]['RowKey']}/estimate"),
                             ("PATCH", f"/jobs/{kept[0]['RowKey']}")):
            answer = api.request(method, BASE + path, json=monthly_max() if path == "/validation" else {
                "process": monthly_max()}, headers=bearer(token))
            assert answer.status_code == 429 and answer.json()["code"] == "TooManyRequests", (method, path)
        assert api.get(f"{BASE}/jobs", headers=bearer(token)).status_code == 200  # reading is not limited
        other = make_user(clients, "ben")
        assert api.post(f"{BASE}/jobs", json={"process": monthly_max()}, headers=bearer(other)).status_code == 201


def polygon_job(api: TestClient, clients: Clients, token: str, process_id: str, argument: str) -> tuple[str, Any]:
    """A monthly maximum over a box of two 1° tiles through ``process_id`` with a field in
    one of them as its ``argument``, created: the job, and the region its record compiled."""
    field = {"type": "Polygon", "coordinates": [[[-107.9, 35.3], [-107.6, 35.3], [-107.7, 35.7], [-107.9, 35.3]]]}
    wide = monthly_max(spatial_extent={"west": -108.6, "south": 35.2, "east": -107.5, "north": 35.8})
    job = created(api, token, with_node(wide, process_id, {"process_id": process_id, "arguments": {
        "data": {"from_node": "load"}, argument: field}}, "agg"))
    record = store.get(clients, "ana", job)
    assert record is not None
    return job, graph.Compiled.from_json(record.compiled).request.region


def started(api: TestClient, clients: Clients, token: str, job: str) -> tuple[Any, list[dict[str, str]]]:
    """The openEO job started: its run's job row, and the parameters of its planned tile tasks."""
    assert api.post(f"{BASE}/jobs/{job}/results", headers=bearer(token)).status_code == 202
    run = jobs.get(clients, store.get(clients, "ana", job).latest)  # type: ignore[union-attr]
    planned = application.plan(clients.settings, JobRequest.model_validate_json(run.request))
    return run, [p.params for p in planned if p.stage == clients.settings.tile_stage]


def test_a_polygon_is_kept_once_and_its_job_plans_only_the_tiles_it_touches(
        api: TestClient, clients: Clients, token: str) -> None:
    """filter_spatial's polygons are the request's region.geometry: kept as a document under
    its digest when the job is created (its record names the digest), every tile task of a
    start clipped to it, and the target tile of the box it does not touch not planned."""
    job, kept = polygon_job(api, clients, token, "filter_spatial", "geometries")
    assert kept is not None and kept.geometry is None and kept.kept is not None  # the digest and its summary
    assert application.load_vector(clients, kept.kept.ref)["kind"] == "region"
    run, tiles = started(api, clients, token, job)
    assert run.total == 23 + 12  # one 1° tile of the two: 23 dates, a reduction a month
    assert {t["tile"] for t in tiles} == {"x-0108y+0035"} and {t["clip"] for t in tiles} == {kept.kept.ref}
    results = api.get(f"{BASE}/jobs/{job}/results?partial=true", headers=bearer(token)).json()
    assert results["extent"]["spatial"]["bbox"] == [list(kept.kept.bbox)]  # type: ignore[arg-type]
    assert api.delete(f"{BASE}/jobs/{job}/results", headers=bearer(token)).status_code == 204
    clients.tiles.delete_blob(names.vector_blob(kept.kept.ref))  # gone, as the cache's retention may have it
    assert api.post(f"{BASE}/jobs/{job}/results", headers=bearer(token)).status_code == 202  # from the process
    again = jobs.get(clients, store.get(clients, "ana", job).latest)  # type: ignore[union-attr]
    assert again.job != run.job and application.load_vector(clients, kept.kept.ref)["kind"] == "region"
    region = JobRequest.model_validate_json(again.request).region
    assert region is not None and region.kept is not None and region.kept.ref == kept.kept.ref


def circle(radius: float, vertices: int) -> dict[str, Any]:
    """A polygon of ``vertices`` around the box's centre: a field's outline as drawn."""
    ring = [[round(-107.75 + radius * math.cos(2 * math.pi * k / vertices), 7),
             round(35.5 + radius * math.sin(2 * math.pi * k / vertices), 7)] for k in range(vertices)]
    return {"type": "Polygon", "coordinates": [[*ring, ring[0]]]}


def test_a_graph_longer_than_a_table_property_is_kept_in_a_blob_and_runs(
        api: TestClient, clients: Clients, token: str) -> None:
    """A process of more than 30,000 characters (a polygon of 2,000 vertices) is taken: kept
    as a blob of the job's that the record names, read back whole by GET /jobs/{id}, replaced
    by a PATCH (the old blob deleted), started, and its blob deleted with the job."""
    def clipped(radius: float) -> dict[str, Any]:
        return with_node(monthly_max(), "clip", {"process_id": "filter_spatial", "arguments": {
            "data": {"from_node": "load"}, "geometries": circle(radius, 2000)}}, "agg")

    long = clipped(0.2)
    assert len(json.dumps(long)) > 40_000
    assert api.post(f"{BASE}/validation", json=long, headers=bearer(token)).json() == {"errors": []}
    job = created(api, token, long)
    record = store.get(clients, "ana", job)
    assert record is not None and record.process == "" and record.process_blob.startswith(f"openeo/{job}/")
    assert clients.bundles.get_blob_client(record.process_blob).exists()
    assert api.get(f"{BASE}/jobs/{job}", headers=bearer(token)).json()["process"] == long
    longer = clipped(0.25)
    assert api.patch(f"{BASE}/jobs/{job}", json={"process": longer}, headers=bearer(token)).status_code == 204
    assert api.get(f"{BASE}/jobs/{job}", headers=bearer(token)).json()["process"] == longer
    changed = store.get(clients, "ana", job)
    assert changed is not None and changed.process_blob != record.process_blob
    assert not clients.bundles.get_blob_client(record.process_blob).exists()  # the one it replaced: deleted
    assert api.post(f"{BASE}/jobs/{job}/results", headers=bearer(token)).status_code == 202
    run = jobs.get(clients, store.get(clients, "ana", job).latest)  # type: ignore[union-attr]
    region = JobRequest.model_validate_json(run.request).region
    assert region is not None and region.kept is not None and region.kept.count == 1
    assert api.delete(f"{BASE}/jobs/{job}", headers=bearer(token)).status_code == 204
    assert not clients.bundles.get_blob_client(changed.process_blob).exists()


def test_mask_polygon_keeps_the_box_and_plans_all_its_tiles_each_clipped(
        api: TestClient, clients: Clients, token: str) -> None:
    """mask_polygon's polygons mask the box (region.bbox with the kept polygon): both target
    tiles of the box planned, though the polygon touches one, each clipped to the polygon."""
    job, kept = polygon_job(api, clients, token, "mask_polygon", "mask")
    assert kept is not None and kept.kept is not None and kept.bbox == (-108.6, 35.2, -107.5, 35.8)
    run, tiles = started(api, clients, token, job)
    assert run.total == 2 * (23 + 12)  # both 1° tiles: 23 dates, a reduction a month, each
    assert {t["tile"] for t in tiles} == {"x-0108y+0035", "x-0109y+0035"}
    assert {t["clip"] for t in tiles} == {kept.kept.ref}
    results = api.get(f"{BASE}/jobs/{job}/results?partial=true", headers=bearer(token)).json()
    assert results["extent"]["spatial"]["bbox"] == [[-108.6, 35.2, -107.5, 35.8]]  # the box's, not the polygon's
    assert api.delete(f"{BASE}/jobs/{job}/results", headers=bearer(token)).status_code == 204


def test_a_cubes_results_are_every_cube_the_job_made() -> None:
    """With netCDF or Zarr the results are every cube gather's: the result's (its layers' or
    its reduction's) and any other layer's the job made (the layers a reduction reads), never
    the tiles' COGs nor the reductions' GeoTIFFs."""
    def compiled(fmt: str, reduction: str = "") -> graph.Compiled:
        request = graph.compile_graph(monthly_max()).request
        return graph.Compiled(request, {} if reduction else {"MOD13A1": ["500m_16_days_NDVI"]}, reduction, fmt)

    ndvi = {"stage": "cube", "product": "MOD13A1", "layer": "500m_16_days_NDVI", "name": "500m_16_days_NDVI"}
    other = ndvi | {"layer": "500m_16_days_EVI", "name": "500m_16_days_EVI"}
    reduced = {"stage": "cube", "product": "MOD13A1", "layer": "", "name": "max"}
    tile = {"stage": "modis", "product": "MOD13A1"}
    aggregate = {"stage": "aggregate", "product": "MOD13A1"}
    for fmt in ("netCDF", "Zarr"):
        assert routes._is_result(ndvi, compiled(fmt), "x/500m_16_days_NDVI.nc")
        assert routes._is_result(other, compiled(fmt), "x/500m_16_days_EVI.nc")
        assert not routes._is_result(tile, compiled(fmt), "x/MOD13A1.500m_16_days_NDVI.2022-01-01.x-0108y+0035.tif")
        assert routes._is_result(reduced, compiled(fmt, "max"), "x/max.nc")
        assert routes._is_result(ndvi, compiled(fmt, "max"), "x/500m_16_days_NDVI.nc")
        assert not routes._is_result(aggregate, compiled(fmt, "max"), "x/max.MOD13A1.2022-01.x-0108y+0035.tif")
    assert routes._is_result(aggregate, compiled("GTiff", "max"), "x/max.MOD13A1.2022-01.x-0108y+0035.tif")
    assert not routes._is_result(reduced, compiled("GTiff", "max"), "x/max.nc")


FIELDS = {"type": "FeatureCollection", "features": [
    {"type": "Feature", "id": "north", "properties": {}, "geometry": {"type": "Polygon", "coordinates": [
        [[-107.9, 35.3], [-107.6, 35.3], [-107.7, 35.7], [-107.9, 35.3]]]}},
    {"type": "Feature", "id": "south", "properties": {}, "geometry": {"type": "Polygon", "coordinates": [
        [[-107.9, 35.2], [-107.7, 35.2], [-107.7, 35.25], [-107.9, 35.25], [-107.9, 35.2]]]}}]}


def zonal_mean(fmt: str = "CSV") -> dict[str, Any]:
    """A year of MOD13A1 NDVI over a box, its mean per date over two fields, as a table."""
    process = monthly_max()
    nodes = process["process_graph"]
    nodes["agg"] = {"process_id": "aggregate_spatial", "arguments": {
        "data": {"from_node": "load"}, "geometries": FIELDS, "reducer": {"process_graph": {"m": {
            "process_id": "mean", "arguments": {"data": {"from_parameter": "data"}}, "result": True}}}}}
    nodes["save"]["arguments"]["format"] = fmt
    return process


def test_aggregate_spatial_keeps_its_zones_and_plans_zonal_tasks_by_centre_and_a_gather(
        api: TestClient, clients: Clients, token: str) -> None:
    job = created(api, token, zonal_mean())
    record = store.get(clients, "ana", job)
    assert record is not None
    zones = graph.Compiled.from_json(record.compiled).request.zones
    assert zones is not None and zones.features is None and zones.kept is not None and zones.kept.count == 2
    assert application.load_vector(clients, zones.kept.ref)["kind"] == "zones"
    assert api.post(f"{BASE}/jobs/{job}/results", headers=bearer(token)).status_code == 202
    run = jobs.get(clients, store.get(clients, "ana", job).latest)  # type: ignore[union-attr]
    planned = application.plan(clients.settings, JobRequest.model_validate_json(run.request))
    zonal = [p.params for p in planned if p.stage == "zonal"]
    assert zonal and {p["weights"] for p in zonal} == {"centre"} and {p["per"] for p in zonal} == {"date"}
    (gather,) = [p.params for p in planned if p.stage == "zones"]
    assert gather["statistics"] == "mean" and not [p for p in planned if p.stage in ("aggregate", "cube")]


def test_a_tables_results_are_the_zones_gathers_file_of_its_format() -> None:
    request = graph.compile_graph(zonal_mean()).request
    gather = {"stage": "zones"}
    for fmt, mine, other in (("CSV", "x/zones.csv", "x/zones.parquet"), ("Parquet", "x/zones.parquet", "x/zones.csv")):
        compiled = graph.Compiled(request, {}, "", fmt)
        assert routes._is_result(gather, compiled, mine) and not routes._is_result(gather, compiled, other)
        assert not routes._is_result({"stage": "modis", "product": "MOD13A1"}, compiled, "x/a.tif")
        assert not routes._is_result({"stage": "zonal", "product": "MOD13A1"}, compiled, "x/zones.j.t.parquet")
