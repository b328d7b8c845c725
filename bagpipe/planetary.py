"""The local stack's Planetary Computer: a STAC API and a SAS token endpoint, as Microsoft's
answer them (``/api/stac/v1``: landing page, conformance, collections, item search with
bbox, intersects, datetime, collections and paging; ``/api/sas/v1/token/{account}/{container}``:
``{"msft:expiry", "token"}``), built from Planetary Computer's 19 MODIS 6.1 collections as
recorded (``data/modis/stac/pc-modis-061-collections.json``) and the real items beside them,
and the storage account its assets live in. Products Planetary Computer does not have
(MOD13A2, MCD12Q1) it does not have either.

Items are made for every (product, tile, period) the imitated world has
(:mod:`bagpipe.modis_world`), named as Planetary Computer names them (id without the
production timestamp, assets ``{layer}`` → ``…/modis-061-cogs/{SHORT}/{hh}/{vv}/{yyyyddd}/{granule}_{layer}.tif``
and ``hdf`` → ``…/modis-061/…/{granule}.hdf``). A search answers from that metadata alone,
as fast whatever the span. The assets' hrefs name the imitation's storage account: Azurite
behind a pass-through (every request and answer of the Blob REST API forwarded as they are,
SAS checks included) that, where Azurite answers an authorized read 404 for a file the world
has, makes the file, stores it and answers again — so every file the catalog lists is there
when it is read, as on Planetary Computer, made once, and never made for a search alone.
Blobs are private: only a SAS token from the endpoint, short-lived (``token_minutes``),
reads them. ``GET /collections/{id}`` answers the collections it holds (``collections``; a test
may drop one), 404 for any other, as Planetary Computer does; the token endpoint can be made
to answer its rate limit (``busy_tokens``: 429 with ``Retry-After``), and its storage to lack a
file the catalog lists (``withheld``: a read of a blob whose name holds one of these words is
404 BlobNotFound, a granule listed but not there); every request's headers are kept (``seen``),
and the bytes its storage answered each blob's reads with are counted (``bytes_read``, by
``{container}/{blob}``: the tests see how much of a file a reader fetched).
"""

from __future__ import annotations

import json
import threading
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any
from urllib.parse import urlencode, urlsplit

import anyio
import httpx
import numpy as np
from azure.core.exceptions import ResourceExistsError
from azure.storage.blob import BlobServiceClient, ContainerSasPermissions, ContentSettings, generate_container_sas
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse

from bagpipe import modis_world as world
from bagpipe.azurite import ACCOUNT, ACCOUNT_KEY
from bagpipe.serving import Served
from pipeline.modis.granules import Granule
from pipeline.modis.grid import RADIUS, Tile, tiles_for_bbox
from pipeline.modis.products import CATALOG, Product, last_day, periods
from pipeline.modis.synthetic import SYNTHETIC
from pipeline.storage.transfer import md5_of

STAC = "/api/stac/v1"
SAS = "/api/sas/v1/token"
COGS, HDFS = "modis-061-cogs", "modis-061"
COG_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"
CONFORMS = ["https://api.stacspec.org/v1.0.0/core", "https://api.stacspec.org/v1.0.0/item-search",
            "https://api.stacspec.org/v1.0.0/collections", "https://api.stacspec.org/v1.0.0/ogcapi-features",
            "http://www.opengis.net/spec/ogcapi-features-1/1.0/conf/core",
            "http://www.opengis.net/spec/ogcapi-features-1/1.0/conf/geojson"]
MAX_LIMIT = 1000
COLLECTIONS = "pc-modis-061-collections.json"  # GET /collections's answer, its MODIS collections kept
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host"}


def _collections() -> dict[str, dict[str, Any]]:
    recorded = json.loads((world.STAC_DATA / COLLECTIONS).read_text())["collections"]
    return {c["id"]: c for c in recorded}


def _items() -> dict[str, dict[str, Any]]:
    """The real item of each collection: the template of the items made for it."""
    found = {}
    for path in sorted(world.STAC_DATA.glob("*.json")):
        item = json.loads(path.read_text())
        if item.get("type") == "Feature":
            found[item["collection"]] = item
    return found


@lru_cache(maxsize=1024)
def footprint(tile: Tile) -> tuple[dict[str, Any], list[float]]:
    """A tile's outline in lon/lat (GeoJSON) and its bbox, as far as it lies on the globe
    (kept per tile: callers only read it)."""
    x0, y0, x1, y1 = tile.bounds()
    t = np.linspace(0, 1, 17)
    xs = np.concatenate([x0 + (x1 - x0) * t, np.full(17, x1), x1 - (x1 - x0) * t, np.full(17, x0)])
    ys = np.concatenate([np.full(17, y1), y1 - (y1 - y0) * t, np.full(17, y0), y0 + (y1 - y0) * t])
    lat = np.degrees(ys / RADIUS)
    lon = np.clip(np.degrees(xs / (RADIUS * np.maximum(np.cos(np.radians(lat)), 1e-9))), -180, 180)
    ring = [[round(float(a), 6), round(float(b), 6)] for a, b in zip(lon, lat, strict=True)]
    return ({"type": "Polygon", "coordinates": [[*ring, ring[0]]]},
            [float(lon.min()), float(lat.min()), float(lon.max()), float(lat.max())])


class Planetary:
    """The imitation, on its own port; ``url`` is its base (``{url}/api/stac/v1``)."""

    def __init__(self, connection: str, token_minutes: float = 60.0, prefix: str = "", storage_port: int = 0) -> None:
        """``storage_port``: its storage account's port, if free (the hrefs a planned task keeps
        name it: the local stack keeps it across restarts)."""
        self.blobs = BlobServiceClient.from_connection_string(connection)
        self.token_minutes = token_minutes
        self.containers = {"cogs": f"{prefix}{COGS}", "hdf": f"{prefix}{HDFS}"}
        self.collections, self.templates = _collections(), _items()
        self.tokens_issued = 0
        self.busy_tokens = 0  # token requests still to answer 429 (its rate limit), Retry-After 1 s: tests set it
        self.withheld: set[str] = set()  # words of blob names its storage does not have (404): tests set them
        self.seen: deque[tuple[str, dict[str, str]]] = deque(maxlen=1000)  # (path, headers) of the last requests
        self.files_made = 0  # files made on their first read (the tests watch laziness)
        self.bytes_read: Counter[str] = Counter()  # bytes its storage answered reads of, by blob path
        self._making: dict[str, threading.Lock] = {}
        self._matching = lru_cache(maxsize=16)(self._match)
        self._lock = threading.Lock()
        for name in self.containers.values():
            try:
                self.blobs.create_container(name)
            except ResourceExistsError:
                pass
        # the kept port first: a port taken for any free one could otherwise be it
        self.storage = Served(self._storage(), name="planetary-storage", own_headers=False, port=storage_port)
        self.served = Served(self.app(), name="planetary")

    @property
    def url(self) -> str:
        return self.served.url

    @property
    def blob_url(self) -> str:
        """The blob endpoint of its storage account (``http://host:port/{account}``)."""
        return self.storage.url + urlsplit(self.blobs.url).path.rstrip("/")

    @property
    def stac_url(self) -> str:
        return self.url + STAC

    @property
    def sas_url(self) -> str:
        return self.url + SAS

    def start(self) -> Planetary:
        self.storage.start()
        self.served.start()
        return self

    def stop(self) -> None:
        self.served.stop()
        self.storage.stop()

    def __enter__(self) -> Planetary:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the catalog ---------------------------------------------------------------------
    def products_of(self, collection: str) -> list[Product]:
        return [p for p in CATALOG.values() if p.stac_collection == collection]

    def href(self, container: str, product: Product, tile: str, day: date, file: str) -> str:
        parsed = Tile.parse(tile)
        return (f"{self.blob_url}/{self.containers[container]}/{product.name}/{parsed.h:02d}/"
                f"{parsed.v:02d}/{day.year}{day.timetuple().tm_yday:03d}/{file}")

    def item(self, product: Product, tile: str, day: date) -> dict[str, Any]:
        name = world.granule_name(product, tile, day)
        template = self.templates.get(product.stac_collection, {})
        collection = self.collections[product.stac_collection]
        parsed = Tile.parse(tile)
        geometry, bbox = footprint(parsed)
        end = last_day(product, day)  # a year's last composite ends with the year
        assets = {layer.name: {
            "href": self.href("cogs", product, tile, day, f"{name}_{layer.name}.tif"), "type": COG_TYPE,
            "title": collection["item_assets"].get(layer.name, {}).get("title", layer.name), "roles": ["data"],
            "raster:bands": collection["item_assets"].get(layer.name, {}).get("raster:bands", [])}
            for layer in product.layers}
        assets["hdf"] = {"href": self.href("hdf", product, tile, day, f"{name}.hdf"), "type": "application/x-hdf",
                         "roles": ["data"], "title": "Source data containing all bands"}
        properties = {k: v for k, v in template.get("properties", {}).items() if not k.startswith("proj:")}
        properties |= {
            "start_datetime": f"{day.isoformat()}T00:00:00Z", "end_datetime": f"{end.isoformat()}T23:59:59Z",
            "datetime": None, "platform": product.platform, "instruments": ["modis"],
            "modis:horizontal-tile": parsed.h, "modis:vertical-tile": parsed.v,
            "modis:tile-id": f"51{parsed.h:03d}{parsed.v:03d}",
        }
        if not world.is_real(name):
            properties[SYNTHETIC] = True
        item_id = f"{product.name}.A{day.year}{day.timetuple().tm_yday:03d}.{tile}.{product.collection}"
        return {"type": "Feature", "stac_version": "1.0.0", "stac_extensions": template.get("stac_extensions", []),
                "id": item_id, "collection": product.stac_collection, "geometry": geometry, "bbox": bbox,
                "properties": properties, "assets": assets,
                "links": [{"rel": "collection", "href": f"{self.stac_url}/collections/{product.stac_collection}",
                           "type": "application/json"},
                          {"rel": "self", "href": f"{self.stac_url}/collections/{product.stac_collection}/items/"
                                                  f"{item_id}", "type": "application/geo+json"}]}

    def matching(self, collections: list[str], boxes: list[list[float]], start: date, end: date
                 ) -> list[tuple[str, str, date]]:
        """(product, tile, day) of every granule a search matches, in the order pages list them
        (worked out once per search, not once per page)."""
        hour = datetime.now(UTC).strftime("%Y%m%d%H")  # granules are produced as time goes: an answer kept an hour
        return self._matching(tuple(collections), tuple(tuple(b) for b in boxes), start, end, hour)

    def _match(self, collections: tuple[str, ...], boxes: tuple[tuple[float, ...], ...], start: date, end: date,
               hour: str) -> list[tuple[str, str, date]]:
        found = set()
        for collection in collections:
            for product in self.products_of(collection) if collection in self.collections else []:
                days = periods(product, start, end)
                tiles = {tile.name for box in boxes for tile in tiles_for_bbox(*box)}
                found |= {(product.name, tile, day) for tile in tiles for day in days
                          if world.exists(product, tile, day)}
        return sorted(found, key=lambda f: (f[2], f[0], f[1]))

    def maker(self, container: str, blob: str) -> Callable[[], bytes] | None:
        """What makes the file at ``container``/``blob``, if the imitated archive has one there
        (a layer's COG or the granule's HDF4 file, at the path its item names)."""
        kind = next((k for k, c in self.containers.items() if c == container), None)
        file = blob.rsplit("/", 1)[-1]
        name, _, layer = file.removesuffix(".tif").removesuffix(".hdf").partition("_")
        granule = Granule.named(name, {})
        product = CATALOG.get(granule.product) if granule else None
        if kind is None or granule is None or product is None or \
                not world.exists(product, granule.tile, granule.day) or \
                world.granule_name(product, granule.tile, granule.day) != name:
            return None
        if kind == "hdf" and file == f"{name}.hdf":
            make = lambda: world.hdf4(name)  # noqa: E731
        elif kind == "cogs" and layer in product.layer_names and file == f"{name}_{layer}.tif":
            make = lambda: world.cog(name, layer)  # noqa: E731
        else:
            return None
        expected = self.href(kind, product, granule.tile, granule.day, file)
        return make if expected == f"{self.blob_url}/{container}/{blob}" else None

    def materialize(self, container: str, blob: str) -> bool:
        """Store a file the imitated archive has, on its first read (on Planetary Computer it
        is there already); made once however many readers ask at the same time. False: the
        archive has no such file."""
        make = self.maker(container, blob)
        if make is None:
            return False
        with self._lock:
            lock = self._making.setdefault(blob, threading.Lock())
        with lock:
            client = self.blobs.get_blob_client(container, blob)
            if not client.exists():
                data = make()
                try:
                    client.upload_blob(data, overwrite=False,
                                       content_settings=ContentSettings(content_md5=bytearray(md5_of(data))))
                except ResourceExistsError:
                    pass
                with self._lock:
                    self.files_made += 1
        with self._lock:
            self._making.pop(blob, None)
        return True

    def search(self, params: dict[str, Any], base: str, method: str) -> dict[str, Any]:
        collections = params.get("collections") or list(self.collections)
        if isinstance(collections, str):
            collections = collections.split(",")
        boxes = _boxes(params)
        start, end = _interval(params.get("datetime"))
        limit = min(int(params.get("limit") or 10), MAX_LIMIT)
        offset = int(params.get("token") or 0)
        matches = self.matching(collections, boxes, start, end)
        page = [self.item(CATALOG[short], tile, day) for short, tile, day in matches[offset:offset + limit]]
        links = []
        if offset + limit < len(matches):
            nxt = {**params, "token": str(offset + limit)}
            links.append({"rel": "next", "type": "application/geo+json", "method": "POST", "body": nxt,
                          "merge": False, "href": base} if method == "POST" else
                         {"rel": "next", "type": "application/geo+json", "method": "GET",
                          "href": f"{base}?{urlencode({k: _flat(v) for k, v in nxt.items()})}"})
        return {"type": "FeatureCollection", "features": page, "links": links, "numberMatched": len(matches),
                "numberReturned": len(page)}

    # --- SAS tokens ----------------------------------------------------------------------
    def token(self, account: str, container: str) -> dict[str, str]:
        if account != ACCOUNT or container not in self.containers.values():
            raise HTTPException(404, f"no container {account}/{container}")
        expiry = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=self.token_minutes)
        sas = generate_container_sas(ACCOUNT, container, account_key=ACCOUNT_KEY,
                                     permission=ContainerSasPermissions(read=True), expiry=expiry,
                                     start=datetime.now(UTC) - timedelta(minutes=5))
        with self._lock:
            self.tokens_issued += 1
        return {"msft:expiry": expiry.isoformat().replace("+00:00", "Z"), "token": sas}

    # --- its storage account ------------------------------------------------------------
    def _storage(self) -> FastAPI:
        """Azurite, passed through as it is; a file the world has is made on its first read."""
        parts = urlsplit(self.blobs.url)
        upstream = f"{parts.scheme}://{parts.netloc}"
        account = parts.path.strip("/")
        clients: list[httpx.AsyncClient] = []

        @asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            async with httpx.AsyncClient(timeout=120.0) as client:
                clients.append(client)
                yield

        app = FastAPI(title="Planetary Computer's storage (bagpipe's local imitation)", openapi_url=None,
                      lifespan=lifespan)

        async def forward(request: Request, body: bytes) -> tuple[int, dict[str, str], bytes]:
            http = clients[0]
            url = upstream + request.scope["raw_path"].decode() + (f"?{request.url.query}" if request.url.query else "")
            headers = [(k, v) for k, v in request.headers.raw if k.decode().lower() not in HOP_BY_HOP]
            try:
                sent = await http.send(http.build_request(request.method, url, headers=headers, content=body),
                                       stream=True)
            except httpx.TransportError:  # Azurite out of reach: the storage service says it is busy
                return 503, {"content-type": "application/xml", "x-ms-error-code": "ServerBusy"}, (
                    b'<?xml version="1.0" encoding="utf-8"?><Error><Code>ServerBusy</Code>'
                    b"<Message>The server is currently unable to receive requests.</Message></Error>")
            try:
                raw = b"".join([chunk async for chunk in sent.aiter_raw()])  # as stored: nothing decoded
            finally:
                await sent.aclose()
            return sent.status_code, {k: v for k, v in sent.headers.items() if k.lower() not in HOP_BY_HOP}, raw

        @app.api_route("/{path:path}", methods=["GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS"])
        async def blob(path: str, request: Request) -> Response:
            if request.method in ("GET", "HEAD") and any(word in path for word in self.withheld):
                return Response(b"", status_code=404, headers={"x-ms-error-code": "BlobNotFound"})
            body = await request.body()
            status, headers, raw = await forward(request, body)
            segments = path.split("/", 2)
            if status == 404 and request.method in ("GET", "HEAD") and len(segments) == 3 and segments[0] == account \
                    and await anyio.to_thread.run_sync(self.materialize, segments[1], segments[2]):
                status, headers, raw = await forward(request, body)
            if request.method == "GET" and status in (200, 206):
                with self._lock:
                    self.bytes_read[path.split("/", 1)[-1]] += len(raw)
            return Response(raw, status_code=status, headers=headers)

        return app

    def app(self) -> FastAPI:
        app = FastAPI(title="Planetary Computer (bagpipe's local imitation)")

        @app.middleware("http")
        async def record(request: Request, call_next: Callable[[Request], Any]) -> Response:
            with self._lock:
                self.seen.append((request.url.path, dict(request.headers)))
            answer: Response = await call_next(request)
            return answer
        links = lambda: [  # noqa: E731
            {"rel": "self", "href": f"{self.stac_url}/", "type": "application/json"},
            {"rel": "root", "href": f"{self.stac_url}/", "type": "application/json"},
            {"rel": "conformance", "href": f"{self.stac_url}/conformance", "type": "application/json"},
            {"rel": "data", "href": f"{self.stac_url}/collections", "type": "application/json"},
            {"rel": "search", "href": f"{self.stac_url}/search", "type": "application/geo+json", "method": "GET"},
            {"rel": "search", "href": f"{self.stac_url}/search", "type": "application/geo+json", "method": "POST"},
        ] + [{"rel": "child", "href": f"{self.stac_url}/collections/{c}", "type": "application/json"}
             for c in self.collections]

        @app.get(STAC)
        @app.get(STAC + "/")
        def landing() -> dict[str, Any]:
            return {"type": "Catalog", "id": "microsoft-pc", "stac_version": "1.0.0",
                    "title": "Planetary Computer STAC API (local imitation)", "description": "MODIS 6.1",
                    "conformsTo": CONFORMS, "links": links()}

        @app.get(STAC + "/conformance")
        def conformance() -> dict[str, Any]:
            return {"conformsTo": CONFORMS}

        @app.get(STAC + "/collections")
        def collections() -> dict[str, Any]:
            return {"collections": list(self.collections.values()), "links": links()}

        @app.get(STAC + "/collections/{collection}")
        def collection(collection: str) -> dict[str, Any]:
            if collection not in self.collections:
                raise HTTPException(404, f"no collection {collection}")
            return self.collections[collection]

        @app.get(STAC + "/search")
        def search_get(request: Request) -> dict[str, Any]:
            return self.search(dict(request.query_params), f"{self.stac_url}/search", "GET")

        @app.post(STAC + "/search")
        async def search_post(request: Request) -> dict[str, Any]:
            return self.search(await request.json(), f"{self.stac_url}/search", "POST")

        @app.get(SAS + "/{account}/{container}")
        def token(account: str, container: str) -> Response:
            with self._lock:
                busy, self.busy_tokens = self.busy_tokens > 0, max(0, self.busy_tokens - 1)
            if busy:  # as Azure API Management answers past the rate limit
                return JSONResponse({"statusCode": 429, "message": "Rate limit is exceeded. Try again in 1 seconds."},
                                    429, headers={"Retry-After": "1"})
            return JSONResponse(self.token(account, container))

        return app


def _flat(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return value if isinstance(value, str) else json.dumps(value)


def _boxes(params: dict[str, Any]) -> list[list[float]]:
    """The search's lon/lat boxes: its bbox (cut at ±180° if it crosses), or the boxes of its
    ``intersects`` polygons."""
    if params.get("intersects"):
        geometry = params["intersects"]
        geometry = json.loads(geometry) if isinstance(geometry, str) else geometry
        polygons = geometry["coordinates"] if geometry["type"] == "MultiPolygon" else [geometry["coordinates"]]
        boxes = []
        for polygon in polygons:
            xs, ys = [p[0] for p in polygon[0]], [p[1] for p in polygon[0]]
            boxes.append([min(xs), min(ys), max(xs), max(ys)])
        return boxes
    bbox = params.get("bbox")
    if not bbox:
        return [[-180.0, -90.0, 180.0, 90.0]]
    west, south, east, north = (float(v) for v in (bbox.split(",") if isinstance(bbox, str) else bbox))
    return [[west, south, east, north]] if west <= east else [[west, south, 180.0, north], [-180.0, south, east, north]]


def _interval(text: str | None) -> tuple[date, date]:
    if not text:
        return date(2000, 1, 1), date(2100, 12, 31)
    ends = text.split("/") if "/" in text else [text, text]
    parse = lambda v, d: d if v in ("", "..") else datetime.fromisoformat(v.replace("Z", "+00:00")).date()  # noqa: E731
    return parse(ends[0], date(2000, 1, 1)), parse(ends[1], date(2100, 12, 31))
