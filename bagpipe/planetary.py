"""The local stack's Planetary Computer: a STAC API and a SAS token endpoint, as Microsoft's
answer them (``/api/stac/v1``: landing page, conformance, collections, item search with
bbox, intersects, datetime, collections and paging; ``/api/sas/v1/token/{account}/{container}``:
``{"msft:expiry", "token"}``), built from the real collections and items in
``data/modis/stac/``.

Items are made for every (product, tile, period) the imitated world has
(:mod:`bagpipe.modis_world`), named as Planetary Computer names them (id without the
production timestamp, assets ``{layer}`` → ``…/modis-061-cogs/{SHORT}/{hh}/{vv}/{yyyyddd}/{granule}_{layer}.tif``),
their assets in Azurite: a search uploads the COGs of the items it answers with (once),
as they would be there already. Blobs are private: only a SAS token from the endpoint,
short-lived (``token_minutes``), reads them.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import numpy as np
from azure.core.exceptions import ResourceExistsError
from azure.storage.blob import BlobServiceClient, ContainerSasPermissions, ContentSettings, generate_container_sas
from fastapi import FastAPI, HTTPException, Request

from bagpipe import modis_world as world
from bagpipe.azurite import ACCOUNT, ACCOUNT_KEY
from bagpipe.serving import Served
from pipeline.grid import RADIUS, Tile, tiles_for_bbox
from pipeline.products import CATALOG, Product, periods
from pipeline.transfer import md5_of

STAC = "/api/stac/v1"
SAS = "/api/sas/v1/token"
COGS, HDFS = "modis-061-cogs", "modis-061"
COG_TYPE = "image/tiff; application=geotiff; profile=cloud-optimized"
CONFORMS = ["https://api.stacspec.org/v1.0.0/core", "https://api.stacspec.org/v1.0.0/item-search",
            "https://api.stacspec.org/v1.0.0/collections", "https://api.stacspec.org/v1.0.0/ogcapi-features",
            "http://www.opengis.net/spec/ogcapi-features-1/1.0/conf/core",
            "http://www.opengis.net/spec/ogcapi-features-1/1.0/conf/geojson"]
MAX_LIMIT = 1000


def _collections() -> dict[str, dict[str, Any]]:
    return {(c := json.loads(p.read_text()))["id"]: c for p in sorted(world.STAC_DATA.glob("*.collection.json"))}


def _items() -> dict[str, dict[str, Any]]:
    """The real item of each collection: the template of the items made for it."""
    found = {}
    for path in sorted(world.STAC_DATA.glob("*.json")):
        item = json.loads(path.read_text())
        if item.get("type") == "Feature":
            found[item["collection"]] = item
    return found


def footprint(tile: Tile) -> tuple[dict[str, Any], list[float]]:
    """A tile's outline in lon/lat (GeoJSON) and its bbox, as far as it lies on the globe."""
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

    def __init__(self, connection: str, token_minutes: float = 60.0, prefix: str = "") -> None:
        self.blobs = BlobServiceClient.from_connection_string(connection)
        self.token_minutes = token_minutes
        self.containers = {"cogs": f"{prefix}{COGS}", "hdf": f"{prefix}{HDFS}"}
        self.collections, self.templates = _collections(), _items()
        self.tokens_issued = 0
        self._uploaded: set[str] = set()
        self._lock = threading.Lock()
        for name in self.containers.values():
            try:
                self.blobs.create_container(name)
            except ResourceExistsError:
                pass
        self.served = Served(self.app(), name="planetary")

    @property
    def url(self) -> str:
        return self.served.url

    @property
    def stac_url(self) -> str:
        return self.url + STAC

    @property
    def sas_url(self) -> str:
        return self.url + SAS

    def start(self) -> Planetary:
        self.served.start()
        return self

    def stop(self) -> None:
        self.served.stop()

    def __enter__(self) -> Planetary:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the catalog ---------------------------------------------------------------------
    def products_of(self, collection: str) -> list[Product]:
        return [p for p in CATALOG.values() if p.stac_collection == collection]

    def href(self, container: str, product: Product, tile: str, day: date, file: str) -> str:
        parsed = Tile.parse(tile)
        return (f"{self.blobs.url.rstrip('/')}/{self.containers[container]}/{product.name}/{parsed.h:02d}/"
                f"{parsed.v:02d}/{day.year}{day.timetuple().tm_yday:03d}/{file}")

    def item(self, product: Product, tile: str, day: date) -> dict[str, Any]:
        name = world.granule_name(product, tile, day)
        template = self.templates.get(product.stac_collection, {})
        collection = self.collections[product.stac_collection]
        parsed = Tile.parse(tile)
        geometry, bbox = footprint(parsed)
        end = day + timedelta(days=product.period_days - 1)
        assets = {layer.name: {
            "href": self.href("cogs", product, tile, day, f"{name}_{layer.name}.tif"), "type": COG_TYPE,
            "title": collection["item_assets"].get(layer.name, {}).get("title", layer.name), "roles": ["data"],
            "raster:bands": collection["item_assets"].get(layer.name, {}).get("raster:bands", [])}
            for layer in product.layers}
        if world.real_file(name):  # the original HDF4, where the real file is at hand
            assets["hdf"] = {"href": self.href("hdf", product, tile, day, f"{name}.hdf"), "type": "application/x-hdf",
                             "roles": ["data"], "title": "Source data containing all bands"}
        properties = {k: v for k, v in template.get("properties", {}).items() if not k.startswith("proj:")}
        properties |= {
            "start_datetime": f"{day.isoformat()}T00:00:00Z", "end_datetime": f"{end.isoformat()}T23:59:59Z",
            "datetime": None, "platform": product.platform, "instruments": ["modis"],
            "modis:horizontal-tile": parsed.h, "modis:vertical-tile": parsed.v,
            "modis:tile-id": f"5{'1' if product.pixels == 2400 else '2'}{parsed.h:03d}{parsed.v:03d}",
        }
        item_id = f"{product.name}.A{day.year}{day.timetuple().tm_yday:03d}.{tile}.{product.collection}"
        return {"type": "Feature", "stac_version": "1.0.0", "stac_extensions": template.get("stac_extensions", []),
                "id": item_id, "collection": product.stac_collection, "geometry": geometry, "bbox": bbox,
                "properties": properties, "assets": assets,
                "links": [{"rel": "collection", "href": f"{self.stac_url}/collections/{product.stac_collection}",
                           "type": "application/json"},
                          {"rel": "self", "href": f"{self.stac_url}/collections/{product.stac_collection}/items/"
                                                  f"{item_id}", "type": "application/geo+json"}]}

    def matching(self, collections: list[str], boxes: list[list[float]], start: date, end: date
                 ) -> list[tuple[Product, str, date]]:
        found = set()
        for collection in collections:
            for product in self.products_of(collection):
                days = periods(product, start, end)
                for box in boxes:
                    for tile in tiles_for_bbox(*box):
                        found |= {(product, tile.name, day) for day in days if world.exists(product, tile.name, day)}
        return sorted(found, key=lambda f: (f[2], f[0].name, f[1]))

    def materialize(self, item: dict[str, Any]) -> None:
        """Upload an item's assets (once): on Planetary Computer they are there already."""
        for key, asset in item["assets"].items():
            href = asset["href"]
            with self._lock:
                if href in self._uploaded:
                    continue
            container, blob = href.removeprefix(self.blobs.url.rstrip("/") + "/").split("/", 1)
            name = blob.rsplit("/", 1)[-1]
            data = world.hdf4(name.removesuffix(".hdf")) if key == "hdf" else \
                world.cog(name.removesuffix(f"_{key}.tif"), key)
            try:
                self.blobs.get_blob_client(container, blob).upload_blob(
                    data, overwrite=False, content_settings=ContentSettings(content_md5=bytearray(md5_of(data))))
            except ResourceExistsError:
                pass
            with self._lock:
                self._uploaded.add(href)

    def search(self, params: dict[str, Any], base: str, method: str) -> dict[str, Any]:
        collections = params.get("collections") or list(self.collections)
        if isinstance(collections, str):
            collections = collections.split(",")
        boxes = _boxes(params)
        start, end = _interval(params.get("datetime"))
        limit = min(int(params.get("limit") or 10), MAX_LIMIT)
        offset = int(params.get("token") or 0)
        matches = self.matching(collections, boxes, start, end)
        page = [self.item(*m) for m in matches[offset:offset + limit]]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(self.materialize, page))
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

    def app(self) -> FastAPI:
        app = FastAPI(title="Planetary Computer (bagpipe's local imitation)")
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
        def token(account: str, container: str) -> dict[str, str]:
            return self.token(account, container)

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
