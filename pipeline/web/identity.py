"""Who may use bagpipe: users, their personal API tokens, and the Microsoft Entra ID users
they sign in as — all in the ``users`` table, every lookup a point read.

users table, by partition:
- ``user``: RK = user name; ``Email``, ``Role`` (``scientist`` or ``admin``), ``CreatedAt``.
- ``email``: RK = SHA-256 of the lowercased address; ``User``. Makes an address unique and
  lets an Entra sign-in find the user an admin added for it.
- ``entra``: RK = ``<tenant id>.<object id>``; ``User``, ``SeenOn``. The Entra user a
  bagpipe user is bound to (at its first sign-in).
- ``token``: RK = token id; ``User``, ``Hash``, ``Label``, ``CreatedAt``, ``RevokedAt``,
  ``UsedOn``. A token is ``bgp_<id>_<secret>``: 64 random bits of id, 256 of secret; only
  the SHA-256 of the secret is kept, so the table holds nothing that signs anyone in.
  A slow password hash (bcrypt, scrypt) buys time against guessing a *low-entropy* secret;
  nobody can guess 256 random bits, so it would only cost CPU on every request.
- ``tokens~<user>``: RK = token id; the index that lists a user's tokens.
- ``address~<user>``, ``confirm``: the addresses a user's jobs may mail, and the links that
  confirm them (``pipeline.web.addresses``); ``rate``: each user's bucket of requests
  (``pipeline.web.ratelimit``).

Nothing is cached: every request reads its token row, so a revoked token is refused by the
very next request.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.data.tables import UpdateMode

from pipeline.lifecycle.tasks import now
from pipeline.storage.clients import Clients
from pipeline.web import audit

Role = Literal["scientist", "admin"]
USER_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_TOKEN = re.compile(r"^bgp_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
USER, EMAIL, ENTRA, TOKEN = "user", "email", "entra", "token"


class IdentityError(ValueError):
    """A refused identity operation: ``status`` is the HTTP answer, ``field`` what is wrong."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


@dataclass(frozen=True)
class User:
    name: str
    email: str
    role: Role

    @property
    def admin(self) -> bool:
        return self.role == "admin"

    def public(self) -> dict[str, str]:
        return {"user": self.name, "email": self.email, "role": self.role}


@dataclass(frozen=True)
class Caller:
    """The user a request acts for, and how it proved it (``token:<id>`` or ``entra``)."""

    user: User
    via: str


def _user_of(row: dict[str, Any]) -> User:
    return User(row["RowKey"], row["Email"], row["Role"])


def _email_key(email: str) -> str:
    return hashlib.sha256(email.strip().lower().encode()).hexdigest()


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _today() -> str:
    return datetime.now(UTC).date().isoformat()


def get_user(clients: Clients, name: str) -> User | None:
    if not USER_NAME.match(name):
        return None
    try:
        return _user_of(clients.users.get_entity(USER, name))
    except ResourceNotFoundError:
        return None


def add_user(clients: Clients, name: str, email: str, role: Role, by: str) -> User:
    """A new user; 409 if the name or the address is taken (then nothing is written)."""
    if not USER_NAME.match(name):
        raise IdentityError(422, "name", "a user name is 1-32 lowercase letters, digits, _ or -, a letter first")
    try:
        clients.users.create_entity({"PartitionKey": EMAIL, "RowKey": _email_key(email), "User": name})
    except ResourceExistsError:
        raise IdentityError(409, "email", f"{email} belongs to another user") from None
    try:
        clients.users.create_entity({"PartitionKey": USER, "RowKey": name, "Email": email, "Role": role,
                                     "CreatedAt": now(), "CreatedBy": by})
    except ResourceExistsError:
        clients.users.delete_entity(EMAIL, _email_key(email))
        raise IdentityError(409, "name", f"there is already a user {name!r}") from None
    audit.record(clients, by, "user.add", name, {"role": role})
    return User(name, email, role)


def list_users(clients: Clients) -> list[User]:
    return [_user_of(r) for r in clients.users.query_entities("PartitionKey eq @pk", parameters={"pk": USER})]


def create_token(clients: Clients, user: User, label: str, by: str) -> tuple[str, dict[str, Any]]:
    """A new token for ``user``: the token itself (shown once, never stored) and its row's
    public part."""
    token_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)  # 32 bytes: 43 characters
    row = {"PartitionKey": TOKEN, "RowKey": token_id, "User": user.name, "Hash": _hash(secret),
           "Label": label[:100], "CreatedAt": now(), "CreatedBy": by}
    clients.users.create_entity(row)
    clients.users.upsert_entity({"PartitionKey": f"tokens~{user.name}", "RowKey": token_id})
    audit.record(clients, by, "token.create", token_id, {"user": user.name})
    return f"bgp_{token_id}_{secret}", _token_public(row)


def _token_public(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["RowKey"], "user": row["User"], "label": row.get("Label", ""),
            "created": row["CreatedAt"].isoformat(), "revoked": bool(row.get("RevokedAt")),
            "last_used": row.get("UsedOn") or None}


def token_row(clients: Clients, token_id: str) -> dict[str, Any] | None:
    if not re.fullmatch(r"[0-9a-f]{16}", token_id):
        return None
    try:
        return dict(clients.users.get_entity(TOKEN, token_id))
    except ResourceNotFoundError:
        return None


def list_tokens(clients: Clients, user: str) -> list[dict[str, Any]]:
    found = []
    for entry in clients.users.query_entities("PartitionKey eq @pk", parameters={"pk": f"tokens~{user}"}):
        row = token_row(clients, entry["RowKey"])
        if row is not None:
            found.append(_token_public(row))
    return sorted(found, key=lambda t: t["created"])


def revoke_token(clients: Clients, token_id: str, by: str) -> None:
    """Refuse the token from now on (the next request that carries it is a 401)."""
    clients.users.update_entity({"PartitionKey": TOKEN, "RowKey": token_id, "RevokedAt": now(), "RevokedBy": by},
                                mode=UpdateMode.MERGE)
    audit.record(clients, by, "token.revoke", token_id)


def verify_token(clients: Clients, token: str) -> Caller | None:
    """The caller a personal token signs in, or None if it is malformed, unknown, wrong or
    revoked. The first use of a token each day is audited."""
    parsed = _TOKEN.match(token)
    if parsed is None:
        return None
    token_id, secret = parsed.groups()
    row = token_row(clients, token_id)
    if row is None or row.get("RevokedAt") or not hmac.compare_digest(_hash(secret), row["Hash"]):
        return None
    user = get_user(clients, row["User"])
    if user is None:
        return None
    if row.get("UsedOn") != _today():
        clients.users.update_entity({"PartitionKey": TOKEN, "RowKey": token_id, "UsedOn": _today()},
                                    mode=UpdateMode.MERGE)
        audit.record(clients, user.name, "token.use", token_id)
    return Caller(user, f"token:{token_id}")


def signed_in(clients: Clients, tenant: str, oid: str, email: str) -> Caller | None:
    """The bagpipe user of a verified Entra sign-in: the one bound to it, else the one an
    admin added with its address (bound now), else a new admin if the address is one of
    BAGPIPE_ADMIN_EMAILS; None if it is none of these. The first sign-in each day is audited."""
    key = f"{tenant}.{oid}"
    try:
        bound = clients.users.get_entity(ENTRA, key)
        user = get_user(clients, bound["User"])
        seen = bound.get("SeenOn")
    except ResourceNotFoundError:
        user, seen = _bind(clients, key, email), None
    if user is None:
        return None
    if seen != _today():
        clients.users.update_entity({"PartitionKey": ENTRA, "RowKey": key, "SeenOn": _today()}, mode=UpdateMode.MERGE)
        audit.record(clients, user.name, "sign-in", email)
    return Caller(user, "entra")


def _bind(clients: Clients, key: str, email: str) -> User | None:
    if not email:
        return None
    try:
        user = get_user(clients, clients.users.get_entity(EMAIL, _email_key(email))["User"])
    except ResourceNotFoundError:
        admins = {a.strip().lower() for a in clients.settings.admin_emails.split(",") if a.strip()}
        if email.lower() not in admins:
            return None
        user = add_user(clients, _free_name(clients, email), email, "admin", by="BAGPIPE_ADMIN_EMAILS")
    if user is None:
        return None
    try:
        clients.users.create_entity({"PartitionKey": ENTRA, "RowKey": key, "User": user.name})
    except ResourceExistsError:
        pass  # a concurrent first request bound it
    audit.record(clients, user.name, "sign-in.bind", key)
    return user


def _free_name(clients: Clients, email: str) -> str:
    stem = re.sub(r"[^a-z0-9_-]", "-", email.split("@")[0].lower()).strip("-")[:24]
    stem = stem if stem[:1].isalpha() else f"u{stem}"
    name, n = stem, 1
    while get_user(clients, name) is not None:
        n += 1
        name = f"{stem}{n}"
    return name


def bootstrap_admin(clients: Clients, token: str | None, name: str = "admin") -> str:
    """The local stack's admin: ``token`` if it still signs in an admin, else a new token
    for the user ``name`` (added if missing). Returns the token to keep."""
    if token:
        caller = verify_token(clients, token)
        if caller is not None and caller.user.admin:
            return token
    user = get_user(clients, name) or add_user(clients, name, f"{name}@localhost", "admin", by="local stack")
    return create_token(clients, user, "local stack", by="local stack")[0]
