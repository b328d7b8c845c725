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

As the STAC API specification (v1.0.0) has it: items and pages of items are
``application/geo+json``, everything else ``application/json``; a parameter that is wrong is
a 400 naming it (``{"code", "description"}`` as the specification's exception, with the
API's own ``detail`` and ``field``), never a 422 nor a 500; ``limit`` above 1,000 is taken as
1,000; ``datetime`` is an RFC 3339 date-time or an interval of two (an open end ``..`` or
empty, not both); ``bbox`` is 4 numbers or 6 (with heights, which items here do not have),
south not above north (west above east crosses ±180°); ``intersects`` is a GeoJSON geometry,
on GET as on POST (its JSON text), and not with ``bbox``. Pages link ``self``, ``root``,
``next`` and ``prev`` (GET: the same query with another ``token``; POST: a body to merge),
and the landing page the OpenAPI document (``service-desc``) and its page (``service-doc``).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from typing import Annotated, Any
from urllib.parse import urljoin

import pystac
import rasterio
import shapely.errors
import shapely.geometry
from azure.core.exceptions import ResourceNotFoundError
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, ValidationInfo, field_validator
from shapely.geometry.base import BaseGeometry

from pipeline.lifecycle import jobs, results
from pipeline.modis import layout, stacitems
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
OPENAPI = "application/vnd.oai.openapi+json;version=3.1"  # FastAPI writes OpenAPI 3.1
PAGE, MAX_PAGE = 100, 1000  # items per answer: by default, at most (a larger limit is taken as this)
JOBS = 100  # the newest finished jobs a listing or a search without collections looks at
READERS = 8  # product headers read at once when a job's items are made
# each product is read by a link: no listing of its "directory" (a SAS link has none), few retries
GDAL_OPTIONS = {"GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR", "GDAL_HTTP_MAX_RETRY": "3",
                "GDAL_HTTP_RETRY_DELAY": "1"}
# how the stored items are made: 2, a year's last composite ending with the year, a job
# without products' collection without empty summaries, links relative to the item's place
FORMAT = 2
GEOMETRIES = {"Point", "MultiPoint", "LineString", "MultiLineString", "Polygon", "MultiPolygon",
              "GeometryCollection"}


def made(clients: Clients, job: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The job's collection and items as stored (asset hrefs: the products' blob names),
    made and stored at the first ask (and again when they were stored by a version that
    made them otherwise: ``FORMAT``)."""
    try:
        data, _ = clients.transfers.download(clients.products, names.stac_blob(job))
        found: dict[str, Any] = json.loads(data)
        if found.get("format") == FORMAT:
            return found
    except ResourceNotFoundError:  # not made yet (two first asks make the same content)
        pass
    found = make(clients, job, manifest) | {"format": FORMAT}
    clients.transfers.upload(clients.products, names.stac_blob(job), json.dumps(found).encode(), JSON)
    return found


def make(clients: Clients, job: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Read each product's header through a link and describe the job as STAC."""
    catalog = manifest.get("catalog") or {}
    by_key = layout.by_task(manifest["tasks"])
    sign = _signer(clients)

    def item_of(task: dict[str, Any]) -> dict[str, Any] | None:
        links = {sign(output): output for output in task.get("outputs", [])}
        deps = layout.dependencies(task, by_key)
        with rasterio.Env(**GDAL_OPTIONS):
            item = stacitems.build_item(task, list(links), catalog,
                                        [g for dep in deps for g in stacitems.granule_ids(dep)])
        if item is None:
            return None
        for asset in item.assets.values():
            asset.href = links[asset.href]
        item.collection_id = job
        found = item.to_dict(include_self_link=False, transform_hrefs=False)
        # links relative to where the item is served (…/collections/{job}/items/{id}): kept so, a valid item
        found["links"] = [{"rel": "derived_from", "href": f"./{stacitems.item_id(dep)}", "type": GEOJSON}
                          for dep in deps if any(_is_raster(o) for o in dep.get("outputs", []))] + [
            {"rel": rel, "href": f"../../{job}", "type": JSON} for rel in ("collection", "parent")]
        return found

    with ThreadPoolExecutor(READERS) as pool:
        items = [item for item in pool.map(item_of, manifest["tasks"]) if item is not None]
    collection = stacitems.build_collection(manifest, [pystac.Item.from_dict(i) for i in items])
    collection.clear_links()
    return {"collection": collection.to_dict(include_self_link=False, transform_hrefs=False), "items": items}


def _is_raster(output: str) -> bool:
    """Whether an output is a raster, and so makes an item."""
    return output.lower().endswith(stacitems.RASTERS)


# --- refusals ---------------------------------------------------------------------------------
class BadParameter(HTTPException):
    """A parameter the STAC API cannot take: 400, naming it (``said``: the whole message,
    when it says more than this one parameter's fault)."""

    def __init__(self, field: str, message: str = "", said: str = "") -> None:
        said = said or f"{field}: {message}"
        super().__init__(400, {"code": "InvalidParameterValue", "description": said, "detail": said,
                               "field": field or None})


def _refusal(exc: ValidationError | RequestValidationError) -> BadParameter:
    """A validation error as a 400 naming its first field, with every field's message."""
    said, fields = [], []
    for error in exc.errors():
        field = ".".join(str(p) for p in error["loc"] if p not in ("body", "query", "path"))
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "json_invalid":
            field, message = "body", f"not JSON ({message})"
        fields.append(field)
        said.append(f"{field}: {message}" if field else message)
    return BadParameter(next((f for f in fields if f), ""), said="; ".join(said))


class StacRoute(APIRoute):
    """A route of the STAC API: a request FastAPI finds invalid (a query parameter of the
    wrong type, a body that is not a search) is the specification's 400, not FastAPI's 422."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                raise _refusal(exc) from None

        return handle


class GeoJSONResponse(JSONResponse):
    """An item or a page of items."""

    media_type = GEOJSON


# --- parameters -------------------------------------------------------------------------------
_DATE_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})")


def instant(text: str) -> datetime:
    """An RFC 3339 date-time (section 5.6: a full date, ``T``, a full time with its offset;
    fractions of a second after a point; ``t`` and ``z`` as well); ValueError otherwise."""
    found = _DATE_TIME.fullmatch(text)
    if found is None:
        raise ValueError(f"{text!r} is not an RFC 3339 date-time such as 2022-02-02T00:00:00Z")
    year, month, day, hour, minute, second = (int(v) for v in found.groups()[:6])
    micro = int(((found[7] or "") + "000000")[:6])
    if second == 60:  # a leap second: the instant just before the next minute
        second, micro = 59, 999_999
    offset = found[8]
    zone = UTC
    if offset not in ("Z", "z"):
        hours, minutes = int(offset[1:3]), int(offset[4:6])
        if hours > 23 or minutes > 59:
            raise ValueError(f"{text!r}: the offset {offset} is not a time zone")
        zone = timezone((1 if offset[0] == "+" else -1) * timedelta(hours=hours, minutes=minutes))
    try:
        return datetime(year, month, day, hour, minute, second, micro, tzinfo=zone)
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a date-time: {exc}") from None


Span = tuple[datetime | None, datetime | None]


def span(text: str | None) -> Span:
    """The instant or interval a ``datetime`` parameter names: ``a``, ``a/b``, ``a/..``,
    ``../b`` (an open end also empty), never both ends open nor an end before its start;
    (None, None) for none."""
    if not text:
        return None, None
    parts = text.split("/")
    if len(parts) == 1:
        at = instant(text)
        return at, at
    if len(parts) > 2:
        raise ValueError(f"{text!r} is neither a date-time nor an interval start/end")
    start, end = (None if part in ("", "..") else instant(part) for part in parts)
    if start is None and end is None:
        raise ValueError(f"{text!r}: an interval has at least one end")
    if start is not None and end is not None and start > end:
        raise ValueError(f"{text!r}: its end comes before its start")
    return start, end


Coordinate = Annotated[float, Strict()]  # a number: true and "1" are not


class Search(BaseModel):
    """An item search (STAC API item-search): every field optional, as the specification has it."""

    model_config = ConfigDict(extra="ignore")
    collections: list[str] | None = None
    ids: list[str] | None = None
    bbox: list[Coordinate] | None = Field(default=None, description="west, south, east, north (4 numbers), or "
                                          "with heights west, south, low, east, north, high (6); west > east: "
                                          "across ±180°")
    intersects: dict[str, Any] | None = Field(default=None, description="a GeoJSON geometry (not with bbox)")
    datetime: str | None = Field(default=None, description="an RFC 3339 date-time, or an interval a/b (an open "
                                 "end: ..)")
    limit: int = Field(default=PAGE, description=f"items per page: at least 1; above {MAX_PAGE}, {MAX_PAGE}")
    token: int = Field(default=0, ge=0, description="the page (from a next or prev link)")

    @field_validator("bbox")
    @classmethod
    def _bbox(cls, value: list[float] | None) -> list[float] | None:
        if value is None:
            return None
        if len(value) not in (4, 6):
            raise ValueError(f"4 numbers (west, south, east, north) or 6 (with heights), not {len(value)}")
        west, south, east, north = value if len(value) == 4 else (value[0], value[1], value[3], value[4])
        if not (-180 <= west <= 180 and -180 <= east <= 180 and -90 <= south <= 90 and -90 <= north <= 90):
            raise ValueError(f"{value} is not within ±180° of longitude and ±90° of latitude")
        if south > north:
            raise ValueError(f"its south ({south}) is north of its north ({north})")
        if len(value) == 6 and value[2] > value[5]:
            raise ValueError(f"its lowest height ({value[2]}) is above its highest ({value[5]})")
        return value

    @field_validator("intersects")
    @classmethod
    def _intersects(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if value is not None:
            if info.data.get("bbox") is not None:
                raise ValueError("one of bbox and intersects, not both")
            geometry(value)
        return value

    @field_validator("datetime")
    @classmethod
    def _datetime(cls, value: str | None) -> str | None:
        span(value)
        return value

    @field_validator("limit")
    @classmethod
    def _limit(cls, value: int) -> int:
        if value < 1:
            raise ValueError(f"at least 1, not {value}")
        return min(value, MAX_PAGE)

    @property
    def box(self) -> tuple[float, float, float, float] | None:
        """west, south, east, north: the bbox without its heights."""
        if self.bbox is None:
            return None
        west, south, east, north = self.bbox if len(self.bbox) == 4 else (self.bbox[0], self.bbox[1], self.bbox[3],
                                                                             self.bbox[4])
        return west, south, east, north


def geometry(value: dict[str, Any]) -> BaseGeometry:
    """The shape of a GeoJSON geometry; ValueError if it is not one."""
    kind = value.get("type")
    if kind not in GEOMETRIES:
        raise ValueError(f"not a GeoJSON geometry (type {kind!r}; one of {', '.join(sorted(GEOMETRIES))})")
    try:
        return shapely.geometry.shape(value)
    except (AttributeError, KeyError, TypeError, ValueError, IndexError, shapely.errors.ShapelyError) as exc:
        raise ValueError(f"not a GeoJSON {kind} ({exc})") from None


def from_query(**given: str | int | None) -> Search:
    """A search from GET's query parameters (lists comma-separated, ``intersects`` as its
    JSON text); 400 naming the parameter that is wrong."""
    fields: dict[str, Any] = {key: value for key, value in given.items() if value is not None}
    for key in ("collections", "ids"):
        if key in fields:
            fields[key] = [v for v in fields[key].split(",") if v]
    if "bbox" in fields:
        try:
            fields["bbox"] = [float(v) for v in fields["bbox"].split(",")]
        except ValueError:
            raise BadParameter("bbox", f"{fields['bbox']!r} is not 4 or 6 comma-separated numbers") from None
    if "intersects" in fields:
        try:
            fields["intersects"] = json.loads(fields["intersects"])
        except ValueError:
            fields["intersects"] = None
        if not isinstance(fields["intersects"], dict):
            raise BadParameter("intersects", "not the JSON text of a GeoJSON geometry")
    try:
        return Search.model_validate(fields)
    except ValidationError as exc:
        raise _refusal(exc) from None


def matches(item: dict[str, Any], search: Search, when: Span, region: BaseGeometry | None = None) -> bool:
    """Whether an item is among what ``search`` asks for (ids, box, and ``when``: its
    ``datetime`` read once by :func:`span`; ``region``: its ``intersects``, read once)."""
    if search.ids is not None and item["id"] not in search.ids:
        return False
    if (box := search.box) is not None:
        west, south, east, north = box
        found = item.get("bbox") or []
        if len(found) not in (4, 6):
            return False
        west_i, south_i, east_i, north_i = found if len(found) == 4 else (found[0], found[1], found[3], found[4])
        if south_i > north or north_i < south or not any(
                low <= high_i and low_i <= high
                for low, high in _lons(west, east) for low_i, high_i in _lons(west_i, east_i)):
            return False
    if region is not None and not (item.get("geometry")
                                   and region.intersects(shapely.geometry.shape(item["geometry"]))):
        return False
    start, end = when
    props = item["properties"]
    first = pystac.utils.str_to_datetime(props.get("start_datetime") or props["datetime"])
    last = pystac.utils.str_to_datetime(props.get("end_datetime") or props["datetime"])
    return (end is None or first <= end) and (start is None or last >= start)


def _lons(west: float, east: float) -> list[tuple[float, float]]:
    """A box's longitudes as ranges: two for one across ±180° (west > east)."""
    return [(west, east)] if west <= east else [(west, 180.0), (-180.0, east)]


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
    url = f"{base}/collections/{job}/items/{found['id']}"
    for asset in found["assets"].values():
        asset["href"] = sign(asset["href"])
    found["links"] = [link | {"href": urljoin(url, link["href"])} for link in found["links"]
                      if link["rel"] not in ("self", "parent", "collection", "root")] + [
        {"rel": "self", "href": url, "type": GEOJSON},
        {"rel": "parent", "href": f"{base}/collections/{job}", "type": JSON},
        {"rel": "collection", "href": f"{base}/collections/{job}", "type": JSON},
        {"rel": "root", "href": base, "type": JSON},
    ]
    return found


def _signer(clients: Clients) -> Callable[[str], str]:
    return lambda output: results.sas_url(clients, *results.locate(clients, output))


Paging = Callable[[str, int], dict[str, Any]]  # the link of rel (next, prev) to the page at an offset


def _page(base: str, items: list[dict[str, Any]], search: Search, sign: Callable[[str], str],
          links: list[dict[str, Any]], paging: Paging) -> GeoJSONResponse:
    """One page of items, a FeatureCollection, with ``links`` and those ``paging`` makes to
    the next and the previous page."""
    offset, limit = search.token, search.limit
    chosen = items[offset:offset + limit]
    links = [*links, {"rel": "root", "href": base, "type": JSON}]
    if offset + limit < len(items):
        links.append(paging("next", offset + limit))
    if offset > 0:
        links.append(paging("prev", max(0, offset - limit)))
    return GeoJSONResponse({"type": "FeatureCollection", "features": [_item(base, item, sign) for item in chosen],
                            "numberMatched": len(items), "numberReturned": len(chosen), "links": links})


def _get_paging(request: Request) -> Paging:
    """Links to other pages of a GET: the same query with another token."""
    return lambda rel, offset: {"rel": rel, "type": GEOJSON, "method": "GET",
                                "href": str(request.url.include_query_params(token=offset))}


# --- routes -----------------------------------------------------------------------------------
def add_routes(app: FastAPI, clients: Clients, signed_in: Callable[..., Caller]) -> None:
    """The STAC API's routes, every one for a signed-in caller and their own jobs (but the
    OpenAPI document, which holds no data, as ``/api/openapi.json``)."""
    router = APIRouter(route_class=StacRoute, tags=["STAC API"])
    # the app's refusals, documented as what they are (JSON), on the routes whose answers are GeoJSON
    refusals: dict[int | str, dict[str, Any]] = {
        code: {"description": spec["description"], "content": {JSON: {"schema": {
            "$ref": f"#/components/schemas/{spec['model'].__name__}"}}}} if "model" in spec else spec
        for code, spec in app.router.responses.items()}

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

    @router.get("/api/stac", name="stac_landing")
    def landing(request: Request, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """The STAC API's landing page: what it conforms to, where its collections are."""
        base = base_of(request)
        return {"type": "Catalog", "id": "bagpipe", "stac_version": STAC_VERSION, "conformsTo": CONFORMS,
                "title": "bagpipe", "description": f"The products of {caller.user.name}'s bagpipe jobs.",
                "links": [{"rel": "self", "href": base, "type": JSON}, {"rel": "root", "href": base, "type": JSON},
                          {"rel": "conformance", "href": f"{base}/conformance", "type": JSON},
                          {"rel": "data", "href": f"{base}/collections", "type": JSON},
                          {"rel": "search", "href": f"{base}/search", "type": GEOJSON, "method": "GET"},
                          {"rel": "search", "href": f"{base}/search", "type": GEOJSON, "method": "POST"},
                          {"rel": "service-desc", "href": str(request.url_for("stac_openapi")), "type": OPENAPI},
                          {"rel": "service-doc", "href": str(request.url_for("swagger_ui_html")),
                           "type": "text/html"}]}

    @router.get("/api/stac/api", name="stac_openapi", include_in_schema=False)
    def openapi(request: Request) -> Response:
        """The API's OpenAPI document (the landing page's ``service-desc``) with the type the
        STAC API specification names (``/api/openapi.json``'s, as FastAPI serves it, is JSON's)."""
        return JSONResponse(request.app.openapi(), media_type=OPENAPI)

    @router.get("/api/stac/conformance")
    def conformance(_: Caller = Depends(signed_in)) -> dict[str, Any]:
        return {"conformsTo": CONFORMS}

    @router.get("/api/stac/collections")
    def collections(request: Request, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        """The caller's newest finished jobs, a collection each."""
        base = base_of(request)
        found = [_collection(base, finished(job, caller)) for job in own_finished(caller)]
        return {"collections": found, "links": [{"rel": "self", "href": f"{base}/collections", "type": JSON},
                                                {"rel": "root", "href": base, "type": JSON},
                                                {"rel": "parent", "href": base, "type": JSON}]}

    @router.get("/api/stac/collections/{job}")
    def collection(job: str, request: Request, caller: Caller = Depends(signed_in)) -> dict[str, Any]:
        return _collection(base_of(request), finished(job, caller))

    @router.get("/api/stac/collections/{job}/items", response_class=GeoJSONResponse, responses=refusals)
    def items(job: str, request: Request, limit: int | None = None, token: int | None = None,
              bbox: str | None = None, datetime: str | None = None,
              caller: Caller = Depends(signed_in)) -> GeoJSONResponse:
        """The job's items, a page at a time (``limit``, ``token`` from a ``next`` or
        ``prev`` link), by box and time."""
        search = from_query(limit=limit, token=token, bbox=bbox, datetime=datetime)  # a 400 before any read
        base, stored = base_of(request), finished(job, caller)
        when = span(search.datetime)
        chosen = [item for item in stored["items"] if matches(item, search, when)]
        return _page(base, chosen, search, _signer(clients), [
            {"rel": "self", "href": str(request.url), "type": GEOJSON},
            {"rel": "parent", "href": f"{base}/collections/{job}", "type": JSON},
            {"rel": "collection", "href": f"{base}/collections/{job}", "type": JSON}], _get_paging(request))

    @router.get("/api/stac/collections/{job}/items/{item_id}", response_class=GeoJSONResponse, responses=refusals)
    def item(job: str, item_id: str, request: Request, caller: Caller = Depends(signed_in)) -> GeoJSONResponse:
        for found in finished(job, caller)["items"]:
            if found["id"] == item_id:
                return GeoJSONResponse(_item(base_of(request), found, _signer(clients)))
        raise HTTPException(404, f"job {job} has no item {item_id}")

    def run_search(search: Search, request: Request, caller: Caller, own: list[dict[str, Any]],
                   paging: Paging) -> GeoJSONResponse:
        base, when = base_of(request), span(search.datetime)
        region = geometry(search.intersects) if search.intersects is not None else None
        chosen = [item for job in (search.collections or list(own_finished(caller)))
                  for item in finished(job, caller)["items"] if matches(item, search, when, region)]
        return _page(base, chosen, search, _signer(clients), own, paging)

    @router.get("/api/stac/search", response_class=GeoJSONResponse, responses=refusals)
    def search_get(request: Request, collections: str | None = None, ids: str | None = None,
                   bbox: str | None = None, intersects: str | None = None, datetime: str | None = None,
                   limit: int | None = None, token: int | None = None,
                   caller: Caller = Depends(signed_in)) -> GeoJSONResponse:
        """Items of the caller's jobs by collection, id, box or geometry and time (GET:
        comma-separated lists, ``intersects`` as the JSON text of a GeoJSON geometry)."""
        search = from_query(collections=collections, ids=ids, bbox=bbox, intersects=intersects, datetime=datetime,
                            limit=limit, token=token)
        return run_search(search, request, caller, [{"rel": "self", "href": str(request.url), "type": GEOJSON}],
                          _get_paging(request))

    @router.post("/api/stac/search", response_class=GeoJSONResponse, responses=refusals)
    def search_post(search: Search, request: Request, caller: Caller = Depends(signed_in)) -> GeoJSONResponse:
        """The same search with a JSON body, as pystac-client sends it."""
        return run_search(search, request, caller, [{"rel": "self", "href": str(request.url), "type": GEOJSON}],
                          lambda rel, offset: {"rel": rel, "type": GEOJSON, "method": "POST", "merge": True,
                                               "href": str(request.url), "body": {"token": offset}})

    app.include_router(router)
