"""The API's routes for users, personal API tokens and the audit trail.

An admin adds users and makes or revokes anyone's tokens. A scientist sees and revokes their
own tokens, and makes new ones only while signed in through Entra (in Azure): a token alone
cannot make another, so a stolen token dies with its revocation.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, EmailStr, Field

from pipeline.storage.clients import Clients
from pipeline.web import audit, identity
from pipeline.web.auth import admin_only
from pipeline.web.identity import Caller


class NewUser(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Field(pattern=identity.USER_NAME.pattern)]
    email: EmailStr
    role: Literal["scientist", "admin"] = "scientist"


class NewToken(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: Annotated[str, Field(max_length=32)] | None = None  # default: myself
    label: Annotated[str, Field(max_length=100)] = ""


def add_routes(app: FastAPI, clients: Clients, signed_in: Callable[..., Caller]) -> None:
    def admin(caller: Caller = Depends(signed_in)) -> Caller:
        return admin_only(caller)

    @app.get("/api/me")
    def me(caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """Who I am signed in as, and how."""
        return caller.user.public() | {"via": caller.via}

    @app.get("/api/users")
    def users(_: Caller = Depends(admin)) -> list[dict[str, str]]:
        """Every user (admin)."""
        return [u.public() for u in identity.list_users(clients)]

    @app.post("/api/users", status_code=201)
    def add_user(body: NewUser, caller: Caller = Depends(admin)) -> dict[str, str]:
        """Add a user (admin). In Azure they sign in with Entra under that e-mail address."""
        return identity.add_user(clients, body.name, str(body.email), body.role, by=caller.user.name).public()

    @app.post("/api/tokens", status_code=201)
    def create_token(body: NewToken, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """A new personal API token: shown in this answer only, never again."""
        name = body.user or caller.user.name
        if not caller.user.admin and (name != caller.user.name or caller.via != "entra"):
            raise HTTPException(403, "only an admin makes tokens, or you for yourself while signed in with Entra")
        user = identity.get_user(clients, name)
        if user is None:
            raise HTTPException(404, f"no user {name!r}")
        token, public = identity.create_token(clients, user, body.label, by=caller.user.name)
        return public | {"token": token}

    @app.get("/api/tokens")
    def tokens(user: str | None = None, caller: Caller = Depends(signed_in)) -> list[dict[str, Any]]:
        """My tokens (an admin: ``user``'s), without their secrets."""
        name = user or caller.user.name
        if name != caller.user.name and not caller.user.admin:
            raise HTTPException(403, "only an admin lists another user's tokens")
        return identity.list_tokens(clients, name)

    @app.post("/api/tokens/{token_id}/revoke")
    def revoke(token_id: str, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """Revoke a token of mine (an admin: anyone's); refused from the next request on."""
        row = identity.token_row(clients, token_id)
        if row is None or (row["User"] != caller.user.name and not caller.user.admin):
            raise HTTPException(404, f"no token {token_id!r}")
        identity.revoke_token(clients, token_id, by=caller.user.name)
        return {"id": token_id, "revoked": True}

    @app.get("/api/audit")
    def audit_trail(day: date | None = None, user: str = "", limit: int = 200,
                    _: Caller = Depends(admin)) -> list[dict[str, Any]]:
        """A day's audit events (UTC; default today), newest first (admin); ``user``: only theirs."""
        if not 1 <= limit <= 1000:
            raise HTTPException(400, "limit must be between 1 and 1000")
        return audit.read(clients, day or datetime.now(UTC).date(), limit, user)
