"""Where a user's jobs may mail their completion: their own address (their account's), the
addresses they have confirmed, and those the deployment allows (``BAGPIPE_MAIL_ALLOWED``:
addresses or ``@domains``; an admin also confirms an address for any user at once). A
request naming another address is refused (403, naming ``email``): bagpipe mails no one who
did not agree to it.

A user asks for an address (``POST /api/addresses``); bagpipe mails it one message of fixed
text — who asks, and a link — and the address is theirs once the link is opened
(``GET /api/addresses/confirm?token=…``, served to anyone: the token is the proof). A link
lasts :data:`LINK_HOURS`; a user has at most :data:`PENDING` addresses waiting at once, and
asking spends from their request rate (``pipeline.web.ratelimit``).

users table, by partition:
- ``address~<user>``: RK = SHA-256 of the lowercased address; ``Address``, ``SentAt``,
  ``ConfirmedAt`` (absent while it waits), ``ConfirmedBy`` (``link``, or the admin).
- ``confirm``: RK = the link's token id; ``User``, ``Key`` (the address row's RK), ``Hash``
  (SHA-256 of the token's secret: the table holds nothing that confirms), ``ExpiresAt``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import smtplib
from collections.abc import Callable
from datetime import timedelta
from email.message import EmailMessage
from html import escape
from typing import Annotated, Any

from azure.core.exceptions import ResourceNotFoundError
from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, ConfigDict, EmailStr, Field

from pipeline.lifecycle.notify import mailer_for
from pipeline.lifecycle.tasks import now
from pipeline.storage.clients import Clients
from pipeline.web import audit, identity
from pipeline.web.identity import Caller, User

CONFIRM = "confirm"
CONFIRM_PATH = "/api/addresses/confirm"
LINK_HOURS = 24
PENDING = 5  # addresses a user may have waiting for their confirmation at once
_TOKEN = re.compile(r"^([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")


def _partition(user: str) -> str:
    return f"address~{user}"


def _key(address: str) -> str:
    return hashlib.sha256(address.strip().lower().encode()).hexdigest()


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def allowed_by_deployment(clients: Clients, address: str) -> bool:
    """Whether ``BAGPIPE_MAIL_ALLOWED`` allows ``address`` for every user."""
    address = address.strip().lower()
    for allowed in (a.strip().lower() for a in clients.settings.mail_allowed.split(",") if a.strip()):
        if allowed == "*" or allowed == address or (allowed.startswith("@") and address.endswith(allowed)):
            return True
    return False


def may_mail(clients: Clients, user: User, address: str) -> bool:
    """Whether ``user``'s jobs may mail ``address``: their own, one the deployment allows, or
    one they confirmed (a point read)."""
    if address.strip().lower() == user.email.strip().lower() or allowed_by_deployment(clients, address):
        return True
    try:
        row = clients.users.get_entity(_partition(user.name), _key(address))
    except ResourceNotFoundError:
        return False
    return bool(row.get("ConfirmedAt"))


def listed(clients: Clients, user: User) -> list[dict[str, Any]]:
    """The user's addresses: their own, then those confirmed or waiting, by address."""
    found = [{"address": user.email, "confirmed": True, "own": True}]
    rows = clients.users.query_entities("PartitionKey eq @pk", parameters={"pk": _partition(user.name)})
    for row in sorted(rows, key=lambda r: str(r["Address"]).lower()):
        confirmed = row.get("ConfirmedAt")
        found.append({"address": row["Address"], "confirmed": bool(confirmed), "own": False,
                      "since": (confirmed or row["SentAt"]).isoformat()})
    return found


def confirm_now(clients: Clients, user: User, address: str, by: str) -> None:
    """An admin allows ``user``'s jobs to mail ``address``, with no link."""
    clients.users.upsert_entity({"PartitionKey": _partition(user.name), "RowKey": _key(address), "Address": address,
                                 "SentAt": now(), "ConfirmedAt": now(), "ConfirmedBy": by})
    audit.record(clients, by, "address.allow", address, {"user": user.name})


def ask(clients: Clients, user: User, address: str, confirm_url: str) -> bool:
    """Mail ``address`` a link that confirms it for ``user`` (``confirm_url``: where the API
    serves the confirmation); False if it is confirmed already. 409 past :data:`PENDING`
    addresses waiting."""
    key = _key(address)
    try:
        if clients.users.get_entity(_partition(user.name), key).get("ConfirmedAt"):
            return False
    except ResourceNotFoundError:
        pass
    since = now() - timedelta(hours=LINK_HOURS)
    waiting = [r for r in clients.users.query_entities("PartitionKey eq @pk", parameters={"pk": _partition(user.name)})
               if not r.get("ConfirmedAt") and r["SentAt"] > since and r["RowKey"] != key]
    if len(waiting) >= PENDING:
        raise HTTPException(409, {"detail": f"{len(waiting)} addresses already wait for their confirmation; ask "
                                            f"again once they are confirmed or their links expire "
                                            f"({LINK_HOURS} h after they were sent)", "field": "address"})
    token_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    clients.users.create_entity({"PartitionKey": CONFIRM, "RowKey": token_id, "User": user.name, "Key": key,
                                 "Hash": _hash(secret), "ExpiresAt": now() + timedelta(hours=LINK_HOURS)})
    clients.users.upsert_entity({"PartitionKey": _partition(user.name), "RowKey": key, "Address": address,
                                 "SentAt": now()})
    message = EmailMessage()
    message["From"] = clients.settings.mail_sender
    message["To"] = address
    message["Subject"] = "bagpipe: may we send you a user's job notifications?"
    message.set_content(
        f"The bagpipe user {user.name} asks that the notifications of their processing jobs be sent to "
        f"this address. If you agree, open this link within {LINK_HOURS} hours:\n\n"
        f"{confirm_url}?token={token_id}_{secret}\n\n"
        f"If you do not, ignore this message: bagpipe sends nothing more to this address for them.\n")
    try:
        mailer_for(clients.settings).send(message)
    except (OSError, smtplib.SMTPException) as exc:  # the mail service: asked again, the next link is sent
        raise HTTPException(503, {"detail": f"the confirmation could not be mailed ({type(exc).__name__}): retry "
                                            "shortly"}, headers={"Retry-After": "30"}) from None
    audit.record(clients, user.name, "address.ask", address)
    return True


def confirm(clients: Clients, token: str) -> tuple[str, str]:
    """Confirm the address a link's ``token`` names; (user, address), or 404 for a token
    that is unknown, wrong, used or expired."""
    parsed = _TOKEN.match(token)
    gone = HTTPException(404, {"detail": "this confirmation link is unknown, used or expired: ask for a new one",
                               "field": "token"})
    if parsed is None:
        raise gone
    token_id, secret = parsed.groups()
    try:
        row = clients.users.get_entity(CONFIRM, token_id)
    except ResourceNotFoundError:
        raise gone from None
    if not hmac.compare_digest(_hash(secret), row["Hash"]) or row["ExpiresAt"] < now():
        raise gone
    user = identity.get_user(clients, row["User"])
    try:
        address_row = clients.users.get_entity(_partition(row["User"]), row["Key"])
    except ResourceNotFoundError:
        raise gone from None
    if user is None:
        raise gone
    clients.users.update_entity({"PartitionKey": _partition(user.name), "RowKey": row["Key"], "ConfirmedAt": now(),
                                 "ConfirmedBy": "link"})
    clients.users.delete_entity(CONFIRM, token_id)
    audit.record(clients, user.name, "address.confirm", address_row["Address"])
    return user.name, str(address_row["Address"])


class NewAddress(BaseModel):
    model_config = ConfigDict(extra="forbid")
    address: EmailStr
    user: Annotated[str, Field(max_length=32)] | None = None  # an admin's: whose (default: mine)


def add_routes(app: FastAPI, clients: Clients, signed_in: Callable[..., Caller],
               spending: Callable[..., Caller]) -> None:
    @app.get("/api/addresses")
    def addresses(caller: Caller = Depends(signed_in)) -> list[dict[str, Any]]:
        """Where my jobs may mail their completion: my own address, those I confirmed, those
        waiting for their confirmation (and the deployment's ``BAGPIPE_MAIL_ALLOWED``)."""
        return listed(clients, caller.user)

    @app.post("/api/addresses", status_code=202)
    def add(body: NewAddress, request: Request, caller: Caller = Depends(spending)) -> dict[str, Any]:
        """Ask that my jobs may mail ``address``: it gets a confirmation link (202) and may
        be named once the link is opened. An admin's address is allowed at once (for
        ``user``, default theirs), no link."""
        address = str(body.address)
        if body.user is not None or caller.user.admin:
            if not caller.user.admin:
                raise HTTPException(403, {"detail": "only an admin allows an address for a user", "field": "user"})
            user = identity.get_user(clients, body.user or caller.user.name)
            if user is None:
                raise HTTPException(404, {"detail": f"no user {body.user!r}", "field": "user"})
            confirm_now(clients, user, address, by=caller.user.name)
            return {"address": address, "user": user.name, "confirmed": True}
        if may_mail(clients, caller.user, address):
            return {"address": address, "user": caller.user.name, "confirmed": True}
        ask(clients, caller.user, address, str(request.url_for("confirm_address")))
        return {"address": address, "user": caller.user.name, "confirmed": False,
                "detail": f"a confirmation link was mailed to {address}; it lasts {LINK_HOURS} h"}

    # a page when it confirms; refused, JSON as every refusal (a response class of no media type
    # documents the app's errors as application/json, where HTMLResponse documented them as text/html)
    @app.get(CONFIRM_PATH, name="confirm_address", response_class=Response, responses={200: {
        "description": "The address confirmed: a page saying so",
        "content": {"text/html": {"schema": {"type": "string"}}}}})
    def confirm_address(token: Annotated[str, Query(max_length=80)]) -> HTMLResponse:
        """Confirm an address (the link mailed to it; no sign-in: the token is the proof)."""
        user, address = confirm(clients, token)
        return HTMLResponse(f"<!doctype html><title>bagpipe</title><p>Thank you: the notifications of "
                            f"{escape(user)}'s bagpipe jobs may now be sent to {escape(address)}.</p>")
