"""Cost, for the user: a request's estimate before it is submitted (its tasks, their compute
time from the runtime history, the price), the measured figures once its job has finished
(status and email), and the retention rule's arithmetic and its input (a cache hit is a
read, which storage records as an access)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from azure.storage.blob import ContainerClient
from fastapi.testclient import TestClient

from bagpipe.mailserver import MailServer
from pipeline.lifecycle import attempts, costs, jobs, runtimes
from pipeline.requests import application
from pipeline.requests.expansion import expand
from pipeline.settings import Settings
from pipeline.storage import cache, names
from pipeline.storage.clients import Clients
from pipeline.web.api import create_app
from tests.conftest import parts, running_control, running_workers, signed, small_request, wait_for, with_stage


def test_an_estimate_has_no_compute_figure_until_the_history_is_trusted_then_history_times_work(
        settings: Settings, clients: Clients, admin_token: str) -> None:
    request = small_request()
    specs = expand(request, settings.max_tasks, settings.tile_stage)  # the stage the deployment runs
    body = request.model_dump(mode="json", exclude_none=True)
    with TestClient(create_app(settings), headers=signed(admin_token)) as api:
        cold = api.post("/api/estimate", json=body).json()
        assert cold["tasks"] == len(specs) == 8 and cold["known"] is False and cold["compute_s"] == 0
        assert cold["usd"] == pytest.approx(8 * costs.STORAGE_CALLS_PER_TASK * costs.STORAGE_USD_PER_CALL, abs=1e-4)
        key = specs[0].history()
        runtimes.merge(clients.runtimes, specs[0].stage, key,
                       runtimes.Runtime(settings.min_samples, 2.5, 0.0))  # 2.5 s per unit of work
        warm = api.post("/api/estimate", json=body).json()
    work = sum(spec.work() for spec in specs)
    assert warm["known"] is True and warm["compute_s"] == pytest.approx(2.5 * work, rel=1e-3)
    assert warm["usd"] == pytest.approx(costs.usd(2.5 * work, 8), abs=1e-4) and warm["usd"] > cold["usd"]
    assert warm["prices"] == costs.PRICE_LIST


def test_a_finished_job_reports_the_compute_it_used_in_its_status_and_email(
        settings: Settings, clients: Clients, mail: MailServer) -> None:
    settings = with_stage(settings, "slow")  # 0.2 s a task
    job = application.submit(clients, small_request()).job
    with running_control(settings), running_workers(settings):
        wait_for(lambda: jobs.get(clients, job).state == "SUCCEEDED", 120, "the job")
    ran = [float(a.runtime_s) for a in attempts.list_attempts(clients.tasks, parts(clients, job))
           if a.runtime_s is not None]
    assert len(ran) >= 8 and sum(ran) > 0
    found = jobs.status(clients, job)["cost"]
    assert found["compute_s"] == pytest.approx(sum(ran), abs=0.1)
    assert found["usd"] == pytest.approx(costs.usd(sum(ran), 8), abs=1e-4)
    (email,) = wait_for(lambda: [m for _, m in mail.messages() if job in str(m["Subject"])], 30, "the email")
    text = email.get_body().get_content()  # type: ignore[union-attr]
    assert f"{sum(ran) / 3600:.2f} slot-hours over {len(ran)} attempts" in text
    assert f"about {costs.dollars(found['usd'])} at" in text and costs.dollars(0.0031) == "$0.0031"


def test_a_blob_is_kept_until_storing_it_has_cost_one_remake() -> None:
    days = costs.keep_days(4_000, 0.3)
    stored = 4_000 / 1e9 * costs.PRICES["blob_gb_month"].value / costs.DAYS_PER_MONTH * days
    assert stored == pytest.approx(0.3 * costs.SLOT_USD_PER_S)
    assert costs.keep_days(8_000, 0.3) == pytest.approx(days / 2)  # twice the size: half as long
    assert costs.keep_days(4_000, 0.6) == pytest.approx(days * 2)  # twice as dear to make: twice as long
    # what the deployment deploys is that rule on the measured typical blobs
    deployed = {entry["container"]: entry["days"] for entry in _names_json()["cacheRetention"]}
    assert deployed == {c: max(1, round(costs.keep_days(*costs.CACHED[c]))) for c in names.CACHE_CONTAINERS}
    assert deployed[names.SOURCES_CONTAINER] < deployed[names.TILES_CONTAINER]


def test_a_cache_hit_reads_the_blob_so_storage_records_its_use(settings: Settings, clients: Clients) -> None:
    data = b"a reprojected tile" * 100
    clients.transfers.upload(clients.tiles, "00/k/tile.tif", data, "image/tiff")
    seen: list[tuple[str, str]] = []

    def hook(request: Any) -> None:
        seen.append((request.http_request.method, request.http_request.headers.get("x-ms-range", "")))

    container = ContainerClient.from_connection_string(settings.storage_connection, clients.tiles.container_name,
                                                       raw_request_hook=hook)
    found = cache.ensure(clients.transfers, container, "00/k/tile.tif", lambda: b"never", "image/tiff",
                         want_data=False)
    assert not found.made and found.md5 == hashlib.md5(data).digest()
    assert seen == [("GET", "bytes=0-0")]  # a Get Blob of one byte: an access (a HEAD is not)


def _names_json() -> dict[str, Any]:
    import json
    from pathlib import Path

    return dict(json.loads((Path(__file__).resolve().parents[1] / "infra/bicep/names.json").read_text()))
