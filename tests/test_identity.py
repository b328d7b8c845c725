"""Who may call the API: personal API tokens (stored hashed, shown once, refused at once when
revoked), roles (scientist, admin), the audit trail, and Entra sign-ins as App Service
Authentication forwards them — verified against the issuer's keys, so that a principal header
a client writes itself signs nobody in."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi.testclient import TestClient

from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web import identity
from pipeline.web.api import create_app
from tests.conftest import make_user, signed, small_request

CLIENT_ID = "11111111-2222-3333-4444-555555555555"
TENANT = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"


@pytest.fixture
def api(settings: Settings, clients: Clients) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as client:
        yield client


def test_a_token_is_shown_once_stored_hashed_and_refused_at_once_when_revoked(
    api: TestClient, clients: Clients, admin_token: str
) -> None:
    assert api.post("/api/users", json={"name": "alice", "email": "alice@example.org"},
                    headers=signed(admin_token)).status_code == 201
    made = api.post("/api/tokens", json={"user": "alice", "label": "laptop"}, headers=signed(admin_token)).json()
    token = made["token"]
    assert token.startswith(f"bgp_{made['id']}_") and len(token.split("_", 2)[2]) == 43
    # nothing in storage could sign anyone in: only the secret's SHA-256 is kept
    secret = token.split("_", 2)[2]
    for table in (clients.users, clients.audit):
        for row in table.list_entities():
            assert secret not in json.dumps(row, default=str) and token not in json.dumps(row, default=str)
    assert api.get("/api/me", headers=signed(token)).json() == {
        "user": "alice", "email": "alice@example.org", "role": "scientist", "via": f"token:{made['id']}"}
    listed = api.get("/api/tokens", headers=signed(token)).json()
    assert [t["id"] for t in listed] == [made["id"]] and "token" not in listed[0] and "Hash" not in listed[0]

    assert api.post(f"/api/tokens/{made['id']}/revoke", headers=signed(admin_token)).status_code == 200
    refused = api.get("/api/me", headers=signed(token))
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]
    assert api.post("/api/jobs", json=json.loads(small_request().model_dump_json()),
                    headers=signed(token)).status_code == 401
    # two tokens in one request, a good one beside the revoked one: neither signs in (which did it mean?)
    both = signed(admin_token) | {"Authorization": f"Bearer {token}"}
    refused = api.get("/api/me", headers=both)
    assert refused.status_code == 401 and "two different" in refused.json()["detail"]
    assert api.get("/api/me", headers=both | {"Authorization": f"Bearer {admin_token}"}).status_code == 200


def test_a_scientist_revokes_their_own_tokens_only_and_makes_none_with_a_token(
    api: TestClient, clients: Clients, admin_token: str
) -> None:
    alice, bob = make_user(clients, "alice"), make_user(clients, "bob")
    bobs = identity.token_row(clients, bob.split("_")[1])
    assert bobs is not None
    assert api.post(f"/api/tokens/{bobs['RowKey']}/revoke", headers=signed(alice)).status_code == 404
    assert api.get("/api/me", headers=signed(bob)).status_code == 200  # still good
    # a token cannot make another (a stolen one would outlive its revocation)
    assert api.post("/api/tokens", json={}, headers=signed(alice)).status_code == 403
    assert api.post("/api/tokens", json={"user": "bob"}, headers=signed(alice)).status_code == 403
    for method, path, body in (("GET", "/api/users", None), ("GET", "/api/audit", None),
                               ("POST", "/api/users", {"name": "eve", "email": "eve@example.org", "role": "admin"}),
                               ("GET", "/api/tokens?user=bob", None), ("GET", "/api/jobs?all=true", None)):
        response = api.request(method, path, json=body, headers=signed(alice))
        assert response.status_code == 403 and response.json()["detail"], (method, path)
    assert identity.get_user(clients, "eve") is None
    own = api.get("/api/tokens", headers=signed(alice)).json()
    assert api.post(f"/api/tokens/{own[0]['id']}/revoke", headers=signed(alice)).status_code == 200
    assert api.get("/api/me", headers=signed(alice)).status_code == 401
    assert api.get("/api/tokens?user=alice", headers=signed(admin_token)).json()[0]["revoked"] is True


def test_users_are_unique_by_name_and_address(api: TestClient, clients: Clients, admin_token: str) -> None:
    first = api.post("/api/users", json={"name": "carol", "email": "Carol@Example.org"}, headers=signed(admin_token))
    assert first.status_code == 201
    for body, field in (({"name": "carol", "email": "other@example.org"}, "name"),
                        ({"name": "carol2", "email": "carol@example.org"}, "email"),
                        ({"name": "Bad Name", "email": "x@example.org"}, "name"),
                        ({"name": "dave", "email": "not an address"}, "email")):
        response = api.post("/api/users", json=body, headers=signed(admin_token))
        assert response.status_code in (409, 422) and response.json()["field"] == field, response.text
    assert sorted(u["user"] for u in api.get("/api/users", headers=signed(admin_token)).json()) == ["admin", "carol"]


def test_the_audit_trail_says_who_did_what(api: TestClient, clients: Clients, admin_token: str) -> None:
    alice = make_user(clients, "alice")
    body = json.loads(small_request().model_dump_json())
    job = api.post("/api/jobs", json=body, headers=signed(alice)).json()["job"]
    api.get("/api/jobs", headers=signed(alice))  # a second use the same day: not a second event
    assert api.post(f"/api/jobs/{job}/cancel", headers=signed(alice)).status_code == 202
    trail = api.get("/api/audit", headers=signed(admin_token)).json()
    mine = [(e["what"], e["target"]) for e in trail if e["who"] == "alice"]
    assert ("job.submit", job) in mine and ("job.cancel", job) in mine
    assert [w for w, _ in mine].count("token.use") == 1
    assert [e["what"] for e in trail].count("token.create") >= 2 and any(e["what"] == "user.add" for e in trail)
    assert trail == sorted(trail, key=lambda e: e["at"], reverse=True)
    only = api.get("/api/audit?user=alice", headers=signed(admin_token)).json()
    assert only and {e["who"] for e in only} == {"alice"}


# --- Entra sign-ins --------------------------------------------------------------------
class Issuer:
    """An OpenID Connect issuer as Entra publishes one: its configuration and its signing
    keys over HTTP, and ID tokens signed with its private key."""

    def __init__(self) -> None:
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        keys = {"keys": [public | {"kid": "k1", "use": "sig", "alg": "RS256"}]}
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = {"/.well-known/openid-configuration": {"issuer": issuer.url, "jwks_uri": f"{issuer.url}/keys"},
                        "/keys": keys}.get(self.path.removeprefix(issuer.path))
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps(body or {}).encode())

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.path = f"/{TENANT}/v2.0"
        self.url = f"http://127.0.0.1:{self.server.server_port}{self.path}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def id_token(self, email: str, oid: str = "oid-1", key: Any = None, **changes: Any) -> str:
        claims = {"iss": self.url, "aud": CLIENT_ID, "tid": TENANT, "oid": oid, "preferred_username": email,
                  "iat": int(time.time()), "exp": int(time.time()) + 3600} | changes
        return jwt.encode(claims, key or self.key, algorithm="RS256", headers={"kid": "k1"})


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    found = Issuer()
    yield found
    found.server.shutdown()


def principal_headers(email: str, oid: str = "oid-1") -> dict[str, str]:
    """What App Service Authentication writes for a signed-in user, here written by a client."""
    claims = {"auth_typ": "aad", "claims": [{"typ": "preferred_username", "val": email}],
              "name_typ": "name", "role_typ": "roles"}
    return {"X-MS-CLIENT-PRINCIPAL": base64.b64encode(json.dumps(claims).encode()).decode(),
            "X-MS-CLIENT-PRINCIPAL-ID": oid, "X-MS-CLIENT-PRINCIPAL-NAME": email, "X-MS-CLIENT-PRINCIPAL-IDP": "aad"}


def test_a_principal_header_from_a_client_signs_nobody_in(
    settings: Settings, clients: Clients, admin_token: str, issuer: Issuer
) -> None:
    make_user(clients, "alice")
    # the local stack (no sign-in configured), and a deployment behind App Service
    # Authentication reached by a request that bypassed it: the headers alone are nothing
    for deployment in (settings, settings.with_(entra_issuer=issuer.url, entra_client_id=CLIENT_ID)):
        with TestClient(create_app(deployment)) as bare:
            for path in ("/api/me", "/api/jobs"):
                response = bare.get(path, headers=principal_headers("alice@example.org"))
                assert response.status_code == 401, response.text
            response = bare.post("/api/jobs", json=json.loads(small_request().model_dump_json()),
                                 headers=principal_headers("admin@localhost") | {"X-Requested-With": "bagpipe"})
            assert response.status_code == 401
    assert not list(clients.jobs.list_entities())


def test_an_entra_id_token_signs_in_the_user_an_admin_added(
    settings: Settings, clients: Clients, issuer: Issuer
) -> None:
    entra = settings.with_(entra_issuer=issuer.url, entra_client_id=CLIENT_ID, admin_emails="boss@example.org")
    make_user(clients, "alice")
    header = names.PLATFORM_ID_TOKEN
    with TestClient(create_app(entra)) as api:
        assert api.get("/api/auth").json()["platform"]["login"] == "/.auth/login/aad"
        me = api.get("/api/me", headers={header: issuer.id_token("Alice@Example.org")})
        assert me.status_code == 200 and me.json()["user"] == "alice" and me.json()["via"] == "entra"
        # bound by its object id: the same Entra user later, whatever address it shows
        assert api.get("/api/me", headers={header: issuer.id_token("renamed@example.org")}).json()["user"] == "alice"
        # a signed-in browser may make itself a token (a script's), never for another user
        made = api.post("/api/tokens", json={"label": "script"},
                        headers={header: issuer.id_token("alice@example.org"), "X-Requested-With": "bagpipe"})
        assert made.status_code == 201 and api.get("/api/me", headers=signed(made.json()["token"])).status_code == 200
        # a cookie session's change without the portal's header: a cross-site form, refused
        csrf = api.post("/api/jobs", json=json.loads(small_request().model_dump_json()),
                        headers={header: issuer.id_token("alice@example.org")})
        assert csrf.status_code == 403 and "X-Requested-With" in csrf.json()["detail"]
        refused = {
            "another issuer's key": issuer.id_token("alice@example.org",
                                                    key=rsa.generate_private_key(public_exponent=65537, key_size=2048)),
            "another app's audience": issuer.id_token("alice@example.org", aud="another-app"),
            "another issuer": issuer.id_token("alice@example.org", iss="https://login.example.org/x/v2.0"),
            "no signature": jwt.encode({"iss": issuer.url, "aud": CLIENT_ID, "tid": TENANT, "oid": "oid-1",
                                        "exp": int(time.time()) + 60, "iat": int(time.time())}, None, "none"),
            "garbage": "not.a.token",
        }
        for why, token in refused.items():
            response = api.get("/api/me", headers={header: token})
            assert response.status_code == 401, why
            assert response.json()["sign_in"] == "/.auth/login/aad" and response.json()["expired"] is False, why
        expired = api.get("/api/me", headers={header: issuer.id_token("alice@example.org", exp=int(time.time()) - 300)})
        assert expired.status_code == 401 and expired.json()["expired"] is True
        stranger = api.get("/api/me", headers={header: issuer.id_token("eve@example.org", oid="oid-eve")})
        assert stranger.status_code == 403 and "ask an admin" in stranger.json()["detail"]
        boss = api.get("/api/me", headers={header: issuer.id_token("boss@example.org", oid="oid-boss")}).json()
        assert boss["role"] == "admin" and boss["user"] == "boss"
    events = {(r["Who"], r["What"]) for r in clients.audit.list_entities()}
    assert {("alice", "sign-in"), ("alice", "sign-in.bind"), ("boss", "sign-in")} <= events
    assert sum(1 for r in clients.audit.list_entities() if (r["Who"], r["What"]) == ("alice", "sign-in")) == 1
