"""Points and polygons as the tasks that read them keep them: a sample's sites, the zones of
zonal statistics, a region's polygon — each one canonical JSON document, named by its
SHA-256 (which the outputs made from it name in their content addresses). The request side
(``pipeline.requests.vectors``) reads and checks what a scientist gives; this module only
writes and reads the documents."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import shapely
from shapely.geometry import MultiPolygon, Polygon, mapping, shape

DIGITS = 7  # decimals kept of a coordinate (about a centimetre)


@dataclass(frozen=True)
class Site:
    """One point of a sample: its id and where it is (lon/lat degrees)."""

    id: str
    lon: float
    lat: float


@dataclass(frozen=True)
class Zone:
    """One polygon of zonal statistics: its id and its (valid) lon/lat geometry."""

    id: str
    geometry: Polygon | MultiPolygon


def canonical(document: dict[str, Any]) -> bytes:
    """A document's canonical JSON: the bytes kept, and hashed."""
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def digest_of(document: dict[str, Any]) -> str:
    """The SHA-256 of a document's canonical JSON: its name where it is kept."""
    return hashlib.sha256(canonical(document)).hexdigest()


def rounded(geometry: Polygon | MultiPolygon) -> dict[str, Any]:
    """A geometry as GeoJSON with its coordinates rounded to :data:`DIGITS` decimals."""
    found: dict[str, Any] = json.loads(json.dumps(mapping(
        shapely.set_precision(geometry, 10**-DIGITS, mode="pointwise"))))
    return found


def polygon(value: dict[str, Any]) -> Polygon | MultiPolygon:
    """A kept GeoJSON polygon (checked when it was kept) as a shapely geometry."""
    geometry = shape(value)
    if not isinstance(geometry, Polygon | MultiPolygon):
        raise ValueError(f"a kept polygon is a {geometry.geom_type}")
    return geometry


def region_document(geometry: Polygon | MultiPolygon) -> dict[str, Any]:
    return {"kind": "region", "geometry": rounded(geometry)}


def sites_document(sites: Sequence[Site]) -> dict[str, Any]:
    return {"kind": "sites", "sites": [[s.id, s.lon, s.lat] for s in sites]}


def sites_from(document: dict[str, Any]) -> list[Site]:
    return [Site(str(i), float(x), float(y)) for i, x, y in document["sites"]]


def zones_document(zones: Sequence[Zone]) -> dict[str, Any]:
    return {"kind": "zones", "zones": [{"id": z.id, "geometry": rounded(z.geometry)} for z in zones]}


def zones_from(document: dict[str, Any]) -> list[Zone]:
    return [Zone(str(z["id"]), polygon(z["geometry"])) for z in document["zones"]]
