"""A user's jobs mail only addresses that agreed to it: their own, those confirmed by the link
bagpipe mails them, those an admin allows and the deployment's BAGPIPE_MAIL_ALLOWED; a
request naming any other is refused with a 403 naming ``email``, at submission and estimate.
The label stays out of the subject."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

from bagpipe.mailserver import MailServer
from pipeline.lifecycle import jobs
from pipeline.lifecycle.tasks import now
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from pipeline.web import addresses
from pipeline.web.api import create_app
from tests.conftest import make_user, running_control, running_workers, signed, wait_for
from tests.test_api import GOOD, changed, nothing_written

COLLEAGUE = "colleague@uni.example"


@pytest.fixture
def strict(settings: Settings) -> Settings:
    """A deployment that allows no address by itself (the tests' default allows example.org)."""
    return settings.with_(mail_allowed="")


@pytest.fixture
def api(strict: Settings, clients: Clients) -> Iterator[TestClient]:
    with TestClient(create_app(strict)) as client:
        yield client


def links_in(mail: MailServer, address: str) -> list[str]:
    return [link for _, m in mail.messages() if m["To"] == address
            for link in re.findall(r"https?://\S+", m.get_body(("plain",)).get_content())]


def opened(api: TestClient, link: str) -> int:
    """Open a mailed link as its recipient does: no sign-in."""
    parts = urlsplit(link)
    return api.get(f"{parts.path}?{parts.query}").status_code


@pytest.mark.parametrize("path", ["/api/jobs", "/api/estimate"])
def test_an_address_that_did_not_agree_is_refused_naming_email(api: TestClient, clients: Clients, path: str) -> None:
    ada = make_user(clients, "ada")
    refused = api.post(path, json=changed(email=COLLEAGUE), headers=signed(ada))
    assert refused.status_code == 403 and refused.json()["field"] == "email", refused.text
    assert "POST /api/addresses" in refused.json()["detail"] and "ada@example.org" in refused.json()["detail"]
    assert nothing_written(clients)
    for email in ("ada@example.org", "Ada@Example.ORG", None):  # their own, as they spell it; or none
        body = changed(email=email) if email else {k: v for k, v in GOOD.items() if k != "email"}
        assert api.post(path, json=body, headers=signed(ada)).status_code < 300


def test_an_address_confirmed_by_its_link_may_be_mailed(api: TestClient, clients: Clients, mail: MailServer) -> None:
    ada = make_user(clients, "ada")
    asked = api.post("/api/addresses", json={"address": COLLEAGUE}, headers=signed(ada))
    assert asked.status_code == 202 and asked.json()["confirmed"] is False, asked.text
    (message,) = [m for _, m in mail.messages() if m["To"] == COLLEAGUE]
    assert message["Subject"] == "bagpipe: may we send you a user's job notifications?"  # fixed text, no user's
    (link,) = links_in(mail, COLLEAGUE)
    assert api.post("/api/jobs", json=changed(email=COLLEAGUE), headers=signed(ada)).status_code == 403
    listed = api.get("/api/addresses", headers=signed(ada)).json()
    assert [(a["address"], a["confirmed"]) for a in listed] == [("ada@example.org", True), (COLLEAGUE, False)]
    assert opened(api, link + "x") == 404  # a forged token
    assert opened(api, link) == 200
    assert opened(api, link) == 404  # used
    accepted = api.post("/api/jobs", json=changed(email=COLLEAGUE), headers=signed(ada))
    assert accepted.status_code == 202, accepted.text
    assert jobs.get(clients, accepted.json()["job"]).email == COLLEAGUE
    bob = make_user(clients, "bob")  # ada's confirmation is hers
    assert api.post("/api/jobs", json=changed(email=COLLEAGUE), headers=signed(bob)).status_code == 403


def test_an_expired_link_confirms_nothing(api: TestClient, clients: Clients, mail: MailServer) -> None:
    ada = make_user(clients, "ada")
    api.post("/api/addresses", json={"address": COLLEAGUE}, headers=signed(ada))
    (link,) = links_in(mail, COLLEAGUE)
    token_id = link.rsplit("token=", 1)[1].split("_")[0]
    clients.users.update_entity({"PartitionKey": addresses.CONFIRM, "RowKey": token_id,
                                 "ExpiresAt": now() - timedelta(seconds=1)})
    assert opened(api, link) == 404
    assert api.post("/api/jobs", json=changed(email=COLLEAGUE), headers=signed(ada)).status_code == 403


def test_an_admin_allows_an_address_for_a_user_at_once(api: TestClient, clients: Clients, mail: MailServer) -> None:
    ada, admin = make_user(clients, "ada"), make_user(clients, "root", "admin")
    refused = api.post("/api/addresses", json={"address": COLLEAGUE, "user": "root"}, headers=signed(ada))
    assert refused.status_code == 403 and refused.json()["field"] == "user"
    allowed = api.post("/api/addresses", json={"address": COLLEAGUE, "user": "ada"}, headers=signed(admin))
    assert allowed.status_code == 202 and allowed.json()["confirmed"] is True
    assert not mail.messages()  # no link: the admin vouches for it
    assert api.post("/api/jobs", json=changed(email=COLLEAGUE), headers=signed(ada)).status_code == 202


def test_a_user_has_at_most_a_few_addresses_waiting(api: TestClient, clients: Clients, mail: MailServer) -> None:
    ada = make_user(clients, "ada")
    for n in range(addresses.PENDING):
        assert api.post("/api/addresses", json={"address": f"c{n}@uni.example"}, headers=signed(ada)).status_code == 202
    refused = api.post("/api/addresses", json={"address": "one-more@uni.example"}, headers=signed(ada))
    assert refused.status_code == 409 and refused.json()["field"] == "address"
    assert len(mail.messages()) == addresses.PENDING


@pytest.mark.parametrize("allowed,address,ok", [
    ("@uni.example", COLLEAGUE, True), ("@uni.example", "someone@elsewhere.example", False),
    ("colleague@uni.example, @lab.example", COLLEAGUE, True), ("*", "anyone@anywhere.example", True),
])
def test_the_deployment_allows_addresses_and_domains(settings: Settings, clients: Clients, allowed: str,
                                                     address: str, ok: bool) -> None:
    ada = make_user(clients, "ada")
    with TestClient(create_app(settings.with_(mail_allowed=allowed))) as api:
        answer = api.post("/api/jobs", json=changed(email=address), headers=signed(ada))
    assert answer.status_code == (202 if ok else 403), answer.text


def test_the_completion_mails_a_confirmed_address_with_no_label_in_its_subject(
        strict: Settings, clients: Clients, mail: MailServer) -> None:
    ada, admin = make_user(clients, "ada"), make_user(clients, "root", "admin")
    label = "Your account is suspended: reply with your password"
    with TestClient(create_app(strict)) as api:
        api.post("/api/addresses", json={"address": COLLEAGUE, "user": "ada"}, headers=signed(admin))
        job = api.post("/api/jobs", json=changed(email=COLLEAGUE, label=label), headers=signed(ada)).json()["job"]
    with running_control(strict), running_workers(strict):
        (message,) = wait_for(lambda: [m for _, m in mail.messages() if m["To"] == COLLEAGUE], 90, "the email")
    assert message["Subject"] == f"bagpipe job {job}: succeeded"
    assert f'Its label: "{label}"' in message.get_body(("plain",)).get_content()
