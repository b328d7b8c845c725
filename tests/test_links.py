"""Download links: in Azure they are signed with a user delegation key, one key serving every
link of a request, and later requests, until it nears its expiry; and every link bagpipe
makes downloads what it names, whatever characters the blob's name holds."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import pytest
from azure.core.credentials import AccessToken
from azure.storage.blob import BlobServiceClient, UserDelegationKey
from fastapi.testclient import TestClient

from bagpipe.mailserver import MailServer
from bagpipe.planetary import Planetary
from pipeline.lifecycle import jobs, results, tasks
from pipeline.requests import application
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from pipeline.web.api import create_app
from tests.conftest import make_user, on_stac, running_control, running_workers, signed, wait_for


class EntraToken:
    """A Microsoft Entra credential, as the managed identity's (never asked here)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        raise AssertionError("no storage request is made with it")


class DelegatingService(BlobServiceClient):
    """An account without shared keys, as bagpipe's in Azure. Azurite hands user delegation
    keys to OAuth sign-ins only, so the key is made here as the service makes it (its
    times are the ones asked for); every ask is counted."""

    asked: list[tuple[datetime, datetime]]

    def get_user_delegation_key(self, key_start_time: datetime, key_expiry_time: datetime,
                                **kwargs: Any) -> UserDelegationKey:
        self.asked.append((key_start_time, key_expiry_time))
        key = UserDelegationKey()
        key.signed_oid, key.signed_tid = "00000000-0000-0000-0000-000000000001", "tenant"
        key.signed_start = key_start_time.strftime("%Y-%m-%dT%H:%M:%SZ")
        key.signed_expiry = key_expiry_time.strftime("%Y-%m-%dT%H:%M:%SZ")
        key.signed_service, key.signed_version, key.value = "b", "2021-08-06", "a2V5LXZhbHVlLWtleS12YWx1ZQ=="
        return key


def delegating(clients: Clients) -> DelegatingService:
    service = DelegatingService("https://bagpipe.blob.core.windows.net", credential=EntraToken())
    service.asked = []
    clients.__dict__["blob_service"] = service
    return service


def manifest(outputs: int) -> dict[str, Any]:
    return {"tasks": [{"outputs": [f"j/tasks/{i:09d}/a001/out.tif"]} for i in range(outputs)], "packed": {}}


def test_one_key_signs_every_link_of_a_request_and_the_next(clients: Clients) -> None:
    service = delegating(clients)
    found = results.with_links(clients, "j", manifest(50))
    assert len(service.asked) == 1
    link = found["tasks"][7]["links"]["j/tasks/000000007/a001/out.tif"]
    query = parse_qs(urlsplit(link).query)
    assert query["skoid"] == ["00000000-0000-0000-0000-000000000001"] and query["sp"] == ["r"] and query["sig"]
    results.with_links(clients, "j", manifest(50))
    assert len(service.asked) == 1  # still valid past the new links' expiry


def test_a_key_that_would_expire_before_a_link_is_renewed(clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "KEY_HOURS", 2 / 3600)  # a key outlasts its first link by two seconds
    service = delegating(clients)
    results.with_links(clients, "j", manifest(3))
    assert len(service.asked) == 1
    time.sleep(2.5)
    results.with_links(clients, "j", manifest(3))  # these links would outlast it
    assert len(service.asked) == 2
    (_, first), (_, second) = service.asked
    assert second > first


ODD = "a b#?%é.tif"  # a name a reduction may give its output: every link to it must still download it


def odd_reducer(folder: Path) -> Path:
    """A reducer whose output is its first input, named :data:`ODD`."""
    here = folder / "odd_names"
    here.mkdir(parents=True)
    (here / "reducer.json").write_text(json.dumps({
        "name": "odd_names", "description": "names its output oddly",
        "argv": ["{python}", "{here}/odd.py", "{task}"], "outputs": ["*.tif"]}))
    (here / "odd.py").write_text("import json, shutil, sys\ntask = json.load(open(sys.argv[1]))\n"
                                 f"shutil.copy(task['inputs'][0], task['outputs_dir'] + '/' + {ODD!r})\n")
    return folder


def downloaded(link: str) -> bytes:
    response = httpx.get(link, timeout=30)
    assert response.status_code == 200, (link, response.status_code, response.text[:300])
    return response.content


def test_every_link_to_an_output_with_an_odd_name_downloads_it(settings: Settings, planetary: Planetary,
                                                                 mail: MailServer, tmp_path: Path) -> None:
    """The results' links, the manifest's, the overviews', the STAC API's assets, the
    portal's quick-looks and the email's all download from Azurite what they name, the
    reduction's output named ``a b#?%é.tif`` (its overview named after it)."""
    mine = on_stac(settings, planetary, reducers_path=str(odd_reducer(tmp_path)))
    clients = Clients(mine)
    clients.ensure_resources()
    request = JobRequest.model_validate({
        "region": {"bbox": [-108.0, 35.2, -107.5, 35.8]}, "grid": {"tile_size": 1.0, "resolution": 0.01},
        "start": "2022-02-02", "end": "2022-02-09", "products": ["MOD10A2"], "reducer": {"name": "odd_names"},
        "email": "admin@example.org"})
    job = application.submit(clients, request).job
    with running_control(mine), running_workers(mine, 1, slots=2):
        wait_for(lambda: jobs.get(clients, job).state in ("SUCCEEDED", "FAILED"), 180, "the job")
    (reduction,) = [r for r in tasks.list_tasks(clients.tasks, jobs.get(clients, job).parts) if r.stage == "reduce"]
    (output,) = reduction.output_names()
    assert output.endswith("/" + ODD), output
    made = clients.products.download_blob(output).readall()
    token = make_user(clients, "admin", "admin")
    seen: dict[str, list[str]] = {}
    with TestClient(create_app(mine), headers=signed(token)) as api:
        found = api.get(f"/api/jobs/{job}/results").json()
        (links,) = [t["links"] for t in found["tasks"] if output in t["links"]]
        assert downloaded(links[output]) == made
        seen["results"] = [link for t in found["tasks"] for link in t["links"].values()]
        seen["manifest"] = [found["manifest_url"]]
        seen["overviews"] = [link for image in found["overviews"] for link in image["links"].values()]
        items = api.get(f"/api/stac/collections/{job}/items").json()["features"]
        seen["stac"] = [asset["href"] for item in items for asset in item["assets"].values()]
        looks = api.get(f"/api/jobs/{job}/quicklooks").json()  # the portal's: the map's and the pictures'
        seen["quicklooks"] = [q[key] for q in looks for key in ("url", "picture") if key in q]
    (message,) = wait_for(lambda: [m for _, m in mail.messages() if job in str(m["Subject"])], 30, "the email")
    seen["email"] = re.findall(r"https?://\S+", message.get_body(("plain",)).get_content())
    odd = quote(ODD.removesuffix(".tif"))
    for where, links in seen.items():
        assert links, where
        assert where in ("manifest", "results") or any(odd in link for link in links), (where, links)
        for link in links:
            assert downloaded(link), (where, link)
    (stac,) = [link for link in seen["stac"] if quote(ODD) in link]
    assert downloaded(stac) == made
