"""Fetching a file a catalog found, with the credentials its host wants and no other host
ever seeing them.

- **Planetary Computer** (Azure Blob): an href is signed at fetch time with a read SAS token
  for its storage container, from Planetary Computer's token endpoint
  (``{BAGPIPE_STAC_SAS_URL}/{account}/{container}``, answer ``{"msft:expiry", "token"}``). A
  token is kept per container until shortly before its expiry, then renewed (and at once if
  storage refuses it), so a job longer than a token's life keeps working. A small client
  rather than the ``planetary-computer`` package: that one signs only
  ``*.blob.core.windows.net`` hosts (never the local stack's Azurite, which names its account
  in the path), keeps its tokens in a module-wide cache renewed a fixed minute before expiry,
  and reads its settings once from the environment.
- **NASA** (Earthdata Login): an Earthdata bearer token (``BAGPIPE_EARTHDATA_TOKEN``) is sent
  to the hosts of ``BAGPIPE_EARTHDATA_HOSTS`` only — the login host and the DAACs — and only
  over HTTPS (or to this machine), across the archive's redirect to the login host and back;
  a redirect to any other host (a signed bucket URL) goes there without it.
- Anything else: a plain GET.

No error text carries a token or a signed URL: messages name the unsigned href.
"""

from __future__ import annotations

import base64
import ipaddress
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from urllib.parse import urljoin, urlsplit

import httpx
from azure.core.exceptions import AzureError, HttpResponseError, ResourceNotFoundError
from azure.storage.blob import BlobClient

from pipeline.failures import FailureClass, StageFailure, error_code
from pipeline.redact import redact
from pipeline.settings import Settings, env_name

TIMEOUT_S = 120.0
MAX_REDIRECTS = 10
RENEW_BEFORE_S = 300.0  # renew a SAS token this long before its expiry (or at 3/4 of a shorter life)


@dataclass(frozen=True)
class Fetched:
    """A file as its host delivered it, with the checks the host offers."""

    url: str  # the unsigned href: safe to show
    data: bytes
    length: int | None = None  # what the host said the length is
    md5: bytes | None = None  # what the host said the MD5 is


BUSY = frozenset({429, 500, 502, 503, 504})  # a host that may well answer a retry


def refused(url: str, status: int, why: str) -> StageFailure:
    """A host's error answer as a classified failure: busy (a retry may well succeed) or a
    refusal of the file itself."""
    return StageFailure(FailureClass.SERVER_BUSY if status in BUSY else FailureClass.SOURCE_DOWNLOAD,
                        f"{redact(url)}: {why}")


class SourceMissing(StageFailure):
    """The host has no such file (404), though the catalog listed it."""

    def __init__(self, url: str) -> None:
        super().__init__(FailureClass.SOURCE_DOWNLOAD, f"the archive has no {redact(url)}")


def blob_container(href: str) -> tuple[str, str] | None:
    """(account, container) of an Azure Blob URL, as the Azure SDK reads one: the account is
    the host's first label on ``*.core.*`` hosts, else (an emulator's IP-style URL) the
    path's first segment; None for an URL that is not a blob's."""
    parts = urlsplit(href)
    segments = [s for s in parts.path.split("/") if s]
    host = parts.hostname or ""
    if ".blob.core." in host and len(segments) >= 2:
        return host.split(".")[0], segments[0]
    if _is_local(host) and len(segments) >= 3:
        return segments[0], segments[1]
    return None


def _is_local(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class SasSigner:
    """Read SAS tokens per storage container from a Planetary Computer-style token endpoint,
    kept until shortly before they expire."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint.rstrip("/")
        self._tokens: dict[tuple[str, str], tuple[str, float, float]] = {}  # token, expiry, renew at
        self._lock = threading.Lock()
        self.issued = 0  # tokens fetched (the tests watch renewals)

    def sign(self, href: str) -> str:
        container = blob_container(href)
        if container is None:
            return href
        return f"{href}{'&' if '?' in href else '?'}{self.token(*container)}"

    def token(self, account: str, container: str) -> str:
        with self._lock:
            held = self._tokens.get((account, container))
            if held and time.time() < held[2]:
                return held[0]
            token, expiry = self._fetch(account, container)
            now = time.time()
            life = max(0.0, expiry - now)
            self._tokens[(account, container)] = (token, expiry, expiry - min(RENEW_BEFORE_S, life / 4))
            self.issued += 1
            return token

    def forget(self, href: str) -> None:
        """Drop the container's token (storage refused it): the next sign fetches a new one."""
        container = blob_container(href)
        if container is None:
            return
        with self._lock:
            self._tokens.pop(container, None)

    def _fetch(self, account: str, container: str) -> tuple[str, float]:
        url = f"{self.endpoint}/{account}/{container}"
        try:
            response = httpx.get(url, timeout=30.0)
        except httpx.HTTPError as exc:
            raise StageFailure(FailureClass.CONNECTION, f"SAS token endpoint {url}: {type(exc).__name__}") from None
        if response.status_code != 200:
            raise StageFailure(FailureClass.SOURCE_DOWNLOAD,
                               f"SAS token endpoint {url} answered HTTP {response.status_code}")
        try:
            body = response.json()
            return str(body["token"]).lstrip("?"), datetime.fromisoformat(body["msft:expiry"]).timestamp()
        except (ValueError, KeyError, TypeError):
            raise StageFailure(FailureClass.SOURCE_DOWNLOAD, f"SAS token endpoint {url}: no token in its answer"
                               ) from None


class Earthdata:
    """GETs that carry an Earthdata bearer token to the allowed hosts only."""

    def __init__(self, token: str, hosts: frozenset[str]) -> None:
        if token.startswith("@Microsoft.KeyVault("):
            raise ValueError(f"{env_name('earthdata_token')} is an unresolved Key Vault reference")
        self._token = token
        self.hosts = hosts

    def allowed(self, url: str) -> bool:
        """Whether the token may go to this URL: an allowed host, over HTTPS (or on this machine)."""
        parts = urlsplit(url)
        host = (parts.hostname or "").lower()
        return host in self.hosts and (parts.scheme == "https" or _is_local(host))

    def get(self, url: str) -> httpx.Response:
        """GET ``url``, following redirects by hand so that each hop gets the token only if
        :meth:`allowed`; cookies (a DAAC's session after the login) are kept across hops."""
        with httpx.Client(timeout=TIMEOUT_S, follow_redirects=False) as http:
            hop = url
            for _ in range(MAX_REDIRECTS):
                headers = {"Authorization": f"Bearer {self._token}"} if self._token and self.allowed(hop) else {}
                response = http.get(hop, headers=headers)
                if response.status_code not in (301, 302, 303, 307, 308):
                    return response
                hop = urljoin(hop, response.headers["location"])
        raise StageFailure(FailureClass.SOURCE_DOWNLOAD, f"{redact(url)}: more than {MAX_REDIRECTS} redirects")


class Access:
    """How this process fetches catalog hrefs (one per settings, kept warm with its tokens)."""

    def __init__(self, sas_url: str, earthdata_token: str, earthdata_hosts: str) -> None:
        self.signer = SasSigner(sas_url) if sas_url else None
        self.earthdata = Earthdata(earthdata_token, frozenset(
            h.strip().lower() for h in earthdata_hosts.split(",") if h.strip()))

    def fetch(self, href: str) -> Fetched:
        if self.signer is not None and blob_container(href) is not None:
            return self._blob(href)
        if self.earthdata.allowed(href):
            return self._http(href, self.earthdata.get)
        return self._http(href, lambda url: httpx.get(url, timeout=TIMEOUT_S, follow_redirects=True))

    def _blob(self, href: str) -> Fetched:
        assert self.signer is not None
        for attempt in (1, 2):
            try:
                downloader = BlobClient.from_blob_url(self.signer.sign(href)).download_blob()
                data = downloader.readall()
            except ResourceNotFoundError:
                raise SourceMissing(href) from None
            except HttpResponseError as exc:
                if exc.status_code == 403 and attempt == 1:  # an expired or revoked token: a new one, once
                    self.signer.forget(href)
                    continue
                raise refused(href, exc.status_code or 0, f"storage answered HTTP {exc.status_code} "
                              f"({error_code(exc) or exc.reason})") from None
            except AzureError as exc:
                raise StageFailure(FailureClass.CONNECTION, f"{redact(href)}: {type(exc).__name__}") from None
            md5 = downloader.properties.content_settings.content_md5
            return Fetched(href, data, downloader.properties.size, bytes(md5) if md5 else None)
        raise AssertionError("unreachable")

    def _http(self, href: str, get: Callable[[str], httpx.Response]) -> Fetched:
        try:
            response = get(href)
        except httpx.HTTPError as exc:
            raise StageFailure(FailureClass.CONNECTION, f"{redact(href)}: {type(exc).__name__}") from None
        if response.status_code == 404:
            raise SourceMissing(href)
        if response.status_code in (401, 403):
            raise StageFailure(FailureClass.SOURCE_DOWNLOAD, f"{redact(href)}: HTTP {response.status_code}, access "
                               f"refused (is {env_name('earthdata_token')} set and valid?)")
        if response.status_code != 200:
            raise refused(href, response.status_code, f"HTTP {response.status_code}")
        length = response.headers.get("content-length")
        md5 = response.headers.get("content-md5")
        return Fetched(href, response.content, int(length) if length else None,
                       base64.b64decode(md5) if md5 else None)


@lru_cache(maxsize=4)
def _access(sas_url: str, token: str, hosts: str) -> Access:
    return Access(sas_url, token, hosts)


def access_for(settings: Settings) -> Access:
    """This process's Access for these settings: its SAS tokens live as long as the process.
    Hrefs are signed only when they come from the STAC catalog (NASA's are not Blob URLs)."""
    return _access(settings.stac_sas_url if settings.catalog == "stac" else "", settings.earthdata_token,
                   settings.earthdata_hosts)
