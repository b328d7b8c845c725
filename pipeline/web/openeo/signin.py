"""Who calls the openEO API, as openEO clients say it.

- **Basic**: ``GET /credentials/basic`` with HTTP Basic, the user's name and one of their
  personal API tokens as the password, answers that token as the access token; the client then
  sends ``Authorization: Bearer basic//TOKEN``. Nothing new is issued or stored: the token is
  checked against its row on every request, as the native API does, so revoking it signs the
  client out at once.
- **OpenID Connect**: in Azure, Microsoft Entra ID is the provider (``GET /credentials/oidc``
  names it from the Entra settings); the client sends ``Bearer oidc/entra/JWT`` with a token
  Entra issued for this deployment's app registration, verified as the portal's sign-in is
  (``pipeline.web.entra``).

Every other form is refused with openEO's codes (``AuthenticationRequired``,
``AuthenticationSchemeInvalid``, ``TokenInvalid``, ``CredentialsInvalid``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

from fastapi import Request

from pipeline.storage.clients import Clients
from pipeline.web import entra, identity
from pipeline.web.identity import Caller
from pipeline.web.openeo.errors import OpenEOError

PROVIDER = "entra"
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="openEO"'}


def oidc_providers(clients: Clients) -> dict[str, Any]:
    """``GET /credentials/oidc``: Entra ID where the deployment signs users in with it."""
    settings = clients.settings
    if not settings.entra_issuer:
        return {"providers": []}
    return {"providers": [{
        "id": PROVIDER, "issuer": settings.entra_issuer,
        "title": "Microsoft Entra ID", "scopes": ["openid", "email", "profile"],
        "default_clients": [{"id": settings.entra_client_id,
                             "grant_types": ["authorization_code+pkce",
                                             "urn:ietf:params:oauth:grant-type:device_code+pkce", "refresh_token"]}],
    }]}


def basic_token(clients: Clients, request: Request) -> dict[str, str]:
    """``GET /credentials/basic``: the personal API token given as the password of HTTP
    Basic, if it is a valid token of the user named."""
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "basic" or not given:
        raise OpenEOError(401, "AuthenticationRequired", "HTTP Basic: your user name, and a personal API token "
                          "(bagpipe tokens create) as the password", {"WWW-Authenticate": 'Basic realm="openEO"'})
    try:
        name, _, password = base64.b64decode(given.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        raise OpenEOError(400, "AuthenticationSchemeInvalid", "HTTP Basic credentials are not base64 text") from None
    caller = identity.verify_token(clients, password)
    if caller is None or caller.user.name != name:
        raise OpenEOError(403, "CredentialsInvalid", "that user name and token do not sign in (the password is a "
                          "personal API token of that user, not revoked)")
    return {"access_token": password}


def authenticator(clients: Clients) -> Callable[[Request], Caller]:
    """The dependency every openEO route that holds data takes: the caller of a
    ``Bearer basic//TOKEN`` or ``Bearer oidc/entra/JWT``."""

    def caller_of(request: Request) -> Caller:
        scheme, _, bearer = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not bearer:
            raise OpenEOError(401, "AuthenticationRequired", "sign in: Authorization: Bearer basic//TOKEN (a "
                              "personal API token, see GET /credentials/basic) or Bearer oidc/entra/TOKEN", CHALLENGE)
        method, _, rest = bearer.partition("/")
        if method == "basic" and rest.startswith("/"):
            caller = identity.verify_token(clients, rest[1:])
            if caller is None:
                raise OpenEOError(403, "TokenInvalid", "that API token is not valid (unknown, revoked or malformed)")
            return caller
        if method == "oidc" and clients.settings.entra_issuer:
            provider, _, token = rest.partition("/")
            if provider != PROVIDER:
                raise OpenEOError(403, "TokenInvalid", f"unknown OpenID Connect provider {provider[:40]!r} "
                                  f"(this back end's: {PROVIDER})")
            try:
                who = entra.verify(clients.settings, token)
            except entra.SignInError as exc:
                raise OpenEOError(403, "TokenInvalid", str(exc)) from None
            signed = identity.signed_in(clients, who.tenant, who.oid, who.email)
            if signed is None:
                raise OpenEOError(403, "PermissionsInsufficient", f"{who.email or 'this account'} is signed in "
                                  "but is not a bagpipe user: ask an admin to add you")
            return signed
        raise OpenEOError(403, "AuthenticationSchemeInvalid", "the bearer token is basic//TOKEN"
                          + (" or oidc/entra/TOKEN" if clients.settings.entra_issuer else ""))

    return caller_of
