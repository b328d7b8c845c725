"""Who is calling: every API request but the portal's page and ``/api/auth`` carries a
personal API token (``X-Bagpipe-Token: TOKEN`` or ``Authorization: Bearer TOKEN``) or, in
Azure, an Entra sign-in that App Service Authentication forwards (``pipeline.web.entra``).

A token is checked against its row on every request (a revoked one is refused at once). A
sign-in is a browser's cookie session: its requests that change something must also carry
``X-Requested-With: bagpipe``, which no cross-site form can send.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web import entra, identity
from pipeline.web.identity import Caller

LOGIN_PATH = "/.auth/login/aad"  # App Service Authentication's Entra sign-in
REFRESH_PATH = "/.auth/refresh"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
CLIENT_VALUE = "bagpipe"


def methods(clients: Clients) -> dict[str, Any]:
    """How to sign in to this deployment (``GET /api/auth``, open: it holds no data)."""
    found: dict[str, Any] = {"token_header": names.TOKEN_HEADER}
    if clients.settings.entra_issuer:
        found |= {"platform": {"login": LOGIN_PATH, "refresh": REFRESH_PATH, "logout": "/.auth/logout"}}
    return found


def _refuse(clients: Clients, message: str, expired: bool = False) -> HTTPException:
    detail: dict[str, Any] = {"detail": message}
    if clients.settings.entra_issuer:
        detail |= {"sign_in": LOGIN_PATH, "expired": expired}
    return HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


def authenticator(clients: Clients) -> Callable[..., Caller]:
    token_header = APIKeyHeader(name=names.TOKEN_HEADER, auto_error=False,
                                description="A personal API token (bagpipe tokens create)")
    bearer = HTTPBearer(auto_error=False, description="The same personal API token, as a bearer token")

    def authenticate(request: Request, token: str | None = Depends(token_header),
                     credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Caller:
        if token and credentials and credentials.credentials != token:  # which one signs in? neither
            raise _refuse(clients, f"two different API tokens ({names.TOKEN_HEADER} and Bearer): send one")
        given = token or (credentials.credentials if credentials else "")
        if given:
            caller = identity.verify_token(clients, given)
            if caller is None:
                raise _refuse(clients, "that API token is not valid (unknown, revoked or malformed)")
            return caller
        id_token = request.headers.get(names.PLATFORM_ID_TOKEN)
        if clients.settings.entra_issuer and id_token:
            try:
                who = entra.verify(clients.settings, id_token)
            except entra.SignInError as exc:
                raise _refuse(clients, str(exc), exc.expired) from None
            caller = identity.signed_in(clients, who.tenant, who.oid, who.email)
            if caller is None:
                raise HTTPException(403, f"{who.email or 'this account'} is signed in but is not a bagpipe "
                                         "user: ask an admin to add you (bagpipe users add)")
            if request.method not in SAFE_METHODS and request.headers.get(names.CLIENT_HEADER) != CLIENT_VALUE:
                raise HTTPException(403, f"a signed-in browser's request must carry {names.CLIENT_HEADER}: "
                                         f"{CLIENT_VALUE}")
            return caller
        raise _refuse(clients, f"sign in: a personal API token ({names.TOKEN_HEADER} or Bearer) is required")

    return authenticate


def admin_only(caller: Caller) -> Caller:
    if not caller.user.admin:
        raise HTTPException(403, "only an admin may do this")
    return caller
