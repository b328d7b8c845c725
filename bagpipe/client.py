"""The command line's HTTP client of the request API, and the download of results."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from pipeline.modis import layout, mosaic, stacitems
from pipeline.storage import names, packing

DEFAULT_HOME = Path(".bagpipe")
STATE_FILE = "stack.json"  # where a running local stack says where its API is
TOKEN_FILE = "api-key"  # the local stack's admin's personal API token
OVERVIEWS = "overview"  # the results folder's overview pictures


def _last_up() -> Path:
    """Where ``bagpipe up`` records its home, for the command line run from any folder."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "bagpipe" / "home"


def record_home(home: Path) -> None:
    """Say that a local stack runs in ``home`` (``bagpipe up``, as it starts)."""
    path = _last_up()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(str(home.resolve()))


def forget_home(home: Path) -> None:
    """Take back what :func:`record_home` said of ``home`` (``bagpipe up``, as it stops),
    unless a later stack has said it runs elsewhere."""
    path = _last_up()
    try:
        if Path(path.read_text().strip()) == home.resolve():
            path.unlink()
    except OSError:
        pass


def find_home(home: Path) -> Path:
    """The local stack's home the command line talks to: ``home`` if it was named (``--home``)
    or holds a stack's state; else the nearest ``.bagpipe`` above the working folder that
    does; else the one the last ``bagpipe up`` recorded (run from any folder, the command
    line said to start a stack while one ran)."""
    if home != DEFAULT_HOME or (home / STATE_FILE).exists():
        return home
    for folder in Path.cwd().parents:
        if (folder / DEFAULT_HOME / STATE_FILE).exists():
            return folder / DEFAULT_HOME
    try:
        recorded = Path(_last_up().read_text().strip())
    except OSError:
        return home
    return recorded if (recorded / STATE_FILE).exists() else home


def token_in(home: Path) -> str | None:
    """The local admin's personal API token, if the stack in ``home`` has made one."""
    path = home / TOKEN_FILE
    return path.read_text().strip() if path.exists() else None


class ApiUnreachable(RuntimeError):
    """The API did not answer at all: no server at its address, or no address to reach."""


class ApiError(RuntimeError):
    def __init__(self, status: int, body: Any) -> None:
        detail = body.get("detail") if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.body = status, body


@dataclass
class Api:
    url: str
    key: str
    timeout: float = 60.0

    @classmethod
    def resolve(cls, url: str | None = None, key: str | None = None,
                home: Path = DEFAULT_HOME) -> Api:
        """The API to talk to and the personal API token to sign in with: flags, else
        BAGPIPE_API_URL/BAGPIPE_API_KEY, else the local stack started by ``bagpipe up`` in
        ``home`` (its admin's token; see :func:`find_home`)."""
        home = find_home(home) if not url else home
        url = url or os.environ.get(names.CLI_API_URL)
        key = key or os.environ.get(names.CLI_TOKEN) or token_in(home)
        state = home / STATE_FILE
        if not url and state.exists():
            try:
                found = json.loads(state.read_text())
            except ValueError as exc:
                raise RuntimeError(f"no API: {state} is not the local stack's state ({exc}): is it starting?") from exc
            if "pid" in found and not _alive(int(found["pid"])):
                raise RuntimeError(f"no API: the local stack of {home} has stopped (its {STATE_FILE} was left "
                                   "behind): start `bagpipe up`")
            url = found["api"]
        if not url:
            raise RuntimeError(f"no API: no local stack runs in {home}, above this folder, or where the last "
                               "`bagpipe up` ran: start one (`bagpipe up`), name its folder (--home), or name an API "
                               f"(--api, or {names.CLI_API_URL}) and your token (--key, or {names.CLI_TOKEN})")
        if not key:
            raise RuntimeError(f"no token for {url}: pass your personal API token (--key, or {names.CLI_TOKEN}; "
                               "`bagpipe tokens create` makes one)")
        return cls(url.rstrip("/"), key)

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        headers = {names.TOKEN_HEADER: self.key} | kwargs.pop("headers", {})
        try:
            response = httpx.request(method, f"{self.url}{path}", timeout=self.timeout, headers=headers, **kwargs)
        except (httpx.TransportError, httpx.InvalidURL) as exc:
            raise ApiUnreachable(f"the API at {self.url} did not answer ({exc or type(exc).__name__}): is its "
                                 "stack up (`bagpipe up`), or --api right?") from exc
        try:
            body = response.json() if response.content else None
        except ValueError:
            body = response.text
        if response.status_code >= 400:
            raise ApiError(response.status_code, body)
        return body

    def submit(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/api/jobs", json=request)

    def keep(self, kind: str, data: Any) -> dict[str, Any]:
        """Keep sites, zones or a region's polygon (``POST /api/vectors``): its digest."""
        return self._call("POST", "/api/vectors", json={"kind": kind, "data": data})

    def status(self, job: str) -> dict[str, Any]:
        return self._call("GET", f"/api/jobs/{job}")

    def cancel(self, job: str) -> dict[str, Any]:
        return self._call("POST", f"/api/jobs/{job}/cancel")

    def results(self, job: str) -> dict[str, Any]:
        return self._call("GET", f"/api/jobs/{job}/results")

    def text(self, link: str) -> str:
        """The text behind one of the API's short-lived links (a program's log), whatever
        bytes it wrote."""
        response = httpx.get(link, timeout=self.timeout)
        response.raise_for_status()
        return response.content.decode(errors="replace")

    def get(self, path: str, **params: Any) -> Any:
        return self._call("GET", path, params={k: v for k, v in params.items() if v not in (None, "")})

    def post(self, path: str, body: Any = None) -> Any:
        return self._call("POST", path, json=body)

    def delete(self, path: str) -> Any:
        return self._call("DELETE", path)

    def push(self, archive: bytes) -> dict[str, Any]:
        """Upload a reducer bundle (a tar.gz)."""
        return self._call("POST", "/api/reducers", content=archive, headers={"content-type": "application/gzip"})


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (another user's counts: it is there)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_SEGMENT = re.compile(r"^(?!\.{1,2}$)[A-Za-z0-9._+-]{1,200}$")  # one plain path segment, not . or ..


def _local_path(task: dict[str, Any], blob: str) -> Path:
    """Where a product goes under the results folder: product/tile/date(s)/name (a gather's
    table or cube: sites/, zones/ or cubes/name), each part a plain name; RuntimeError for a
    manifest that would put a file anywhere else."""
    parts = [layout.folder(task), blob.rsplit("/", 1)[-1]] if layout.is_gather(task) else [
        layout.folder(task), str(task["tile"]), layout.span(task), blob.rsplit("/", 1)[-1]]
    bad = [part for part in parts if not _SEGMENT.match(part)]
    if bad:
        raise RuntimeError(f"the manifest names a file outside the results folder ({bad[0]!r}): nothing written")
    return Path(*parts)


def download_results(api: Api, job: str, out: Path, parallel: int = 8,
                     progress: Callable[[int, int], None] | None = None) -> tuple[Path, int]:
    """Download every product of a finished job into ``out`` (as product/tile/date/name),
    write its STAC catalog beside them (``collection.json``, an item per product) and
    ``manifest.json`` naming the local files and the catalog. Small outputs come out of the job's
    packs by ranged reads (a few requests for thousands of files, each file checked against
    its MD5), the others one download each, ``parallel`` at a time; ``progress`` is told
    (products written, products) as they are. Returns (manifest path, products)."""
    found = api.results(job)
    out.mkdir(parents=True, exist_ok=True)
    packed = {name: packing.member_of(entry) for name, entry in found.pop("packed", {}).items()}
    pack_links = found.pop("pack_links", {})
    targets: dict[str, Path] = {}
    links: dict[str, str] = {}
    for task in found["tasks"]:
        task["files"] = []
        for blob, link in task.pop("links", {}).items():
            local = _local_path(task, blob)
            targets[blob] = out / local
            if blob not in packed:
                links[blob] = link
            task["files"].append(str(local))

    written = [0]
    counting = threading.Lock()

    def count() -> None:
        if progress is not None:
            with counting:
                written[0] += 1
                progress(written[0], len(targets))

    def write(blob: str, data: bytes) -> None:
        targets[blob].parent.mkdir(parents=True, exist_ok=True)
        targets[blob].write_bytes(data)
        count()

    def fetch_span(span: packing.Span) -> None:
        data = b""
        if span.end > span.start:  # else only empty members
            response = http.get(pack_links[span.pack], headers={"Range": f"bytes={span.start}-{span.end - 1}"})
            response.raise_for_status()
            data = response.content
        for blob, member in packing.unpack(span, data).items():
            write(blob, member)

    def fetch_one(blob: str) -> None:
        targets[blob].parent.mkdir(parents=True, exist_ok=True)
        with http.stream("GET", links[blob]) as response:
            response.raise_for_status()
            with open(targets[blob], "wb") as f:
                for chunk in response.iter_bytes():
                    f.write(chunk)
        count()

    wanted = {blob: member for blob, member in packed.items() if blob in targets}
    limits = httpx.Limits(max_connections=parallel, max_keepalive_connections=parallel)
    with httpx.Client(timeout=api.timeout, limits=limits) as http, ThreadPoolExecutor(parallel) as pool:
        list(pool.map(fetch_span, packing.spans(wanted)))
        list(pool.map(fetch_one, links))
    found.pop("manifest_url", None)
    for image in found.get("overviews", []):  # the region's pictures, with their legends
        image["file"] = f"{OVERVIEWS}/{image['picture'].rsplit('/', 1)[-1]}"
        if not _SEGMENT.match(image["file"].split("/")[1]):
            raise RuntimeError(f"the manifest names an overview outside the results folder: {image['file']!r}")
        (out / OVERVIEWS).mkdir(exist_ok=True)
        response = httpx.get(image.pop("links")["picture"], timeout=api.timeout)
        response.raise_for_status()
        (out / image["file"]).write_bytes(response.content)
    found["regions"] = mosaic.write_regions(out, found)  # the region as one layer per product and date
    stacitems.write_catalog(out, found)  # the job as a STAC collection beside its files
    manifest = out / "manifest.json"
    manifest.write_text(json.dumps(found, indent=1))
    return manifest, len(targets)
