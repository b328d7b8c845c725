"""Points and polygons in a request: a region given as a polygon, the sites of a point
sample, the zones of zonal statistics — read, checked and kept.

Each is read from what a scientist has (GeoJSON, a CSV of id, lon, lat, a JSON list),
checked before anything is stored (a refusal is a :class:`RequestError` naming the field and
what is wrong: a self-intersecting ring, too many vertices, text in a longitude column), and
kept as one canonical JSON document in ``tiles`` under its SHA-256 (``names.vector_blob``):
a table property could not hold tens of thousands of points, and the tasks that read them
(a tile task's clip, a point task's sites, a zonal task's polygons) name the digest, which
is then part of their outputs' content addresses. The request keeps the digest and what
planning needs of it (a summary: its box, the tiles it touches), never the points.

Coordinates are lon/lat degrees (GeoJSON's, RFC 7946): a polygon across ±180° is given cut
there, as a MultiPolygon whose parts meet the antimeridian from either side.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import shapely
from pyproj import Geod
from shapely.geometry import MultiPolygon, Polygon, shape
from shapely.validation import explain_validity

from pipeline.modis.grid import TILE_PIXELS_500M, locate
from pipeline.modis.targets import GridSpec, TargetTile
from pipeline.planning import RequestError
from pipeline.requests.request import Grid, JobRequest, Kept, Region
from pipeline.science import vectors as science_vectors
from pipeline.science.vectors import (
    DIGITS,
    Site,
    Zone,
    digest_of,
    region_document,
    sites_document,
    sites_from,
    zones_document,
    zones_from,
)

MAX_VERTICES = 100_000  # a region's or all the zones' vertices together
MAX_AREA_KM2 = 20_000_000.0  # a region's or a zone's area (Asia's is 44 million; a continent's part)
MAX_SITES = 50_000
MAX_ZONES = 10_000
MAX_ID = 64  # characters of a site's or zone's id
GEOD = Geod(ellps="WGS84")


# --- polygons ----------------------------------------------------------------------------
def _positions(coordinates: Any, depth: int) -> int:
    """How many positions a GeoJSON geometry's coordinates hold (``depth`` levels of lists
    above a position), by the lengths of its rings alone."""
    if not isinstance(coordinates, list):
        return 0
    if depth == 1:
        return len(coordinates)
    return sum(_positions(item, depth - 1) for item in coordinates)


def _vertices(coordinates: Any, depth: int, field: str, budget: list[int]) -> None:
    """Take a GeoJSON geometry's positions from the budget, refusing past it before any is
    looked at (a million vertices are refused in the time it takes to add up its rings'
    lengths, never parsed into a geometry), then check each is two numbers."""
    budget[0] -= _positions(coordinates, depth)
    if budget[0] < 0:
        raise RequestError(413, field, f"the geometry has more than {MAX_VERTICES:,} vertices; simplify it")
    _check_positions(coordinates, depth, field)


def _check_positions(coordinates: Any, depth: int, field: str) -> None:
    if not isinstance(coordinates, list):
        raise RequestError(422, field, "coordinates must be nested lists of [lon, lat] positions")
    if depth == 0:
        if len(coordinates) < 2 or not all(isinstance(c, int | float) and not isinstance(c, bool)
                                           for c in coordinates[:2]):
            raise RequestError(422, field, "a position is [lon, lat], two numbers")
        return
    for item in coordinates:
        _check_positions(item, depth - 1, field)


def parse_polygon(value: Any, field: str, budget: list[int] | None = None) -> Polygon | MultiPolygon:
    """A GeoJSON Polygon or MultiPolygon (a Feature's geometry too) as a valid shapely
    geometry in lon/lat; a RequestError naming ``field`` if it is not GeoJSON, is another
    type, has a position off the globe, too many vertices (``budget``: those left of
    :data:`MAX_VERTICES`), a ring that crosses itself or is otherwise invalid, or an area
    past :data:`MAX_AREA_KM2`."""
    budget = budget if budget is not None else [MAX_VERTICES]
    if isinstance(value, dict) and value.get("type") == "Feature":
        value = value.get("geometry")
    if not isinstance(value, dict) or "type" not in value or "coordinates" not in value:
        raise RequestError(422, field, "not a GeoJSON geometry: give {\"type\": \"Polygon\" or \"MultiPolygon\", "
                           "\"coordinates\": [...]}")
    kind = value["type"]
    if kind not in ("Polygon", "MultiPolygon"):
        raise RequestError(422, field, f"a {kind!s:.40} is not a polygon: give a Polygon or a MultiPolygon")
    _vertices(value["coordinates"], 2 if kind == "Polygon" else 3, field, budget)
    try:
        geometry = shape(value)
    except Exception as exc:  # shapely's own words for a ring of fewer than four positions and the like
        raise RequestError(422, field, f"not a valid {kind}: {exc}") from None
    lon_lat = shapely.get_coordinates(geometry)
    if lon_lat.size == 0 or geometry.is_empty:
        raise RequestError(422, field, f"the {kind} is empty")
    if not ((abs(lon_lat[:, 0]) <= 180).all() and (abs(lon_lat[:, 1]) <= 90).all()):
        raise RequestError(422, field, "a position is off the globe: longitudes are within ±180, latitudes ±90 "
                           "(GeoJSON is lon, lat; a polygon across ±180° is cut there into a MultiPolygon)")
    if not geometry.is_valid:
        raise RequestError(422, field, f"invalid geometry: {explain_validity(geometry)} (a ring must not cross "
                           "or touch itself, holes lie inside their shell)")
    area = area_km2(geometry)
    if area > MAX_AREA_KM2:
        raise RequestError(413, field, f"the polygon covers {area:,.0f} km², more than the limit of "
                           f"{MAX_AREA_KM2:,.0f} km²")
    if area <= 0:
        raise RequestError(422, field, "the polygon has no area")
    assert isinstance(geometry, Polygon | MultiPolygon)
    return geometry


def area_km2(geometry: Polygon | MultiPolygon) -> float:
    """A lon/lat geometry's area on the WGS84 ellipsoid, in km²."""
    area, _ = GEOD.geometry_area_perimeter(geometry)
    return abs(area) / 1e6


def bbox_of(geometries: Iterable[Polygon | MultiPolygon]) -> tuple[float, float, float, float]:
    """The lon/lat box of geometries; one whose parts meet ±180° from both sides (a polygon
    across the antimeridian, cut there) has west > east, as a box across ±180° does."""
    parts = [p for g in geometries for p in (g.geoms if isinstance(g, MultiPolygon) else [g])]
    west, south, east, north = shapely.total_bounds(parts)
    at_east = [p for p in parts if p.bounds[2] >= 180.0]
    at_west = [p for p in parts if p.bounds[0] <= -180.0]
    if at_east and at_west:  # it crosses ±180°: the box from the eastern parts' west to the western parts' east
        rest = [p for p in parts if p not in at_east and p not in at_west]
        west = min(p.bounds[0] for p in at_east + [r for r in rest if r.bounds[0] >= 0])
        east = max(p.bounds[2] for p in at_west + [r for r in rest if r.bounds[2] < 0])
    return float(west), float(south), float(east), float(north)


# --- zones -------------------------------------------------------------------------------
def zones_of(value: Any, field: str = "zones") -> list[Zone]:
    """Zones from a GeoJSON FeatureCollection whose features are polygons, each with an id
    (the feature's ``id``, else its property ``id`` or ``name``): unique, at most
    :data:`MAX_ZONES`, their vertices :data:`MAX_VERTICES` in all."""
    if not isinstance(value, dict) or value.get("type") != "FeatureCollection" or not isinstance(
            value.get("features"), list):
        raise RequestError(422, field, "zones are a GeoJSON FeatureCollection of Polygon or MultiPolygon features, "
                           "each with an id")
    features = value["features"]
    if not features:
        raise RequestError(422, field, "the FeatureCollection has no feature")
    if len(features) > MAX_ZONES:
        raise RequestError(413, field, f"{len(features):,} zones, more than the limit of {MAX_ZONES:,}")
    budget = [MAX_VERTICES]
    found: list[Zone] = []
    seen: set[str] = set()
    for number, feature in enumerate(features):
        where = f"{field}.features[{number}]"
        if not isinstance(feature, dict):
            raise RequestError(422, where, "not a GeoJSON Feature")
        properties = feature.get("properties") or {}
        raw = feature.get("id", properties.get("id", properties.get("name")) if isinstance(properties, dict)
                          else None)
        ident = _ident(raw, where + ".id")
        if ident in seen:
            raise RequestError(422, where + ".id", f"zone id {ident!r} is given twice")
        seen.add(ident)
        found.append(Zone(ident, parse_polygon(feature.get("geometry"), where + ".geometry", budget)))
    return found


# --- sites -------------------------------------------------------------------------------
def _ident(value: Any, field: str) -> str:
    if isinstance(value, bool) or value is None or not isinstance(value, str | int):
        raise RequestError(422, field, "an id is a string or a whole number")
    text = str(value).strip()
    if not text or len(text) > MAX_ID or not text.isprintable():
        raise RequestError(422, field, f"an id is 1 to {MAX_ID} printable characters")
    return text


def _coordinate(value: Any, low: float, high: float, field: str, what: str) -> float:
    if isinstance(value, bool):
        raise RequestError(422, field, f"{what} is a number, not true or false")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise RequestError(422, field, f"{what} {str(value)[:40]!r} is not a number") from None
    if not math.isfinite(number) or not low <= number <= high:
        raise RequestError(422, field, f"{what} {number:g} is not within [{low:g}, {high:g}]")
    return round(number, DIGITS)


def site(ident: Any, lon: Any, lat: Any, where: str) -> Site:
    return Site(_ident(ident, f"{where}.id"), _coordinate(lon, -180, 180, f"{where}.lon", "longitude"),
                _coordinate(lat, -90, 90, f"{where}.lat", "latitude"))


def sites_of(value: Any, field: str = "sites.points") -> list[Site]:
    """Sites from a JSON list of ``{id, lon, lat}`` (or ``[id, lon, lat]``), a GeoJSON
    FeatureCollection of Points with ids, or CSV text with a header naming ``id``, ``lon``
    (or ``longitude``, ``x``) and ``lat`` (``latitude``, ``y``): unique ids, at most
    :data:`MAX_SITES`. A refusal names the item (``sites.points[3].lon``; a CSV's line)."""
    if isinstance(value, str):
        return _checked(_csv_sites(value, field), field)
    if isinstance(value, dict) and value.get("type") == "FeatureCollection":
        features = value.get("features")
        if not isinstance(features, list):
            raise RequestError(422, field, "a FeatureCollection has a list of features")
        _count(len(features), field)
        found = []
        for number, feature in enumerate(features):
            where = f"{field}[{number}]"
            geometry = feature.get("geometry") if isinstance(feature, dict) else None
            if not isinstance(geometry, dict) or geometry.get("type") != "Point":
                raise RequestError(422, where, "a site is a Point feature")
            coordinates = geometry.get("coordinates")
            if not isinstance(coordinates, list) or len(coordinates) < 2:
                raise RequestError(422, where, "a Point's coordinates are [lon, lat]")
            properties = feature.get("properties") or {}
            ident = feature.get("id", properties.get("id", properties.get("name")) if isinstance(properties, dict)
                                else None)
            found.append(site(ident, coordinates[0], coordinates[1], where))
        return _checked(found, field)
    if not isinstance(value, list):
        raise RequestError(422, field, "sites are a list of {id, lon, lat}, a GeoJSON FeatureCollection of Points "
                           "or a CSV with columns id, lon, lat")
    _count(len(value), field)
    found = []
    for number, item in enumerate(value):
        where = f"{field}[{number}]"
        if isinstance(item, dict):
            unknown = set(item) - {"id", "lon", "lat"}
            if unknown or not {"id", "lon", "lat"} <= set(item):
                raise RequestError(422, where, "a site is {\"id\", \"lon\", \"lat\"}")
            found.append(site(item["id"], item["lon"], item["lat"], where))
        elif isinstance(item, list) and len(item) == 3:
            found.append(site(item[0], item[1], item[2], where))
        else:
            raise RequestError(422, where, "a site is {\"id\", \"lon\", \"lat\"} or [id, lon, lat]")
    return _checked(found, field)


COLUMNS = {"id": ("id", "site", "name"), "lon": ("lon", "longitude", "long", "x"), "lat": ("lat", "latitude", "y")}


def _csv_sites(text: str, field: str) -> list[Site]:
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    header = [h.strip().lower() for h in next(reader, [])]
    where: dict[str, int] = {}
    for column, names in COLUMNS.items():
        index = next((header.index(n) for n in names if n in header), None)
        if index is None:
            raise RequestError(422, field, f"the CSV's header has no {column} column (it has {', '.join(header)[:80]})")
        where[column] = index
    found: list[Site] = []
    for line, row in enumerate(reader, start=2):
        if not any(cell.strip() for cell in row):
            continue
        _count(len(found) + 1, field)
        if len(row) <= max(where.values()):
            raise RequestError(422, field, f"line {line} has {len(row)} columns, the header {len(header)}")
        place = f"{field} line {line}"
        found.append(Site(_ident(row[where["id"]], f"{place}, column {header[where['id']]}"),
                          _coordinate(row[where["lon"]].strip(), -180, 180, f"{place}, column "
                                      f"{header[where['lon']]}", "longitude"),
                          _coordinate(row[where["lat"]].strip(), -90, 90, f"{place}, column "
                                      f"{header[where['lat']]}", "latitude")))
    return found


def _count(count: int, field: str) -> None:
    if count > MAX_SITES:
        raise RequestError(413, field, f"more than {MAX_SITES:,} sites")


def _checked(found: list[Site], field: str) -> list[Site]:
    if not found:
        raise RequestError(422, field, "no site is given")
    seen: set[str] = set()
    for one in found:
        if one.id in seen:
            raise RequestError(422, field, f"site id {one.id!r} is given twice")
        seen.add(one.id)
    return found




# --- kept documents and their summaries ---------------------------------------------------
def touched_runs(tiles: Iterable[TargetTile]) -> str:
    """Target tiles as rows of column runs (``row:c0..c1,c2..c3;…``): what a request keeps of
    the tiles a polygon touches, a few characters a row of a continent at 1°."""
    rows: dict[int, list[int]] = {}
    for tile in tiles:
        rows.setdefault(tile.row, []).append(tile.col)
    parts = []
    for row in sorted(rows):
        runs: list[list[int]] = []
        for col in sorted(set(rows[row])):
            if runs and runs[-1][1] == col - 1:
                runs[-1][1] = col
            else:
                runs.append([col, col])
        parts.append(f"{row}:" + ",".join(f"{a}..{b}" for a, b in runs))
    return ";".join(parts)


def footprint_of(tile: TargetTile) -> Polygon:
    """A target tile's outline in lon/lat (densified edges, as its CRS bends them)."""
    west, south, east, north = tile.bounds()
    if tile.grid.crs.upper() in ("EPSG:4326", "OGC:CRS84"):
        return shapely.box(west, south, east, north)
    steps = 16
    xs = [west + (east - west) * i / steps for i in range(steps)] + [east] * steps + [
        east - (east - west) * i / steps for i in range(steps)] + [west] * steps
    ys = [south] * steps + [south + (north - south) * i / steps for i in range(steps)] + [north] * steps + [
        north - (north - south) * i / steps for i in range(steps)]
    lon, lat = _to_lonlat(tile.grid.crs).transform(xs, ys)
    return Polygon(zip(lon, lat, strict=True)).buffer(0)


def _to_lonlat(crs: str) -> Any:
    from pyproj import CRS, Transformer
    return Transformer.from_crs(CRS.from_user_input(crs), CRS.from_epsg(4326), always_xy=True)


def touching(grid: GridSpec, geometries: Sequence[Polygon | MultiPolygon],
             bbox: tuple[float, float, float, float], field: str, limit: int) -> list[TargetTile]:
    """The target tiles of ``grid`` that the geometries touch (their box's tiles, each
    tested against them through a spatial index); a RequestError naming ``field`` past
    ``limit`` tiles in the box."""
    try:
        count = grid.count_for_lonlat_box(*bbox)
    except ValueError as exc:
        raise RequestError(400, "grid.crs", str(exc)) from None
    if count > limit:
        raise RequestError(413, field, f"the polygons' box covers {count} target tiles, more than {limit}; "
                           "choose larger tiles (grid.tile_size)")
    tree = shapely.STRtree(list(geometries))
    found = []
    for tile in grid.tiles_for_lonlat_box(*bbox):
        outline = footprint_of(tile)
        if len(tree.query(outline, predicate="intersects")):
            found.append(tile)
    return found


MAX_TOUCHED = 20_000  # target tiles a polygon's box may cover (each tested against it)


def summarize_polygons(geometries: Sequence[Polygon | MultiPolygon], grid: GridSpec, field: str
                       ) -> dict[str, Any]:
    """What a request keeps of polygons beside their digest: their box, their count and the
    target tiles they touch."""
    bbox = bbox_of(geometries)
    tiles = touching(grid, geometries, bbox, field, MAX_TOUCHED)
    if not tiles:
        raise RequestError(400, field, "the polygons touch no target tile")
    return {"bbox": list(bbox), "count": len(geometries), "touched": touched_runs(tiles)}


def summarize_sites(sites: Sequence[Site]) -> dict[str, Any]:
    """What a request keeps of sites beside their digest: their box, their count, and the
    MODIS tiles holding them with how many each (a point task per granule of each)."""
    counts: dict[str, int] = {}
    for one in sites:
        name = locate(one.lon, one.lat, TILE_PIXELS_500M)[0].name
        counts[name] = counts.get(name, 0) + 1
    lons, lats = [s.lon for s in sites], [s.lat for s in sites]
    return {"bbox": [min(lons), min(lats), max(lons), max(lats)], "count": len(sites), "tiles": counts}


Store = Callable[[dict[str, Any]], str]  # keeps a document, returns its digest
Load = Callable[[str], dict[str, Any]]  # a kept document by its digest (KeyError: none)


def kept(request: JobRequest, store: Store, load: Load) -> JobRequest:
    """The request with each vector it gives inline (a region's polygon, sites, zones) read,
    checked and kept (``store``), and each it names by digest read back (``load``), replaced
    by its digest and summary (:class:`request.Kept`): what the job row stores and planning
    reads. RequestError naming the field if one is refused or a digest names nothing."""
    changes: dict[str, Any] = {}
    grid = (request.grid or Grid()).spec()
    region = request.region
    if region is not None and region.polygon:
        if region.geometry is not None:
            geometry = parse_polygon(region.geometry, "region.geometry")
            ref = store(region_document(geometry))
        else:
            assert region.kept is not None
            geometry = science_vectors.polygon(_load(load, region.kept.ref, "region", "region.kept.ref")["geometry"])
            ref = region.kept.ref
        changes["region"] = Region(kept=Kept(ref=ref, **summarize_polygons([geometry], grid, "region.geometry")),
                                   bbox=region.bbox)
    if request.zones is not None:
        zones = request.zones
        if zones.features is not None:
            found = zones_of(zones.features, "zones")
            ref = store(zones_document(found))
        else:
            assert zones.kept is not None
            found = zones_from(_load(load, zones.kept.ref, "zones", "zones.kept.ref"))
            ref = zones.kept.ref
        summary = summarize_polygons([z.geometry for z in found], grid, "zones")
        changes["zones"] = zones.model_copy(update={"features": None, "kept": Kept(ref=ref, **summary)})
    if request.sites is not None:
        sites = request.sites
        if sites.points is not None:
            points = sites_of(sites.points, "sites.points")
            ref = store(sites_document(points))
        else:
            assert sites.kept is not None
            points = sites_from(_load(load, sites.kept.ref, "sites", "sites.kept.ref"))
            ref = sites.kept.ref
        changes["sites"] = sites.model_copy(update={"points": None, "kept": Kept(ref=ref, **summarize_sites(points))})
    return request.model_copy(update=changes) if changes else request


def _load(load: Load, ref: str, kind: str, field: str) -> dict[str, Any]:
    try:
        document = load(ref)
    except KeyError:
        raise RequestError(400, field, f"no kept document {ref[:16]}…: upload it first (POST /api/vectors)") from None
    if document.get("kind") != kind:
        raise RequestError(400, field, f"document {ref[:16]}… holds {document.get('kind')}, not {kind}")
    return document


def digest_only(document: dict[str, Any]) -> str:
    """A :data:`Store` that keeps nothing (an estimate): the digest alone."""
    return digest_of(document)


def document_of(value: Any, kind: str, field: str) -> dict[str, Any]:
    """An upload of ``kind`` (sites, zones, region) read and checked into the document kept
    for it: what ``POST /api/vectors`` takes."""
    if kind == "sites":
        return sites_document(sites_of(value, field))
    if kind == "zones":
        return zones_document(zones_of(value, field))
    if kind == "region":
        return region_document(parse_polygon(value, field))
    raise RequestError(422, "kind", f"a kept document is sites, zones or region, not {kind[:20]!r}")
