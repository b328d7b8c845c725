"""The local stack's NASA: a CMR granule search, a DAAC archive behind Earthdata Login, and
the bucket the archive hands its files out from — each on a loopback address of its own, so
that they are different hosts, as they are in reality.

- **CMR** (127.0.0.1): ``/search/collections.json`` by ``short_name`` and ``version`` (the
  collections it holds: ``collections``, every product of the catalog; none for another);
  ``/search/granules.json`` with ``short_name``, ``version``,
  ``temporal``, ``bounding_box[]`` (``options[bounding_box][or]``) and ``page_size``, paged
  by the ``CMR-Search-After`` header; entries shaped as CMR's JSON answer, built from the
  granule's ECS metadata (the real ``.hdf.xml`` where ``data/modis`` has it), a synthesized
  granule's marked ``bagpipe:synthetic``.
- **The archive** (127.0.0.2): the layout of the DAAC the catalog names, NSIDC's for snow
  (``/DP4/MOST/MOD10A2.061/2022.02.02/…``), LP DAAC's for the others
  (``/lp-prod-protected/MOD13A1.061/{granule}/…``). Without a session it redirects to the
  login host's ``/oauth/authorize``; the login host (127.0.0.3) redirects back with a code
  only for a request bearing a valid token (else 401); the archive sets a session cookie
  and, with it, redirects to a pre-signed URL on the bucket host (127.0.0.4), which refuses
  any request that also carries an ``Authorization`` header (as S3 does) and records every
  header it is sent — a token arriving there is a leak the tests look for.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
import xml.etree.ElementTree as ElementTree
from datetime import date, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import RedirectResponse

from bagpipe import modis_world as world
from bagpipe.planetary import footprint
from pipeline.modis.cmr import DATA_REL, SEARCH_AFTER
from pipeline.modis.grid import Tile, tiles_for_bbox
from pipeline.modis.products import CATALOG, NSIDC, Product, last_day, periods
from pipeline.modis.synthetic import SYNTHETIC

SNOW_DAACS = {"MOD": "MOST", "MYD": "MOSA"}


class Earthdata:
    """CMR, archive, login and bucket; ``tokens``: the bearer tokens the login host accepts."""

    def __init__(self, tokens: set[str] | None = None, archive_port: int = 0) -> None:
        """``archive_port``: the archive's port, if free (the hrefs a planned task keeps name
        it: the local stack keeps it across restarts)."""
        from bagpipe.serving import Served

        self.tokens = tokens if tokens is not None else {secrets.token_urlsafe(24)}
        self.collections = {p.name: p for p in CATALOG.values()}  # what CMR knows, by short name (tests drop one)
        self.codes: dict[str, float] = {}
        self.sessions: set[str] = set()
        self.key = secrets.token_bytes(16)
        self.seen: list[tuple[str, str, dict[str, str]]] = []  # (service, path, headers) of each request
        self.lock = threading.Lock()
        self.cmr = Served(self._cmr(), "127.0.0.1", "cmr")
        self.archive = Served(self._archive(), "127.0.0.2", "archive", port=archive_port)
        self.login = Served(self._login(), "127.0.0.3", "login")
        self.bucket = Served(self._bucket(), "127.0.0.4", "bucket")

    @property
    def token(self) -> str:
        return next(iter(self.tokens))

    @property
    def cmr_url(self) -> str:
        return self.cmr.url + "/search/"

    @property
    def hosts(self) -> str:
        """The hosts the token may be sent to: the login host and the archive (not the bucket)."""
        return f"{self.archive.host},{self.login.host}"

    def start(self) -> Earthdata:
        for served in (self.cmr, self.archive, self.login, self.bucket):
            served.start()
        return self

    def stop(self) -> None:
        for served in (self.cmr, self.archive, self.login, self.bucket):
            served.stop()

    def __enter__(self) -> Earthdata:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _record(self, service: str, request: Request) -> None:
        with self.lock:
            self.seen.append((service, request.url.path, dict(request.headers)))

    # --- CMR -----------------------------------------------------------------------------
    def path_of(self, product: Product, name: str, day: date) -> str:
        if product.daac == NSIDC:
            return f"/DP4/{SNOW_DAACS[product.name[:3]]}/{product.name}.061/{day:%Y.%m.%d}/{name}.hdf"
        return f"/lp-prod-protected/{product.name}.061/{name}/{name}.hdf"

    def entry(self, product: Product, tile: str, day: date) -> dict[str, Any]:
        """A granule as CMR's JSON answer lists it (from its ECS metadata where it is real)."""
        name = world.granule_name(product, tile, day)
        end = last_day(product, day)  # a year's last composite ends with the year
        geometry, _ = footprint(Tile.parse(tile))
        polygon = " ".join(f"{lat} {lon}" for lon, lat in geometry["coordinates"][0])
        meta = {"title": f"SC:{product.name}.061:{int(hashlib.sha1(name.encode()).hexdigest()[:8], 16)}",
                "updated": f"{end + timedelta(days=2)}T00:00:00.000Z", "size": "1.0",
                "daac": product.daac}
        xml = world.REAL_DATA / f"{name}.hdf.xml"
        if xml.exists():
            root = ElementTree.parse(xml).getroot()
            meta |= {"title": root.findtext(".//GranuleUR"), "size": root.findtext(".//SizeMBECSDataGranule"),
                     "updated": (root.findtext(".//LastUpdate") or "").replace(" ", "T") + "Z",
                     "daac": f"{root.findtext('DataCenterId')}_ECS"}
            points = root.findall(".//GPolygon/Boundary/Point")
            polygon = " ".join(f"{p.findtext('PointLatitude')} {p.findtext('PointLongitude')}" for p in points)
        return ({} if world.is_real(name) else {SYNTHETIC: True}) | {
            "producer_granule_id": f"{name}.hdf", "title": meta["title"], "updated": meta["updated"],
            "time_start": f"{day}T00:00:00.000Z", "time_end": f"{end}T23:59:59.000Z",
            "dataset_id": f"{product.title} V061", "data_center": meta["daac"], "granule_size": meta["size"],
            "coordinate_system": "GEODETIC", "day_night_flag": "DAY", "online_access_flag": True,
            "browse_flag": False, "original_format": "ECHO10", "polygons": [[polygon]],
            "collection_concept_id": f"C0000000{len(product.name)}-{meta['daac']}",
            "id": f"G{int(hashlib.sha1(name.encode()).hexdigest()[:9], 16)}-{meta['daac']}",
            "links": [{"rel": DATA_REL, "type": "application/x-hdfeos", "hreflang": "en-US",
                       "title": f"{name}.hdf. MimeType: application/x-hdfeos",
                       "href": self.archive.url + self.path_of(product, name, day)}],
        }

    def _cmr(self) -> FastAPI:
        app = FastAPI(title="CMR (bagpipe's local imitation)")

        @app.get("/search/collections.json")
        def collections(request: Request, response: Response) -> dict[str, Any]:
            """The collections of a short name (and version), as CMR's JSON answer lists them."""
            query = request.query_params
            product = self.collections.get(query.get("short_name", ""))
            found = [product] if product and query.get("version", product.cmr_version) == product.cmr_version else []
            response.headers["CMR-Hits"] = str(len(found))
            return {"feed": {"updated": "", "id": str(request.url), "title": "ECHO dataset metadata", "entry": [
                {"id": f"C0000000{len(p.name)}-{p.daac}",
                 "short_name": p.name, "version_id": p.cmr_version, "title": f"{p.title} V{p.collection}",
                 "dataset_id": f"{p.title} V{p.collection}", "online_access_flag": True} for p in found]}}

        @app.get("/search/granules.json")
        def granules(request: Request, response: Response) -> dict[str, Any]:
            query = request.query_params
            product = self.collections.get(query.get("short_name", ""))
            if product is None or query.get("version") != product.cmr_version:
                return {"feed": {"entry": []}}
            start, end = (date.fromisoformat(v[:10]) for v in query.get("temporal", "2000-01-01,2100-12-31").split(","))
            boxes = [[float(v) for v in box.split(",")] for box in query.getlist("bounding_box[]")] or \
                [[-180.0, -90.0, 180.0, 90.0]]
            found = sorted({(tile.name, day) for box in boxes for tile in tiles_for_bbox(*box)
                            for day in periods(product, start, end) if world.exists(product, tile.name, day)},
                           key=lambda f: (f[1], f[0]))
            size = int(query.get("page_size", "10"))
            after = int(request.headers.get(SEARCH_AFTER, "0"))
            page = found[after:after + size]
            response.headers["CMR-Hits"] = str(len(found))
            if after + size < len(found):
                response.headers[SEARCH_AFTER] = str(after + size)
            return {"feed": {"updated": "", "id": str(request.url), "title": "ECHO granule metadata",
                             "entry": [self.entry(product, tile, day) for tile, day in page]}}

        return app

    # --- the archive, its login, its bucket ---------------------------------------------
    def _signature(self, path: str, expires: int) -> str:
        return hmac.new(self.key, f"{path}:{expires}".encode(), hashlib.sha256).hexdigest()

    def _archive(self) -> FastAPI:
        app = FastAPI(title="A DAAC archive (bagpipe's local imitation)")

        @app.get("/login")
        def login(request: Request, code: str = "", state: str = "/") -> Response:
            self._record("archive", request)
            with self.lock:
                issued = self.codes.pop(code, 0.0)
            if time.time() - issued > 60:
                raise HTTPException(401, "invalid code")
            session = secrets.token_urlsafe(16)
            with self.lock:
                self.sessions.add(session)
            answer = RedirectResponse(self.archive.url + state, status_code=302)
            answer.set_cookie("nsidc_session", session, httponly=True)
            return answer

        @app.get("/{path:path}")
        def data(path: str, request: Request) -> Response:
            self._record("archive", request)
            if request.cookies.get("nsidc_session") not in self.sessions:
                query = urlencode({"client_id": "bagpipe-local-archive", "response_type": "code",
                                   "redirect_uri": f"{self.archive.url}/login", "state": f"/{path}"})
                return RedirectResponse(f"{self.login.url}/oauth/authorize?{query}", status_code=302)
            product, tile, day = _granule_of(path)
            if not world.exists(product, tile, day) or \
                    world.granule_name(product, tile, day) + ".hdf" != path.rsplit("/", 1)[-1]:
                raise HTTPException(404, "no such granule")
            expires = int(time.time()) + 300
            query = urlencode({"X-Amz-Expires": expires, "X-Amz-Signature": self._signature(f"/{path}", expires)})
            return RedirectResponse(f"{self.bucket.url}/{path}?{query}", status_code=307)

        return app

    def _login(self) -> FastAPI:
        app = FastAPI(title="Earthdata Login (bagpipe's local imitation)")

        @app.get("/oauth/authorize")
        def authorize(request: Request, redirect_uri: str, state: str = "/") -> Response:
            self._record("login", request)
            bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
            if bearer not in self.tokens:
                raise HTTPException(401, "invalid_token")
            code = secrets.token_urlsafe(12)
            with self.lock:
                self.codes[code] = time.time()
            return RedirectResponse(f"{redirect_uri}?{urlencode({'code': code, 'state': state})}", status_code=302)

        return app

    def _bucket(self) -> FastAPI:
        app = FastAPI(title="The archive's bucket (bagpipe's local imitation)")

        @app.get("/{path:path}")
        def get(path: str, request: Request) -> Response:
            self._record("bucket", request)
            if "authorization" in request.headers:
                return Response("<Error><Code>InvalidArgument</Code><Message>Only one auth mechanism allowed"
                                "</Message></Error>", status_code=400, media_type="application/xml")
            expires = int(request.query_params.get("X-Amz-Expires", "0"))
            signature = request.query_params.get("X-Amz-Signature", "")
            if expires < time.time() or not hmac.compare_digest(signature, self._signature(f"/{path}", expires)):
                return Response("<Error><Code>AccessDenied</Code></Error>", status_code=403,
                                media_type="application/xml")
            data = world.hdf4(path.rsplit("/", 1)[-1].removesuffix(".hdf"))
            return Response(data, media_type="application/x-hdfeos")

        return app


def _granule_of(path: str) -> tuple[Product, str, date]:
    """(product, tile, day) of an archive path, by its file name."""
    name = path.rsplit("/", 1)[-1]
    short, stamp, tile = name.split(".")[:3]
    product = CATALOG.get(short)
    if product is None:
        raise HTTPException(404, "no such product")
    return product, tile, datetime.strptime(stamp[1:], "%Y%j").date()
