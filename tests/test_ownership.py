"""Two scientists on one deployment: neither can list, view, download, cancel or read the logs
of the other's jobs — another's job is answered exactly as one that does not exist — nor run
the other's private reducers; what one shares, the other may run; an admin sees and may do
all of it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from bagpipe.manage import pack
from pipeline.lifecycle import jobs
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from pipeline.web.api import create_app
from tests.conftest import make_user, running_control, running_workers, signed, small_request, wait_for
from tests.test_bundles import GZIP, python_reducer

JOB_ROUTES = [("GET", "/api/jobs/{}"), ("GET", "/api/jobs/{}/view"), ("GET", "/api/jobs/{}/results"),
              ("GET", "/api/jobs/{}/quicklooks"), ("POST", "/api/jobs/{}/cancel")]


@pytest.fixture
def api(settings: Settings, clients: Clients) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        yield client


def submit(api: TestClient, token: str, **changes: object) -> str:
    response = api.post("/api/jobs", json=json.loads(small_request(**changes).model_dump_json()),
                        headers=signed(token))
    assert response.status_code == 202, response.text
    return response.json()["job"]


def test_neither_scientist_sees_or_touches_the_other_s_jobs_and_an_admin_does(
    api: TestClient, settings: Settings, clients: Clients, admin_token: str
) -> None:
    alice, bob = make_user(clients, "alice"), make_user(clients, "bob")
    mine = submit(api, alice, label="alice's")
    theirs = submit(api, bob, label="bob's")
    running = submit(api, bob, start="2021-01-01", end="2021-12-31", label="bob's long one")
    with running_control(settings), running_workers(settings, 1, slots=2):
        for job in (mine, theirs):
            wait_for(lambda job=job: jobs.get(clients, job).state == "SUCCEEDED", 120, "the job")

    assert [j["job"] for j in api.get("/api/jobs", headers=signed(alice)).json()] == [mine]
    assert {j["job"] for j in api.get("/api/jobs", headers=signed(bob)).json()} == {theirs, running}
    everyone = api.get("/api/jobs?all=true", headers=signed(admin_token)).json()
    assert {j["job"] for j in everyone} == {mine, theirs, running}
    assert {j["owner"] for j in everyone} == {"alice", "bob"}
    assert api.get("/api/jobs", headers=signed(admin_token)).json() == []  # an admin's own list is theirs

    for method, path in JOB_ROUTES:
        nowhere = api.request(method, path.format("jnosuchjob"), headers=signed(alice))
        for job in (theirs, running):
            refused = api.request(method, path.format(job), headers=signed(alice))
            # the same answer as for a job that does not exist: nothing discloses it
            assert refused.status_code == nowhere.status_code == 404, (method, path)
            assert refused.json() == {"detail": f"no job {job!r}"}
            assert nowhere.json() == {"detail": "no job 'jnosuchjob'"}
    # the owner and an admin see results with their download links (and logs through the view)
    for token in (bob, admin_token):
        results = api.get(f"/api/jobs/{theirs}/results", headers=signed(token))
        assert results.status_code == 200 and results.json()["manifest_url"].startswith("http")
        assert api.get(f"/api/jobs/{theirs}/view", headers=signed(token)).status_code == 200
    assert jobs.get(clients, running).state not in ("CANCELLING", "CANCELLED")  # alice's cancel did nothing
    assert api.post(f"/api/jobs/{running}/cancel", headers=signed(admin_token)).status_code == 202
    assert jobs.get(clients, running).state in ("CANCELLING", "CANCELLED")


def test_a_private_reducer_is_its_owner_s_until_shared(
    api: TestClient, clients: Clients, admin_token: str, tmp_path: Path
) -> None:
    alice, bob, carol = make_user(clients, "alice"), make_user(clients, "bob"), make_user(clients, "carol")
    pushed = api.post("/api/reducers", content=pack(python_reducer(tmp_path / "mean")), headers=signed(alice) | GZIP)
    assert pushed.status_code == 201
    with_reducer = {"reducer": {"name": "alice/mean"}}
    for ref in ("alice/mean", "mean", "alice/mean@1"):
        refused = api.post("/api/jobs", json=json.loads(small_request().model_dump_json()) | {"reducer": {"name": ref}},
                           headers=signed(bob))
        assert refused.status_code == 400 and refused.json()["field"] == "reducer.name", ref
    assert api.get("/api/reducers/alice/mean", headers=signed(bob)).status_code == 404
    assert api.get("/api/reducers", headers=signed(bob)).json()["shared"] == []
    assert api.post("/api/reducers/alice/mean/share", json={"users": ["bob"]}, headers=signed(bob)).status_code == 404
    assert api.delete("/api/reducers/alice/mean", headers=signed(bob)).status_code == 404
    # an admin may run anyone's
    assert submit_with(api, admin_token, with_reducer) == 202

    assert api.post("/api/reducers/alice/mean/share", json={"users": ["bob"]}, headers=signed(alice)).status_code == 200
    assert submit_with(api, bob, with_reducer) == 202
    assert [r["ref"] for r in api.get("/api/reducers", headers=signed(bob)).json()["shared"]] == ["alice/mean@1"]
    assert submit_with(api, carol, with_reducer) == 400  # shared with bob, not with carol
    # bob may run it, not change it
    assert api.post("/api/reducers/alice/mean/share", json={"everyone": True}, headers=signed(bob)).status_code == 403
    assert api.delete("/api/reducers/alice/mean", headers=signed(bob)).status_code == 403
    assert api.post("/api/reducers/alice/mean/share", json={"everyone": True}, headers=signed(alice)).status_code == 200
    assert submit_with(api, carol, with_reducer) == 202
    # alice sees which jobs ran each version: her own by id, the others' as a count
    shown = api.get("/api/reducers/alice/mean", headers=signed(alice)).json()["versions"][0]
    assert shown["jobs"] == [] and shown["other_jobs"] == 3
    assert api.get("/api/reducers/alice/mean", headers=signed(bob)).json()["sharing"] is None
    # taken back: no one else may start a job with it again
    assert api.post("/api/reducers/alice/mean/share", json={}, headers=signed(alice)).status_code == 200
    assert submit_with(api, bob, with_reducer) == 400 and submit_with(api, carol, with_reducer) == 400


def submit_with(api: TestClient, token: str, changes: dict[str, object]) -> int:
    body = json.loads(small_request().model_dump_json()) | changes
    return api.post("/api/jobs", json=body, headers=signed(token)).status_code
