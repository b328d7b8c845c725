"""An openEO process's parameters read and checked, for the graph compiler
(``pipeline.web.openeo.graph``): bounding boxes (in any CRS, as lon/lat), GeoJSON polygons
and points (in lon/lat, checked as the native API checks a region, zones and sites:
``pipeline.requests.vectors``), temporal intervals (openEO's half-open ``[start, end)``) and
``aggregate_spatial``'s reducers. A parameter bagpipe cannot take is a ``CompileError``
naming the process and the parameter, with openEO's error code."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta
from typing import Any

import shapely
from pyproj import CRS, Transformer
from pyproj.exceptions import CRSError
from shapely.geometry import MultiPolygon, Polygon, mapping
from shapely.geometry.base import BaseGeometry

from pipeline.planning import RequestError
from pipeline.requests import vectors


class CompileError(Exception):
    """A graph bagpipe refuses: ``code`` is openEO's (``ProcessGraphInvalid``,
    ``ProcessUnsupported``, ``CollectionNotFound``, ``FormatUnsuitable``…)."""

    def __init__(self, code: str, message: str, process: str = "") -> None:
        super().__init__(message)
        self.code, self.message, self.process = code, message, process


# aggregate_spatial's reducers: the zones' statistic each is (quantiles: their percentiles)
SPATIAL = {"mean": "mean", "min": "min", "max": "max", "sd": "sd", "count": "count", "sum": "sum",
           "median": "median"}
# aggregate_spatial's reducers whose value over one pixel is that pixel's: a point's
AT_POINTS = ("mean", "min", "max", "median", "sum", "first", "last")

def bbox(extent: Any, process: str, name: str) -> tuple[float, float, float, float]:
    """A bounding box in lon/lat: ``{west, south, east, north[, crs]}`` (another CRS is
    transformed, its corners' box)."""
    if extent is None:
        raise CompileError("ProcessParameterInvalid", f"{process}: {name} is required: a bounding box {{west, south, "
                           "east, north}} (bagpipe does not process the whole world at once)", process)
    if not isinstance(extent, dict) or "type" in extent:
        raise CompileError("ProcessParameterInvalid", f"{process}: {name}: a bounding box {{west, south, east, "
                           "north}}", process)
    try:
        west, south, east, north = (float(extent[k]) for k in ("west", "south", "east", "north"))
    except (KeyError, TypeError, ValueError):
        raise CompileError("ProcessParameterInvalid", f"{process}: {name} needs numbers west, south, east, north",
                           process) from None
    crs = extent.get("crs", 4326)
    if crs not in (4326, "EPSG:4326", None):
        try:
            to_lonlat = Transformer.from_crs(CRS.from_user_input(crs), CRS.from_epsg(4326), always_xy=True)
        except CRSError:
            raise CompileError("ProcessParameterInvalid", f"{process}: {name}.crs {crs!r} is not a CRS",
                               process) from None
        xs, ys = to_lonlat.transform([west, east, west, east], [south, south, north, north])
        west, south, east, north = min(xs), min(ys), max(xs), max(ys)
    if not (-180 <= west < east <= 180 and -90 <= south < north <= 90):
        raise CompileError("ProcessParameterInvalid", f"{process}: {name} is not a box within ±180°, ±90° with west < "
                           "east and south < north", process)
    return west, south, east, north


# what a GeoJSON crs member may name: lon/lat, as RFC 7946 has every GeoJSON
LONLAT = (4326, "EPSG:4326", "urn:ogc:def:crs:EPSG::4326", "urn:ogc:def:crs:OGC:1.3:CRS84", "OGC:CRS84")
NOT_POLYGONS = ("Point", "MultiPoint", "LineString", "MultiLineString", "GeometryCollection")


def in_lonlat(value: dict[str, Any], where: str, process: str) -> None:
    """Refuse GeoJSON whose ``crs`` member (GeoJSON's 2008 draft; a named CRS object is its
    name by now, ``_crs_names``) names anything but lon/lat, the only CRS RFC 7946 has."""
    crs = value.get("crs")
    if crs is not None and crs not in LONLAT:
        raise CompileError("ProcessParameterUnsupported", f"{where}: GeoJSON in lon/lat (EPSG:4326, as RFC 7946 has "
                           f"it), not {str(crs)[:60]!r}", process)


def features_of(value: dict[str, Any], where: str, process: str) -> list[Any]:
    """GeoJSON's features: a FeatureCollection's (one at least), a Feature alone, or a bare
    geometry as a Feature with no properties."""
    if value["type"] == "FeatureCollection":
        features = value.get("features")
        if not isinstance(features, list) or not features:
            raise CompileError("ProcessParameterInvalid", f"{where}: the FeatureCollection has no feature", process)
        return features
    return [value if value["type"] == "Feature" else {"type": "Feature", "properties": {}, "geometry": value}]


def geojson(value: Any, process: str, name: str) -> Polygon | MultiPolygon:
    """GeoJSON polygons — a Polygon, a MultiPolygon, a Feature of one, or a FeatureCollection
    of them — as one geometry in lon/lat, their union (a pixel is kept if its centre is in
    any), checked as the native API checks a region's polygon (``vectors.parse_polygon``:
    vertices counted first, invalid rings, positions off the globe, the area); points and
    lines are not a region."""
    where = f"{process}: {name}"
    if not isinstance(value, dict) or "type" not in value:
        raise CompileError("ProcessParameterInvalid", f"{where}: GeoJSON polygons (a Polygon, MultiPolygon, Feature "
                           "or FeatureCollection)", process)
    in_lonlat(value, where, process)
    geometries = [f.get("geometry") if isinstance(f, dict) else None for f in features_of(value, where, process)]
    for one in geometries:
        if isinstance(one, dict) and one.get("type") in NOT_POLYGONS:
            raise CompileError("ProcessParameterUnsupported", f"{where}: a {one['type']} is not a region: bagpipe "
                               "clips to polygons", process)
    budget = [vectors.MAX_VERTICES]
    try:
        parts = [vectors.parse_polygon(one, where, budget) for one in geometries]
    except RequestError as exc:
        raise CompileError("ProcessParameterInvalid", f"{exc.field}: {exc.message}", process) from None
    found = polygonal(parts[0] if len(parts) == 1 else shapely.union_all(parts))
    assert found is not None  # valid polygons with an area: their union has one
    return found


def polygonal(geometry: Any) -> Polygon | MultiPolygon | None:
    """The polygons of a geometry (an intersection's lines and points dropped), None if none."""
    parts = [p for p in shapely.get_parts(shapely.get_parts(geometry)) if isinstance(p, Polygon) and not p.is_empty]
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else MultiPolygon(parts)


def text(polygon: Polygon | MultiPolygon) -> str:
    return json.dumps(mapping(polygon))


def zones(value: Any, process: str) -> dict[str, Any]:
    """aggregate_spatial's geometries as the request's zones: a FeatureCollection of polygons,
    each with its id (the feature's, else its property id or name, else its place in the
    collection, as openEO labels them), or one Polygon, MultiPolygon or Feature (a zone of id
    0); checked as the native API checks zones (points are sites: :func:`_sites`)."""
    where = f"{process}: geometries"
    if not isinstance(value, dict) or value.get("type") not in ("FeatureCollection", "Feature", "Polygon",
                                                                "MultiPolygon", *NOT_POLYGONS):
        raise CompileError("ProcessParameterInvalid", f"{where}: GeoJSON polygons (a FeatureCollection of them, "
                           "each with an id, or one Polygon, MultiPolygon or Feature)", process)
    in_lonlat(value, where, process)
    features = features_of(value, where, process)
    named: list[Any] = []
    for number, feature in enumerate(features):
        geometry = feature.get("geometry") if isinstance(feature, dict) else None
        kind = geometry.get("type") if isinstance(geometry, dict) else None
        if kind in NOT_POLYGONS:
            raise CompileError("ProcessParameterUnsupported", f"{where}: a {kind}: bagpipe's zones are polygons",
                               process)
        if not isinstance(feature, dict):
            named.append(feature)  # zones_of names it
            continue
        given = feature.get("properties")
        properties: dict[str, Any] = given if isinstance(given, dict) else {}
        ident = next((i for i in (feature.get("id"), properties.get("id"), properties.get("name")) if i is not None),
                     number)
        named.append({**feature, "id": str(ident) if isinstance(ident, int | float | str) else ident})
    collection = {"type": "FeatureCollection", "features": named}
    try:
        vectors.zones_of(collection, where)
    except RequestError as exc:
        raise CompileError("ProcessParameterInvalid", f"{exc.field}: {exc.message}", process) from None
    return collection


def sites(value: Any, process: str, extent: BaseGeometry) -> list[dict[str, Any]]:
    """aggregate_spatial's geometries as the request's sites if they are points (a Point, a
    Feature of one, or a FeatureCollection of them; [] if they are not points): each named as
    a zone is (its feature's id, else its property id or name, else its place), checked as
    the native API checks sites, each within the data's extent (openEO has no value
    outside it; bagpipe would sample it). A MultiPoint is one geometry whose points openEO
    reduces together, which sites do not: refused, as are points beside polygons."""
    where = f"{process}: geometries"
    if not isinstance(value, dict):
        return []
    features = value.get("features") if value.get("type") == "FeatureCollection" else [
        value if value.get("type") == "Feature" else {"type": "Feature", "properties": {}, "geometry": value}]
    if not isinstance(features, list):
        return []
    kinds = [(f.get("geometry") or {}).get("type") if isinstance(f, dict) and isinstance(f.get("geometry"), dict)
             else None for f in features]
    if "MultiPoint" in kinds:
        raise CompileError("ProcessParameterUnsupported", f"{where}: a MultiPoint is one geometry whose points' values "
                           "aggregate_spatial reduces together; give a FeatureCollection of Points, a site each",
                           process)
    if "Point" not in kinds:
        return []
    if any(k != "Point" for k in kinds):
        raise CompileError("ProcessParameterUnsupported", f"{where}: points and polygons together: bagpipe samples "
                           "points as sites and polygons as zones, one kind a graph", process)
    in_lonlat(value, where, process)
    points = []
    for number, feature in enumerate(features):
        properties = feature.get("properties") if isinstance(feature.get("properties"), dict) else {}
        ident = next((i for i in (feature.get("id"), properties.get("id"), properties.get("name")) if i is not None),
                     number)
        coordinates = feature["geometry"].get("coordinates")
        lon, lat = coordinates[:2] if isinstance(coordinates, list) and len(coordinates) >= 2 else (None, None)
        points.append({"id": str(ident) if isinstance(ident, int | float | str) else ident, "lon": lon, "lat": lat})
    try:
        checked = vectors.sites_of(points, where)
    except RequestError as exc:
        raise CompileError("ProcessParameterInvalid", f"{exc.field}: {exc.message}", process) from None
    for number, one in enumerate(checked):
        if not extent.covers(shapely.Point(one.lon, one.lat)):
            raise CompileError("ProcessParameterInvalid", f"{where}[{number}]: the point ({one.lon}, {one.lat}) is "
                               "outside the data's spatial extent", process)
    return [{"id": one.id, "lon": one.lon, "lat": one.lat} for one in checked]


def point_reducer(reducer: Any, process: str) -> None:
    """aggregate_spatial's reducer at a point: one whose value over one pixel is that pixel's
    (:data:`AT_POINTS`), as a site's value is its pixel's."""
    nodes = reducer.get("process_graph") if isinstance(reducer, dict) else None
    (node,) = nodes.values() if isinstance(nodes, dict) and len(nodes) == 1 else (None,)
    name = str(node.get("process_id")) if isinstance(node, dict) else ""
    arguments = (node.get("arguments") or {}) if isinstance(node, dict) else {}
    if name not in AT_POINTS or arguments.get("data") != {"from_parameter": "data"}:
        raise CompileError("ProcessUnsupported", f"{process}: at points the reducer is one of {', '.join(AT_POINTS)} "
                           "over data: the value of the pixel holding each point", name or process)


def spatial_reducer(reducer: Any, process: str) -> tuple[str, list[float]]:
    """aggregate_spatial's reducer: one of :data:`SPATIAL` over data (the statistic), or
    ``quantiles`` of probabilities or of q equal parts (q, or probabilities given as a number
    of intervals: the percentiles)."""
    nodes = reducer.get("process_graph") if isinstance(reducer, dict) else None
    if not isinstance(nodes, dict) or len(nodes) != 1:
        raise CompileError("ProcessUnsupported", f"{process}: the reducer is one of {', '.join(SPATIAL)} or quantiles "
                           "over data (the zones' statistics)", process)
    (node,) = nodes.values()
    name, arguments = str(node.get("process_id")), node.get("arguments") or {}
    if (name not in SPATIAL and name != "quantiles") or arguments.get("data") != {"from_parameter": "data"}:
        why = " (a polygon's pixels have no order)" if name in ("first", "last") else ""
        raise CompileError("ProcessUnsupported", f"{process}: the reducer {name!r} over a zone's pixels is not one of "
                           f"{', '.join(SPATIAL)} or quantiles applied to data{why}", name)
    if arguments.get("ignore_nodata") is False or arguments.get("condition") is not None:
        raise CompileError("ProcessParameterUnsupported", f"{name}: over a zone's pixels bagpipe ignores no-data "
                           "(ignore_nodata true, no condition)", name)
    if name != "quantiles":
        return SPATIAL[name], []
    probabilities, q = arguments.get("probabilities"), arguments.get("q")
    if (probabilities is None) == (q is None):
        raise CompileError("QuantilesParameterConflict" if q is not None else "QuantilesParameterMissing",
                           "quantiles: give probabilities or q, one of them", name)
    if isinstance(probabilities, int) and not isinstance(probabilities, bool):  # a number of intervals (2.0's)
        probabilities, q = None, probabilities
    if q is not None:
        if isinstance(q, bool) or not isinstance(q, int) or q < 2:
            raise CompileError("ProcessParameterInvalid", "quantiles: q is a whole number, 2 or more", name)
        probabilities = [k / q for k in range(1, q)]
    if not isinstance(probabilities, list) or not probabilities or not all(
            isinstance(p, int | float) and not isinstance(p, bool) and 0 <= p <= 1 for p in probabilities):
        raise CompileError("ProcessParameterInvalid", "quantiles: probabilities are numbers from 0 to 1", name)
    if probabilities != sorted(set(probabilities)):
        raise CompileError("AscendingProbabilitiesRequired", "quantiles: probabilities in ascending order, each once",
                           name)
    if len(probabilities) > 9:
        raise CompileError("ProcessParameterUnsupported", "quantiles: at most 9 of them (a zone's table has a "
                           "column each)", name)
    return "", [round(100 * float(p), 10) for p in probabilities]


def day(text: Any, process: str, name: str) -> tuple[date, bool]:
    """A date or date-time's day, and whether it is midnight (an exclusive end's day before)."""
    if not isinstance(text, str):
        raise CompileError("ProcessParameterInvalid", f"{process}: {name} holds a date or a date-time, not "
                           f"{text!r}", process)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise CompileError("ProcessParameterInvalid", f"{process}: {name}: {text!r} is not an RFC 3339 date or "
                           "date-time", process) from None
    return when.date(), (when.hour, when.minute, when.second, when.microsecond) == (0, 0, 0, 0)


def interval(extent: Any, process: str, name: str) -> tuple[date, date]:
    """``[start, end)``, openEO's half-open interval, as its first and last day."""
    if not isinstance(extent, list) or len(extent) != 2 or None in extent:
        raise CompileError("ProcessParameterInvalid", f"{process}: {name} is [start, end], both given (bagpipe "
                           "plans a finite span)", process)
    (start, _), (end, midnight) = day(extent[0], process, name), day(extent[1], process, name)
    last = end - timedelta(days=1) if midnight else end
    if last < start:
        raise CompileError("ProcessParameterInvalid", f"{process}: {name} is empty: its end is not after its start",
                           process)
    return start, last
