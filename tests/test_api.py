"""The request API against a real Azurite: validation, auth, and that a refused request
writes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bagpipe.azurite import ACCOUNT, ACCOUNT_KEY
from bagpipe.serving import free_port
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web.api import MAX_VECTOR_BYTES, create_app
from tests.conftest import signed

GOOD: dict[str, Any] = {
    "region": {"tiles": ["h09v05"]},
    "start": "2022-01-01",
    "end": "2022-01-31",
    "products": ["MOD10A2"],
    "email": "scientist@example.org",
}


def changed(**fields: Any) -> dict[str, Any]:
    return {**GOOD, **fields}


def without(field: str) -> dict[str, Any]:
    return {k: v for k, v in GOOD.items() if k != field}


@pytest.fixture
def api(settings: Settings, clients: Clients, admin_token: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings), headers=signed(admin_token)) as client:
        yield client


def nothing_written(clients: Clients) -> bool:
    return (
        not list(clients.jobs.list_entities())
        and not [r for r in clients.audit.list_entities() if r["What"] == "job.submit"]
        and not list(clients.tasks.list_entities())
        and clients.plan_queue.get_queue_properties().approximate_message_count == 0
    )


BAD_REQUESTS = [
    # (what, body, status, field the message must name)
    ("products not a list", changed(products="MOD10A2"), 422, "products"),
    ("unknown product", changed(products=["MOD99Q9"]), 400, "products"),
    ("product named twice", changed(products=["MOD10A2", "MOD10A2"]), 400, "products"),
    ("empty product list", changed(products=[]), 422, "products"),
    ("inverted dates", changed(start="2022-03-01", end="2022-01-01"), 400, "end"),
    ("impossible date", changed(start="2022-13-01"), 422, "start"),
    ("date before MODIS", changed(start="1999-12-31"), 422, "start"),
    ("date as a number", changed(end=20220131), 422, "end"),
    ("latitude out of range", changed(region={"bbox": [-110, 30, -100, 95]}), 422, "region.bbox"),
    ("empty box", changed(region={"bbox": [-110, 30, -110, 40]}), 400, "region.bbox"),
    ("box with three numbers", changed(region={"bbox": [-110, 30, -100]}), 422, "region.bbox"),
    ("box with a boolean", changed(region={"bbox": [True, 34, -108, 37]}), 422, "region.bbox"),
    ("resolution as a boolean", changed(grid={"resolution": True}), 422, "grid.resolution"),
    ("bbox and tiles", changed(region={"bbox": [0, 0, 1, 1], "tiles": ["h09v05"]}), 422, "region"),
    ("malformed tile", changed(region={"tiles": ["h9v5"]}), 422, "region.tiles"),
    ("tile off the grid", changed(region={"tiles": ["h40v05"]}), 422, "region.tiles"),
    ("missing region", without("region"), 422, "region"),
    ("huge request", changed(region={"bbox": [-180, -90, 180, 90]}, start="2000-01-01",
                             end="2020-12-31"), 413, "region"),
    ("unknown reducer", changed(reducer={"name": "rm -rf /"}), 400, "reducer.name"),
    ("injection in a product", changed(products=["MOD10A2' or PartitionKey ne '"]), 400, "products"),
    ("unknown field", changed(admin=True), 422, "admin"),
    ("bad email", changed(email="not-an-email"), 422, "email"),
    ("label too long", changed(label="x" * 5000), 422, "label"),
    ("label with a line break", changed(label="winter\r\nBcc: everyone@example.org"), 422, "label"),
    ("label with a control character", changed(label="snow\x1b[31m"), 422, "label"),
    ("reducer args nested", changed(reducer={"name": "x", "args": {"a": {"b": 1}}}), 422, "reducer.args.a"),
]


@pytest.mark.parametrize("what,body,status,field", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_request_is_refused_naming_the_field(
    api: TestClient, clients: Clients, what: str, body: dict[str, Any], status: int, field: str
) -> None:
    response = api.post("/api/jobs", json=body)
    assert response.status_code == status, response.text
    answer = response.json()
    assert answer["detail"], "a refusal carries a message"
    assert answer["field"].startswith(field), answer
    assert nothing_written(clients)


def test_request_that_is_not_json_is_422(api: TestClient, clients: Clients) -> None:
    response = api.post("/api/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["field"] == "body" and "at character 1" in response.json()["detail"], response.json()
    assert nothing_written(clients)


def test_an_empty_region_asks_for_one_and_an_unknown_job_is_named_short(api: TestClient, clients: Clients) -> None:
    response = api.post("/api/jobs", json=changed(region={}))
    assert response.status_code == 422 and response.json()["field"] == "region", response.text
    assert "give bbox" in response.json()["detail"] and "not both" not in response.json()["detail"]
    response = api.get("/api/jobs/" + "j" * 5000)  # not echoed back whole
    assert response.status_code == 404 and len(response.json()["detail"]) < 100, response.text
    assert nothing_written(clients)


def test_nan_in_a_box_is_422(api: TestClient, clients: Clients) -> None:
    body = json.dumps(changed(region={"bbox": [0, 0, 1, 1]})).replace("[0, 0, 1, 1]", "[0, 0, NaN, 1]")
    response = api.post("/api/jobs", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["field"].startswith("region.bbox")
    assert nothing_written(clients)


def test_oversized_body_is_413(api: TestClient, clients: Clients) -> None:
    # a submission may carry its sites or zones inline, up to MAX_VECTOR_BYTES
    body = json.dumps(changed(label="x" * 100)) + " " * (MAX_VECTOR_BYTES + 1)
    response = api.post("/api/jobs", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert "larger than" in response.json()["detail"]
    assert nothing_written(clients)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("path", ["/api/estimate", "/api/jobs"])
def test_a_world_of_tiny_tiles_is_counted_not_made(api: TestClient, clients: Clients, path: str) -> None:
    """A world box cut into 0.001° tiles would be 6.5e10 target tiles: the answer is the count
    and a 413, at once, with nothing allocated for them (a list of them would take terabytes)."""
    response = api.post(path, json=changed(region={"bbox": [-180, -90, 180, 90]},
                                           grid={"tile_size": 0.001, "resolution": 0.001}))
    assert response.status_code == 413, response.text
    assert response.json()["tasks"] == 360_000 * 180_000 * 4
    assert nothing_written(clients)


def test_huge_request_says_how_many_tasks(api: TestClient, settings: Settings) -> None:
    response = api.post("/api/estimate", json=changed(start="2000-01-01", end="2030-12-31",
                                                      region={"tiles": ["h09v05", "h10v05"]}))
    assert response.status_code == 413
    assert response.json()["tasks"] == 2 * 46 * 31
    assert response.json()["limit"] == settings.max_tasks


def test_good_request_is_accepted_and_stored(api: TestClient, clients: Clients) -> None:
    estimate = api.post("/api/estimate", json=GOOD).json()
    response = api.post("/api/jobs", json=GOOD)
    assert response.status_code == 202
    created = response.json()
    assert created["total"] == estimate["tasks"] == 4
    assert created["state"] == "ACCEPTED"
    row = clients.jobs.get_entity(created["job"], names.JOB_ROW)
    assert json.loads(row["Request"])["products"] == ["MOD10A2"]
    assert clients.plan_queue.get_queue_properties().approximate_message_count == 1
    listed = api.get("/api/jobs").json()
    assert [j["job"] for j in listed] == [created["job"]]
    status = api.get(f"/api/jobs/{created['job']}").json()
    assert status["state"] == "ACCEPTED" and status["total"] == 4
    assert api.get(f"/api/jobs/{created['job']}/results").status_code == 409


@pytest.mark.parametrize("method,path", [
    ("GET", "/api/jobs/jnope"), ("POST", "/api/jobs/jnope/cancel"), ("GET", "/api/jobs/jnope/results"),
    ("GET", "/api/jobs/jnope/view"), ("GET", "/api/jobs/jnope/quicklooks"), ("GET", "/api/jobs/j%20x%27/view"),
])
def test_every_job_route_says_which_job_it_does_not_know(api: TestClient, method: str, path: str) -> None:
    response = api.request(method, path)
    assert response.status_code == 404
    assert response.json()["detail"] in ("no job 'jnope'", 'no job "j x\'"')


ENDPOINTS = [
    ("POST", "/api/jobs", GOOD),
    ("POST", "/api/estimate", GOOD),
    ("GET", "/api/jobs", None),
    ("GET", "/api/jobs/j1", None),
    ("POST", "/api/jobs/j1/cancel", None),
    ("GET", "/api/jobs/j1/results", None),
]


@pytest.mark.parametrize("method,path,body", ENDPOINTS, ids=[f"{m} {p}" for m, p, _ in ENDPOINTS])
def test_every_endpoint_requires_a_token(settings: Settings, clients: Clients, admin_token: str, method: str,
                                         path: str, body: Any) -> None:
    forged = admin_token[:-4] + ("aaaa" if not admin_token.endswith("aaaa") else "bbbb")
    with TestClient(create_app(settings)) as bare:
        for headers in ({}, signed("wrong"), signed(forged), {"Authorization": "Bearer wrong"},
                        {"Authorization": f"Basic {admin_token}"}, {"x-functions-key": admin_token}):
            response = bare.request(method, path, json=body, headers=headers)
            assert response.status_code == 401, (headers, response.text)
            assert response.json()["detail"]
        for good in (signed(admin_token), {"Authorization": f"Bearer {admin_token}"}):
            assert bare.request(method, path, json=body, headers=good).status_code != 401
    assert nothing_written(clients) or (method == "POST" and path == "/api/jobs")


def test_openapi_is_served_and_names_the_token(api: TestClient) -> None:
    spec = api.get("/api/openapi.json").json()
    assert "/api/jobs" in spec["paths"] and "/api/jobs/{job_id}/results" in spec["paths"]
    schemes = spec["components"]["securitySchemes"]
    assert any(s.get("name") == names.TOKEN_HEADER for s in schemes.values())
    assert any(s.get("scheme") == "bearer" for s in schemes.values())


def test_storage_out_of_reach_is_a_503_with_retry_after(settings: Settings) -> None:
    dead = free_port()  # nothing listens there
    unreachable = settings.with_(storage_connection=(
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
        + "".join(f"{s}Endpoint=http://127.0.0.1:{dead}/{ACCOUNT};" for s in ("Blob", "Queue", "Table"))))
    with TestClient(create_app(unreachable), headers=signed("bgp_0123456789abcdef_" + "x" * 43)) as client:
        response = client.get("/api/jobs")
    assert response.status_code == 503 and response.headers["retry-after"] == "5"
    assert "storage is unavailable" in response.json()["detail"]
