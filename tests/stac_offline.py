"""Run a STAC validator (``stac-api-validator``, ``stac-validator``) with the JSON schemas it
fetches from the web served from local copies instead: the machines that run the tests reach
no network but package registries.

Run with the validators' own interpreter (``make setup`` installs them into
``.tools/stac``): ``.tools/stac/bin/python tests/stac_offline.py stac-api-validator ARGS…``;
or, in a process of its own, call :func:`serve_offline` (the openEO test suite's plugin does).
Both ways a schema is fetched are answered: ``requests``' and ``urllib``'s.
The core STAC schemas and GeoJSON's are the copies ``pystac`` ships (installed beside the
validators), the extensions' those of ``tests/fixtures/stac-schemas``; a schema asked for
that neither holds is answered 404 and named on stderr, so that a validation that needs it
fails saying which."""

from __future__ import annotations

import importlib.resources
import io
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import requests
from requests.adapters import HTTPAdapter

VENDORED = Path(__file__).resolve().parent / "fixtures" / "stac-schemas"
PYSTAC = importlib.resources.files("pystac.validation") / "jsonschemas"
_SPEC = re.compile(r"https://schemas\.stacspec\.org/v(?P<version>[^/]+)/[a-z]+-spec/json-schema/(?P<name>[a-z-]+\.json)")
_GEOJSON = re.compile(r"https://geojson\.org/schema/(?P<name>[A-Za-z]+\.json)")
_EXTENSION = re.compile(r"https://stac-extensions\.github\.io/(?P<path>[a-z-]+/v[^/]+/schema\.json)")
HOSTS = ("https://schemas.stacspec.org/", "https://geojson.org/", "https://stac-extensions.github.io/")


def local_copy(url: str) -> bytes | None:
    """The local copy of the schema at ``url``, if there is one."""
    url = url.split("#")[0]
    if match := _SPEC.fullmatch(url):
        found: Any = PYSTAC / "stac-spec" / f"v{match['version']}" / match["name"]
    elif match := _GEOJSON.fullmatch(url):
        found = PYSTAC / "geojson" / match["name"]
    elif match := _EXTENSION.fullmatch(url):
        found = VENDORED / match["path"]
    else:
        return None
    return found.read_bytes() if found.is_file() else None


_send = HTTPAdapter.send


def _send_offline(adapter: HTTPAdapter, request: requests.PreparedRequest, *args: Any, **kwargs: Any
                  ) -> requests.Response:
    url = request.url or ""
    if not url.startswith(HOSTS):
        return _send(adapter, request, *args, **kwargs)
    data = local_copy(url)
    if data is None:
        print(f"stac_offline: no local copy of {url}", file=sys.stderr)
    response = requests.Response()
    response.status_code, response.url, response.request = (200 if data is not None else 404), url, request
    response._content = data or b""
    response.headers["Content-Type"] = "application/json"
    return response


_urlopen = urllib.request.urlopen


def _urlopen_offline(url: Any, *args: Any, **kwargs: Any) -> Any:
    """``urllib``'s way to the same hosts (jsonschema's own retrieval of a ``$ref`` it cannot
    resolve in its registry: a relative reference between the core schemas), served the same."""
    address = url.full_url if isinstance(url, urllib.request.Request) else str(url)
    if not address.startswith(HOSTS):
        return _urlopen(url, *args, **kwargs)
    data = local_copy(address)
    if data is None:
        print(f"stac_offline: no local copy of {address}", file=sys.stderr)
        raise urllib.error.HTTPError(address, 404, "no local copy", {}, None)  # type: ignore[arg-type]
    return io.BytesIO(data)


def serve_offline() -> None:
    """Answer every request for a schema, by ``requests`` or ``urllib``, from the local copies."""
    HTTPAdapter.send = _send_offline  # type: ignore[method-assign]
    urllib.request.urlopen = _urlopen_offline


def main() -> None:
    serve_offline()
    tool, sys.argv = sys.argv[1], sys.argv[1:]
    if tool == "stac-api-validator":
        from stac_api_validator.__main__ import main as run
    elif tool == "stac-validator":
        from stac_validator.stac_validator import main as run
    else:
        raise SystemExit(f"stac_offline: no validator {tool!r}")
    run(prog_name=tool)


if __name__ == "__main__":
    main()
