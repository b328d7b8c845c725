"""Each user's submissions and estimates are limited per minute (BAGPIPE_REQUESTS_PER_MINUTE):
past the limit a 429 with Retry-After; the bucket lives in the users table, so that every API
instance spends from the same one, and concurrent spenders never spend a request twice."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from pipeline.web import ratelimit
from pipeline.web.api import create_app
from tests.conftest import make_user, signed
from tests.test_api import GOOD, changed


def test_past_the_limit_a_user_is_refused_with_retry_after(settings: Settings, clients: Clients) -> None:
    mine = settings.with_(requests_per_minute=3)
    ada, bob = make_user(clients, "ada"), make_user(clients, "bob")
    with TestClient(create_app(mine)) as api:
        assert api.post("/api/estimate", json=GOOD, headers=signed(ada)).status_code == 200
        assert api.post("/api/jobs", json=GOOD, headers=signed(ada)).status_code == 202
        assert api.post("/api/jobs", json=changed(start="2022-13-01"), headers=signed(ada)).status_code == 422
        refused = api.post("/api/estimate", json=GOOD, headers=signed(ada))  # a bad request was one too
        assert refused.status_code == 429, refused.text
        assert 1 <= int(refused.headers["retry-after"]) <= 20 and "at most 3 a minute" in refused.json()["detail"]
        assert api.post("/api/jobs", json=GOOD, headers=signed(ada)).status_code == 429
        assert api.post("/api/estimate", json=GOOD, headers=signed(bob)).status_code == 200  # another user's own
        assert api.get("/api/jobs", headers=signed(ada)).status_code == 200  # reading is not limited


def test_every_api_instance_spends_from_the_same_bucket(settings: Settings, clients: Clients) -> None:
    mine = settings.with_(requests_per_minute=4)
    ada = make_user(clients, "ada")
    with TestClient(create_app(mine)) as first, TestClient(create_app(mine)) as second:
        answers = [api.post("/api/estimate", json=GOOD, headers=signed(ada)).status_code
                   for api in (first, second, first, second, second, first)]
    assert answers == [200, 200, 200, 200, 429, 429]


def test_the_bucket_refills_at_the_rate(settings: Settings) -> None:
    clients = Clients(settings.with_(requests_per_minute=6))  # one every 10 s, six at once
    clients.ensure_resources()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert [ratelimit.spend(clients, "ada", start) for _ in range(6)] == [0.0] * 6
    assert ratelimit.spend(clients, "ada", start) == pytest.approx(10.0)
    assert ratelimit.spend(clients, "ada", start + timedelta(seconds=4)) == pytest.approx(6.0)
    assert ratelimit.spend(clients, "ada", start + timedelta(seconds=10)) == 0.0
    assert ratelimit.spend(clients, "ada", start + timedelta(seconds=11)) > 0
    later = start + timedelta(hours=1)  # a full bucket, never more
    assert [ratelimit.spend(clients, "ada", later) for _ in range(7)].count(0.0) == 6
    assert ratelimit.spend(clients, "ada", start) > 0  # a clock behind the row's refills nothing


def test_concurrent_spenders_spend_each_request_once(settings: Settings) -> None:
    clients = Clients(settings.with_(requests_per_minute=5))
    clients.ensure_resources()
    at = datetime(2026, 1, 1, tzinfo=UTC)
    answers: list[float] = []
    go = threading.Barrier(10)

    def one() -> None:
        mine = Clients(clients.settings)  # an instance of its own
        go.wait()
        answers.append(ratelimit.spend(mine, "ada", at))

    threads = [threading.Thread(target=one) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers.count(0.0) == 5, answers
    assert ratelimit.spend(clients, "ada", at) > 0


def test_no_limit_writes_nothing(settings: Settings, clients: Clients) -> None:
    unlimited = Clients(settings.with_(requests_per_minute=0))
    assert all(ratelimit.spend(unlimited, "ada") == 0.0 for _ in range(100))
    assert not list(clients.users.query_entities("PartitionKey eq 'rate'"))
