"""Fetching a file a catalog found, with the credentials its host wants and no other host
ever seeing them.

- **Planetary Computer** (Azure Blob): an href is signed at fetch time with a read SAS token
  for its storage container, from Planetary Computer's token endpoint
  (``{BAGPIPE_STAC_SAS_URL}/{account}/{container}``, answer ``{"msft:expiry", "token"}``). A
  token is kept per container until shortly before its expiry, then renewed (and at once if
  storage refuses it), so a job longer than a token's life keeps working. The worker's stage
  processes share their tokens (a file per container in a folder of the user's own, read and
  fetched under a lock on it): a worker asks once per container, not once per slot, nor again
  when a slot's process is replaced — when a large job starts, every new worker asks at
  once. An endpoint that answers busy (429 or 5xx: its rate limit) is asked again after its
  ``Retry-After`` (or an exponential backoff), with jitter, a few times, and then the
  attempt fails ``server_busy``, a transient failure the task is retried for, as a busy blob
  is. Planetary Computer's subscription key (``BAGPIPE_PC_SUBSCRIPTION_KEY``, which raises its
  rate limits) goes with each token request, as with each STAC API request
  (:mod:`pipeline.modis.stac`), to Planetary Computer's own hosts only, over HTTPS
  (:func:`subscription_headers`). A small client rather than the ``planetary-computer``
  package: that one signs only ``*.blob.core.windows.net`` hosts (never the local stack's
  Azurite, which names its account in the path), keeps its tokens in a module-wide cache
  renewed a fixed minute before expiry, and reads its settings once from the environment.
- **NASA** (Earthdata Login): an Earthdata bearer token (``BAGPIPE_EARTHDATA_TOKEN``) is sent
  to the hosts of ``BAGPIPE_EARTHDATA_HOSTS`` only — the login host and the DAACs — and only
  over HTTPS (or to this machine), across the archive's redirect to the login host and back;
  a redirect to any other host (a signed bucket URL) goes there without it.
- Anything else: a plain GET.

A Planetary Computer blob may also be read by byte ranges (:meth:`Access.ranged`: a
:class:`BlobFile`, its size and MD5 asked of storage first), with the same token handling
and the same failures as a whole fetch.

No error text carries a token, a key or a signed URL: messages name the unsigned href.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import ipaddress
import json
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from functools import lru_cache
from pathlib import Path
from typing import TypeVar
from urllib.parse import urljoin, urlsplit

import httpx
from azure.core.exceptions import AzureError, HttpResponseError, ResourceNotFoundError
from azure.storage.blob import BlobClient, StorageStreamDownloader

from pipeline.failures import FailureClass, StageFailure, error_code
from pipeline.redact import redact
from pipeline.settings import PLANETARY_COMPUTER_HOSTS, Settings, env_name

TIMEOUT_S = 120.0
MAX_REDIRECTS = 10
RENEW_BEFORE_S = 300.0  # renew a SAS token this long before its expiry (or at 3/4 of a shorter life)
TOKEN_TRIES = 5  # asks of a busy token endpoint before the attempt fails server_busy
TOKEN_BACKOFF_S = 0.5  # the first wait between them (doubling, with full jitter) when it says no Retry-After
TOKEN_WAIT_S = 30.0  # the longest Retry-After waited for here; longer, the task is retried later
KEPT_TOKENS_S = 86_400.0  # a shared token file older than this is removed when another is written
SUBSCRIPTION_HEADER = "Ocp-Apim-Subscription-Key"


@dataclass(frozen=True)
class Fetched:
    """A file as its host delivered it, with the checks the host offers."""

    url: str  # the unsigned href: safe to show
    data: bytes
    length: int | None = None  # what the host said the length is
    md5: bytes | None = None  # what the host said the MD5 is


T = TypeVar("T")


def _whole(downloader: StorageStreamDownloader[bytes]) -> tuple[StorageStreamDownloader[bytes], bytes]:
    return downloader, downloader.readall()


@dataclass(frozen=True)
class BlobFile:
    """A catalog's file in Azure Blob storage, read by byte ranges rather than whole (a point
    task wants a few blocks of a COG): its size, and the MD5 storage keeps of it (else its
    ETag) as its identity."""

    url: str  # the unsigned href: safe to show
    size: int
    md5: bytes | None
    etag: str
    access: Access

    @property
    def identity(self) -> str:
        """What names this content: its MD5 (as a whole fetch's cached copy is named), else
        storage's ETag of it."""
        return self.md5.hex() if self.md5 is not None else f"etag:{self.etag.strip(chr(34))}"

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` (fewer at the end), with the failures a whole
        fetch has."""
        return self.access._on_blob(self.url, lambda blob: blob.download_blob(offset=offset, length=length).readall())


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


def subscription_headers(url: str, key: str) -> dict[str, str]:
    """The header carrying Planetary Computer's subscription key, for a request to ``url``:
    none unless there is a key and ``url`` is one of Planetary Computer's hosts, over HTTPS."""
    parts = urlsplit(url)
    if key and parts.scheme == "https" and (parts.hostname or "").lower() in PLANETARY_COMPUTER_HOSTS:
        return {SUBSCRIPTION_HEADER: key}
    return {}


def unresolved(value: str, field: str) -> str:
    """``value``, refused if it is a Key Vault reference the platform did not resolve."""
    if value.startswith("@Microsoft.KeyVault("):
        raise ValueError(f"{env_name(field)} is an unresolved Key Vault reference")
    return value


def token_folder() -> Path:
    """Where this machine's stage processes of this user share their SAS tokens."""
    return Path(tempfile.gettempdir()) / f"bagpipe-sas-{os.getuid()}"


Token = tuple[str, float, float]  # the token, its expiry and when to renew it (epoch seconds)


class SasSigner:
    """Read SAS tokens per storage container from a Planetary Computer-style token endpoint,
    kept until shortly before they expire: in this process, and in ``folder`` for every
    process that signs with the same endpoint (None: in this process only)."""

    def __init__(self, endpoint: str, folder: Path | None = None, key: str = "",
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.folder = folder
        self._key = key
        self._sleep = sleep
        self._tokens: dict[tuple[str, str], Token] = {}
        self._lock = threading.Lock()
        self.issued = 0  # tokens this signer fetched (the tests watch renewals)

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
            with self._shared(account, container) as path:  # one process asks; the others wait, then read
                held = _read(path)
                if held is None or time.time() >= held[2]:
                    token, expiry = self._fetch(account, container)
                    life = max(0.0, expiry - time.time())
                    held = (token, expiry, expiry - min(RENEW_BEFORE_S, life / 4))
                    self.issued += 1
                    _write(path, held)
            self._tokens[(account, container)] = held
            return held[0]

    def forget(self, href: str) -> None:
        """Drop the container's token (storage refused it): the next sign fetches a new one
        (and so does every process that shares it, unless one has already)."""
        container = blob_container(href)
        if container is None:
            return
        with self._lock:
            held = self._tokens.pop(container, None)
            with self._shared(*container) as path:
                kept = _read(path)
                if path is not None and held is not None and kept is not None and kept[0] == held[0]:
                    path.unlink(missing_ok=True)

    @contextmanager
    def _shared(self, account: str, container: str) -> Iterator[Path | None]:
        """The file of the container's shared token, held locked; None where there is none
        (no folder, or one that is not this user's alone)."""
        folder = self.folder
        if folder is None:
            yield None
            return
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            status = folder.stat()
        except OSError:
            yield None
            return
        if status.st_uid != os.getuid() or status.st_mode & 0o077:  # another's, or open to others: not trusted
            yield None
            return
        name = hashlib.sha256(f"{self.endpoint}\n{account}\n{container}".encode()).hexdigest()[:32]
        lock = os.open(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield folder / f"{name}.json"
        finally:
            os.close(lock)  # and the lock with it

    def _fetch(self, account: str, container: str) -> tuple[str, float]:
        """A new token, asking a busy endpoint again after its Retry-After (else a backoff)."""
        url = f"{self.endpoint}/{account}/{container}"
        for attempt in range(1, TOKEN_TRIES + 1):
            try:
                response = httpx.get(url, headers=subscription_headers(url, self._key), timeout=30.0)
            except httpx.HTTPError as exc:
                raise StageFailure(FailureClass.CONNECTION, f"SAS token endpoint {redact(url)}: "
                                   f"{type(exc).__name__}") from None
            if response.status_code in BUSY:
                wait = retry_after(response)
                if attempt == TOKEN_TRIES or (wait is not None and wait > TOKEN_WAIT_S):
                    raise refused(url, response.status_code, f"SAS token endpoint answered HTTP "
                                  f"{response.status_code} (busy) {attempt} times")
                backoff = TOKEN_BACKOFF_S * 2 ** (attempt - 1)
                self._sleep(wait + random.uniform(0, TOKEN_BACKOFF_S) if wait is not None
                            else random.uniform(0, backoff))
                continue
            if response.status_code != 200:
                raise StageFailure(FailureClass.SOURCE_DOWNLOAD,
                                   f"SAS token endpoint {redact(url)} answered HTTP {response.status_code}")
            try:
                body = response.json()
                return str(body["token"]).lstrip("?"), datetime.fromisoformat(body["msft:expiry"]).timestamp()
            except (ValueError, KeyError, TypeError):
                raise StageFailure(FailureClass.SOURCE_DOWNLOAD,
                                   f"SAS token endpoint {redact(url)}: no token in its answer") from None
        raise AssertionError("unreachable")


def retry_after(response: httpx.Response) -> float | None:
    """The seconds a busy answer's ``Retry-After`` asks for (seconds, or an HTTP date), if any."""
    value = response.headers.get("retry-after", "").strip()
    if not value:
        return None
    if value.isdigit():
        return float(value)
    try:
        return max(0.0, (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds())
    except (TypeError, ValueError):
        return None


def _read(path: Path | None) -> Token | None:
    if path is None:
        return None
    try:
        found = json.loads(path.read_text())
        return str(found["token"]), float(found["expiry"]), float(found["renew"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write(path: Path | None, held: Token) -> None:
    """Keep a token for the other processes (whole or not at all), and drop long-expired ones."""
    if path is None:
        return
    written = path.with_suffix(f".{os.getpid()}.new")
    try:
        descriptor = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            json.dump({"token": held[0], "expiry": held[1], "renew": held[2]}, file)
        written.replace(path)
        for old in path.parent.glob("*.json"):
            if time.time() - old.stat().st_mtime > KEPT_TOKENS_S:
                old.unlink(missing_ok=True)
                old.with_suffix(".lock").unlink(missing_ok=True)
    except OSError:  # a full or read-only disk: the token is still this process's
        written.unlink(missing_ok=True)


class Earthdata:
    """GETs that carry an Earthdata bearer token to the allowed hosts only."""

    def __init__(self, token: str, hosts: frozenset[str]) -> None:
        self._token = unresolved(token, "earthdata_token")
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

    def __init__(self, sas_url: str, earthdata_token: str, earthdata_hosts: str, subscription_key: str = "",
                 token_folder: Path | None = None) -> None:
        """``token_folder``: where SAS tokens are shared with other processes (None: not shared)."""
        self.signer = SasSigner(sas_url, token_folder, unresolved(subscription_key, "pc_subscription_key")) \
            if sas_url else None
        self.earthdata = Earthdata(earthdata_token, frozenset(
            h.strip().lower() for h in earthdata_hosts.split(",") if h.strip()))

    def fetch(self, href: str) -> Fetched:
        if self.earthdata.allowed(href):  # first: a local archive's path looks like an emulator's blob
            return self._http(href, self.earthdata.get)
        if self.signer is not None and blob_container(href) is not None:
            return self._blob(href)
        return self._http(href, lambda url: httpx.get(url, timeout=TIMEOUT_S, follow_redirects=True))

    def _blob(self, href: str) -> Fetched:
        downloader, data = self._on_blob(href, lambda blob: _whole(blob.download_blob()))
        md5 = downloader.properties.content_settings.content_md5
        return Fetched(href, data, downloader.properties.size, bytes(md5) if md5 else None)

    def ranged(self, href: str) -> BlobFile | None:
        """The blob ``href`` names, to be read by byte ranges (its size and identity asked of
        storage now: a missing file fails here as a whole fetch would); None for an href that
        is not a signed blob's (NASA's files are fetched whole)."""
        if self.earthdata.allowed(href) or self.signer is None or blob_container(href) is None:
            return None
        properties = self._on_blob(href, lambda blob: blob.get_blob_properties())
        md5 = properties.content_settings.content_md5
        return BlobFile(href, properties.size, bytes(md5) if md5 else None, str(properties.etag), self)

    def _on_blob(self, href: str, call: Callable[[BlobClient], T]) -> T:
        """``call`` on the signed blob: a token storage refuses (expired or revoked) replaced
        once; storage's refusals classified — a missing file, a busy or refusing service, a
        connection lost (each after the SDK's own retries)."""
        assert self.signer is not None
        for attempt in (1, 2):
            try:
                return call(BlobClient.from_blob_url(self.signer.sign(href)))
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
def _access(sas_url: str, token: str, hosts: str, key: str) -> Access:
    return Access(sas_url, token, hosts, key, token_folder())


def access_for(settings: Settings) -> Access:
    """This process's Access for these settings: its SAS tokens live as long as the process,
    shared with the machine's other stage processes (:func:`token_folder`). Hrefs are signed
    only when they come from the STAC catalog (NASA's are not Blob URLs)."""
    return _access(settings.stac_sas_url if settings.catalog == "stac" else "", settings.earthdata_token,
                   settings.earthdata_hosts, settings.pc_subscription_key)
