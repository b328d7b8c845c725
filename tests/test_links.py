"""Download links in Azure are signed with a user delegation key: one key serves every link
of a request, and later requests, until it nears its expiry."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from azure.core.credentials import AccessToken
from azure.storage.blob import BlobServiceClient, UserDelegationKey

from pipeline.lifecycle import results
from pipeline.storage.clients import Clients


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
