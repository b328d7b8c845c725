"""Every finished job as a STAC API collection (``/api/stac``): core, collections, OGC API
features and item search, over the caller's own jobs, so that a job opens where it lives —
``pystac_client.Client.open(url, headers={"Authorization": "Bearer TOKEN"})``, then
``odc.stac.load`` of its items — with nothing downloaded first.

A job's items are made once, at the first answer that needs them: ``rio-stac`` reads each
product's header through a link (``stacitems.build_item``, the same items ``bagpipe
results`` writes beside the files), and they are kept beside the manifest
(``names.stac_blob``) with each asset named by its blob. Every answer signs the assets anew
with short-lived SAS links, so nothing stored holds a signature. The region mosaics are not
among them: ``bagpipe results`` makes those from the downloaded tiles.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import pystac
import rasterio
import shapely.errors
import shapely.geometry
from azure.core.exceptions import ResourceNotFoundError
from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from shapely.geometry.base import BaseGeometry

from pipeline.lifecycle import jobs, results
from pipeline.modis import stacitems
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web.identity import Caller

STAC_VERSION = "1.1.0"
CONFORMS = [
    "https://api.stacspec.org/v1.0.0/core",
    "https://api.stacspec.org/v1.0.0/collections",
    "https://api.stacspec.org/v1.0.0/ogcapi-features",
    "https://api.stacspec.org/v1.0.0/item-search",
    "http://www.opengis.net/spec/ogcapi-features-1/1.0/conf/core",
    "http://www.opengis.net/spec/ogcapi-features-1/1.0/conf/geojson",
]
GEOJSON, JSON = "application/geo+json", "application/json"
PAGE, MAX_PAGE = 100, 1000  # items per answer: by default, at most
JOBS = 100  # the newest finished jobs a listing or a search without collections looks at
READERS = 8  # product headers read at once when a job's items are made
# each product is read by a link: no listing of its "directory" (a SAS link has none), few retries
GDAL_OPTIONS = {"GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR", "GDAL_HTTP_MAX_RETRY": "3",
                "GDAL_HTTP_RETRY_DELAY": "1"}


def made(clients: Clients, job: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The job's collection and items as stored (asset hrefs: the products' blob names),
    made and stored at the first ask."""
    try:
        data, _ = clients.transfers.download(clients.products, names.stac_blob(job))
        found: dict[str, Any] = json.loads(data)
        return found
    except ResourceNotFoundError:  # not made yet (two first asks make the same content)
        pass
    found = make(clients, job, manifest)
    clients.transfers.upload(clients.products, names.stac_blob(job), json.dumps(found).encode(), JSON)
    return found


def make(clients: Clients, job: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Read each product's header through a link and describe the job as STAC."""
    catalog = manifest.get("catalog") or {}
    by_key = {task["task"]: task for task in manifest["tasks"]}
    sign = _signer(clients)

    def item_of(task: dict[str, Any]) -> dict[str, Any] | None:
        links = {sign(output): output for output in task.get("outputs", [])}
        deps = stacitems.dependencies(task, by_key)
        with rasterio.Env(**GDAL_OPTIONS):
            item = stacitems.build_item(task, list(links), catalog,
                                        [g for dep in deps for g in stacitems.granule_ids(dep)])
        if item is None:
            return None
        for asset in item.assets.values():
            asset.href = links[asset.href]
        item.collection_id = job
        found = item.to_dict(include_self_link=False, transform_hrefs=False)
        found["links"] = [{"rel": "derived_from", "href": stacitems.item_id(dep), "type": GEOJSON}
                          for dep in deps if any(_is_raster(o) for o in dep.get("outputs", []))]
        return found

    with ThreadPoolExecutor(READERS) as pool:
        items = [item for item in pool.map(item_of, manifest["tasks"]) if item is not None]
    collection = stacitems.build_collection(manifest, [pystac.Item.from_dict(i) for i in items])
    collection.clear_links()
    return {"collection": collection.to_dict(include_self_link=False, transform_hrefs=False), "items": items}


def _is_raster(output: str) -> bool:
    """Whether an output is a raster, and so makes an item."""
    return output.lower().endswith(stacitems.RASTERS)


# --- what an answer holds ---------------------------------------------------------------------
def _collection(base: str, stored: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = copy.deepcopy(stored["collection"])
    job = found["id"]
    found["links"] = [
        {"rel": "self", "href": f"{base}/collections/{job}", "type": JSON},
        {"rel": "root", "href": base, "type": JSON},
        {"rel": "parent", "href": base, "type": JSON},
        {"rel": "items", "href": f"{base}/collections/{job}/items", "type": GEOJSON},
    ]
    return found


def _item(base: str, item: dict[str, Any], sign: Callable[[str], str]) -> dict[str, Any]:
    found = copy.deepcopy(item)
    job = found["collection"]
    for asset in found["assets"].values():
        asset["href"] = sign(asset["href"])
    found["links"] = [{"rel": link["rel"], "href": f"{base}/collections/{job}/items/{link['href']}", "type": GEOJSON}
                      for link in found["links"]] + [
        {"rel": "self", "href": f"{base}/collections/{job}/items/{found['id']}", "type": GEOJSON},
        {"rel": "parent", "href": f"{base}/collections/{job}", "type": JSON},
        {"rel": "collection", "href": f"{base}/collections/{job}", "type": JSON},
        {"rel": "root", "href": base, "type": JSON},
    ]
    return found


def _signer(clients: Clients) -> Callable[[str], str]:
    return lambda output: results.sas_url(clients, *results.locate(clients, output))


def _page(base: str, items: list[dict[str, Any]], offset: int, limit: int, sign: Callable[[str], str],
          next_link: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    """One page of items, a FeatureCollection; its ``next`` link is ``next_link(offset)``."""
    chosen = items[offset:offset + limit]
    links: list[dict[str, Any]] = [{"rel": "root", "href": base, "type": JSON}]
    if offset + limit < len(items):
        links.append(next_link(offset + limit))
    return {"type": "FeatureCollection", "features": [_item(base, item, sign) for item in chosen],
            "numberMatched": len(items), "numberReturned": len(chosen), "links": links}


# --- search -----------------------------------------------------------------------------------
class Search(BaseModel):
    """An item search (STAC API item-search): every field optional, as the specification has it."""

    model_config = ConfigDict(extra="ignore")
    collections: list[str] | None = None
    ids: list[str] | None = None
    bbox: list[float] | None = Field(default=None, min_length=4, max_length=4)  # west > east: across ±180°
    intersects: dict[str, Any] | None = None  # a GeoJSON geometry (not with bbox)
    datetime: str | None = None
    limit: int = Field(default=PAGE, ge=1, le=MAX_PAGE)
    token: int = Field(default=0, ge=0)  # the offset of the page (the next link's)


def _span(text: str | None) -> tuple[datetime | None, datetime | None]:
    """An instant or an interval (``a/b``, open ends ``..``), as RFC 3339; 400 naming the field."""
    if not text:
        return None, None
    try:
        ends = [None if part in ("", "..") else pystac.utils.str_to_datetime(part) for part in text.split("/")]
    except ValueError as exc:
        raise HTTPException(400, f"datetime: {exc}") from None
    if len(ends) > 2 or (len(ends) == 2 and ends[0] and ends[1] and ends[0] > ends[1]):
        raise HTTPException(400, f"datetime: {text!r} is neither an instant nor an interval start/end")
    return (ends[0], ends[0]) if len(ends) == 1 else (ends[0], ends[1])


def _region(search: Search) -> BaseGeometry | None:
    """The geometry a search's ``intersects`` names, or None; 400 naming the field."""
    if search.intersects is None:
        return None
    if search.bbox is not None:
        raise HTTPException(400, "bbox, intersects: one or the other, not both")
    try:
        return shapely.geometry.shape(search.intersects)
    except (AttributeError, KeyError, TypeError, ValueError, shapely.errors.ShapelyError) as exc:
        raise HTTPException(400, f"intersects: not a GeoJSON geometry ({exc})") from None


def _lons(west: float, east: float) -> list[tuple[float, float]]:
    """A box's longitudes as ranges: two for one across ±180° (west > east)."""
    return [(west, east)] if west <= east else [(west, 180.0), (-180.0, east)]


def matches(item: dict[str, Any], search: Search, span: tuple[datetime | None, datetime | None],
            region: BaseGeometry | None = None) -> bool:
    """Whether an item is among what ``search`` asks for (ids, box, and ``span``: its
    ``datetime`` read once by ``_span``; ``region``: its ``intersects``, read once by
    ``_region``)."""
    if search.ids is not None and item["id"] not in search.ids:
        return False
    if search.bbox is not None:
        west, south, east, north = search.bbox
        box = item.get("bbox") or []
        if not box or box[1] > north or box[3] < south or not any(
                low <= high_item and low_item <= high
                for low, high in _lons(west, east) for low_item, high_item in _lons(box[0], box[2])):
            return False
    if region is not None and not (item.get("geometry")
                                   and region.intersects(shapely.geometry.shape(item["geometry"]))):
        return False
    start, end = span
    props = item["properties"]
    first = pystac.utils.str_to_datetime(props.get("start_datetime") or props["datetime"])
    last = pystac.utils.str_to_datetime(props.get("end_datetime") or props["datetime"])
    return (end is None or first <= end) and (start is None or last >= start)


def add_routes(app: FastAPI, clients: Clients, signed_in: Callable[..., Caller]) -> None:
    """The STAC API's routes, every one for a signed-in caller and their own jobs."""

    def base_of(request: Request) -> str:
        return str(request.url_for("stac_landing")).rstrip("/")

    def finished(job: str, caller: Caller) -> dict[str, Any]:
        row = jobs.get_for(clients, job, caller.user)  # 404 for another's job, as for none
        manifest = results.manifest(clients, job)
        if manifest is None or not row.state.finished:
            raise HTTPException(404, f"job {job} has no products yet: {row.state.value}")
        return made(clients, job, manifest)

    def own_finished(caller: Caller) -> Iterator[str]:
        for row in jobs.list_jobs(clients, JOBS, owner=caller.user.name):
            if row.state.finished:
                yield row.job

    @app.get("/api/stac", name="stac_landing")
    def landing(request: Request, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """The STAC API's landing page: what it conforms to, where its collections are."""
        base = base_of(request)
        return {"type": "Catalog", "id": "bagpipe", "stac_version": STAC_VERSION, "conformsTo": CONFORMS,
                "title": "bagpipe", "description": f"The products of {caller.user.name}'s bagpipe jobs.",
                "links": [{"rel": "self", "href": base, "type": JSON}, {"rel": "root", "href": base, "type": JSON},
                          {"rel": "conformance", "href": f"{base}/conformance", "type": JSON},
                          {"rel": "data", "href": f"{base}/collections", "type": JSON},
                          {"rel": "search", "href": f"{base}/search", "type": GEOJSON, "method": "GET"},
                          {"rel": "search", "href": f"{base}/search", "type": GEOJSON, "method": "POST"}]}

    @app.get("/api/stac/conformance")
    def conformance(_: Caller = Depends(signed_in)) -> dict[str, Any]:
        return {"conformsTo": CONFORMS}

    @app.get("/api/stac/collections")
    def collections(request: Request, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """The caller's newest finished jobs, a collection each."""
        base = base_of(request)
        found = [_collection(base, finished(job, caller)) for job in own_finished(caller)]
        return {"collections": found, "links": [{"rel": "self", "href": f"{base}/collections", "type": JSON},
                                                {"rel": "root", "href": base, "type": JSON}]}

    @app.get("/api/stac/collections/{job}")
    def collection(job: str, request: Request, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        return _collection(base_of(request), finished(job, caller))

    @app.get("/api/stac/collections/{job}/items")
    def items(job: str, request: Request, limit: int = PAGE, token: int = 0, bbox: str | None = None,
              datetime: str | None = None, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """The job's items, a page at a time."""
        search = _search(collections=[job], limit=limit, token=token, bbox=bbox, datetime=datetime)
        span = _span(search.datetime)  # a bad one is a 400 before anything is read
        base, stored = base_of(request), finished(job, caller)
        chosen = [item for item in stored["items"] if matches(item, search, span)]
        return _page(base, chosen, search.token, search.limit, _signer(clients), lambda after: {
            "rel": "next", "type": GEOJSON,
            "href": str(request.url.replace_query_params(**dict(request.query_params), token=after))})

    @app.get("/api/stac/collections/{job}/items/{item_id}")
    def item(job: str, item_id: str, request: Request, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        for found in finished(job, caller)["items"]:
            if found["id"] == item_id:
                return _item(base_of(request), found, _signer(clients))
        raise HTTPException(404, f"job {job} has no item {item_id}")

    def run_search(search: Search, request: Request, caller: Caller,
                   next_link: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
        base, span, region = base_of(request), _span(search.datetime), _region(search)
        chosen = [item for job in (search.collections or list(own_finished(caller)))
                  for item in finished(job, caller)["items"] if matches(item, search, span, region)]
        return _page(base, chosen, search.token, search.limit, _signer(clients), next_link)

    @app.get("/api/stac/search")
    def search_get(request: Request, collections: str | None = None, ids: str | None = None,
                   bbox: str | None = None, datetime: str | None = None, limit: int = PAGE, token: int = 0,
                   caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """Items of the caller's jobs by collection, id, box and time (GET: comma-separated lists)."""
        search = _search(collections=collections.split(",") if collections else None,
                         ids=ids.split(",") if ids else None, bbox=bbox, datetime=datetime, limit=limit, token=token)
        return run_search(search, request, caller, lambda after: {
            "rel": "next", "type": GEOJSON, "method": "GET",
            "href": str(request.url.replace_query_params(**dict(request.query_params), token=after))})

    @app.post("/api/stac/search")
    def search_post(search: Search, request: Request, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """The same search with a JSON body, as pystac-client sends it."""
        return run_search(search, request, caller, lambda after: {
            "rel": "next", "type": GEOJSON, "method": "POST", "merge": True, "href": str(request.url),
            "body": {"token": after}})


def _search(bbox: str | None = None, **fields: Any) -> Search:
    """A search from query parameters; 400 naming the field that is wrong."""
    try:
        box = [float(v) for v in bbox.split(",")] if bbox else None
    except ValueError:
        raise HTTPException(400, f"bbox: {bbox!r} is not four comma-separated numbers") from None
    try:
        search = Search(bbox=box, **fields)
    except ValidationError as exc:
        raise HTTPException(400, "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                                           for e in exc.errors())) from None
    return search
