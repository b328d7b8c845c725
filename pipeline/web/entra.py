"""Microsoft Entra ID sign-ins, as App Service Authentication forwards them to the app.

The platform injects ``X-MS-CLIENT-PRINCIPAL*`` headers and, with its token store on, the
user's ID token (``X-MS-TOKEN-AAD-ID-TOKEN``). The principal headers are unsigned: they are
only as good as the front end that strips a client's own copies, and a request that reaches
the app past it (the preview of Flex Consumption did not run that front end at all, see
docs/deploy.md) could carry anything. So bagpipe ignores them and reads the ID token instead,
verified here: Entra's signature (its published keys, found through the issuer's OpenID
configuration), the issuer, the audience (this deployment's app registration) and the
expiry. A forged header then buys nothing; a request with no such token is anonymous.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import httpx
import jwt

from pipeline.settings import Settings

LEEWAY_S = 60  # clock skew allowed on exp / nbf / iat
_clients: dict[str, jwt.PyJWKClient] = {}
_lock = threading.Lock()


class SignInError(Exception):
    """An ID token that does not sign anyone in; ``expired`` tells the portal to refresh it."""

    def __init__(self, message: str, expired: bool = False) -> None:
        super().__init__(message)
        self.expired = expired


@dataclass(frozen=True)
class Identity:
    tenant: str
    oid: str
    email: str


def _keys(issuer: str) -> jwt.PyJWKClient:
    """The issuer's signing keys (fetched once per process, refetched for an unknown key id)."""
    with _lock:
        found = _clients.get(issuer)
        if found is None:
            config = httpx.get(f"{issuer.rstrip('/')}/.well-known/openid-configuration", timeout=10)
            config.raise_for_status()
            found = _clients[issuer] = jwt.PyJWKClient(config.json()["jwks_uri"], cache_keys=True, lifespan=3600)
        return found


def verify(settings: Settings, id_token: str) -> Identity:
    """The Entra user an ID token signs in; SignInError if it does not."""
    try:
        key = _keys(settings.entra_issuer).get_signing_key_from_jwt(id_token)
        claims: dict[str, Any] = jwt.decode(
            id_token, key.key, algorithms=["RS256"], audience=settings.entra_client_id,
            issuer=settings.entra_issuer, leeway=LEEWAY_S, options={"require": ["exp", "iat", "aud", "iss"]},
        )
    except jwt.ExpiredSignatureError:
        raise SignInError("the sign-in has expired", expired=True) from None
    except (jwt.PyJWTError, httpx.HTTPError, KeyError, ValueError) as exc:
        raise SignInError(f"the sign-in token was refused ({type(exc).__name__})") from None
    tenant, oid = claims.get("tid"), claims.get("oid")
    if not tenant or not oid:
        raise SignInError("the sign-in token names no user (tid, oid)")
    email = str(claims.get("email") or claims.get("preferred_username") or "").lower()
    return Identity(str(tenant), str(oid), email)
