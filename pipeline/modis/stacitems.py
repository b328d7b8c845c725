"""A job's products as a static STAC catalog: the job is a collection, each product an item.

A tile task's item holds one asset per layer it made (a reprojected COG); a reduction's item
holds the rasters its program left (and a picture it left as the overview). ``rio-stac``
reads each file for what it truly is: lon/lat geometry and bbox, the projection extension
(CRS, transform, shape) and the raster extension (data type, nodata, scale, offset, unit per
band). The period is ``start_datetime``/``end_datetime`` (``datetime``: its first day). The
provenance is in ``bagpipe:*`` properties: the granules read (ids, as the catalog named them,
and the catalog), the stage and its version, the reducer (name, version, digest) and
bagpipe's version; a reduction's item links (``derived_from``) to the items it was made of.

Item ids are made of what the product is (product, tile, period; a reduction's reducer), not
of the job: a rerun that finds every tile ``CACHED`` writes the same items, in a collection
of its own job. Every href is relative: the folder opens as it is (QGIS's STAC plugin,
``pystac``, ``odc.stac``) wherever it is moved.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, time
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pystac
import rasterio
import shapely.affinity
import shapely.geometry
from rio_stac import create_stac_item
from rio_stac.stac import get_raster_info

from pipeline.modis import layout, synthetic
from pipeline.modis.granules import from_param
from pipeline.modis.products import CATALOG
from pipeline.modis.targets import lonlat_bounds

COLLECTION_FILE = "collection.json"
RASTERS = (".tif", ".tiff")
PICTURES = {".png": pystac.MediaType.PNG, ".jpg": pystac.MediaType.JPEG}
COG = pystac.MediaType.COG
PREFIX = "bagpipe"
RASTER_SCHEMA = "https://stac-extensions.github.io/raster/v1.1.0/schema.json"  # rio-stac's raster extension


def bagpipe_version() -> str:
    """The installed bagpipe's version (the package's metadata)."""
    try:
        return metadata.version("bagpipe")
    except metadata.PackageNotFoundError:  # run from a checkout that is not installed
        return "unknown"


def item_id(task: dict[str, Any]) -> str:
    """What the product is, as an id: product.tile.date for a tile (tile "region": its
    mosaic), with the span's last period and the reducer for a program's reduction; a
    built-in's by its name, tile and group; a climatology by its layer, tile and days."""
    if task["stage"] == layout.CLIMATOLOGY:
        _, product, layer = layout.document(task, "input")
        return f"{product}.{layer}.climatology.{task['tile']}.{layout.span(task)}"
    if task["stage"] == "mosaic":
        return f"{task['region']}.region" + (f".{task['reducer'].replace('@', '-v')}" if task.get("reducer") else "")
    if task.get("group"):
        found = f"{layout.folder(task)}.{task['tile']}.{task['group']}"
    else:
        found = f"{task['product']}.{task['tile']}.{task['date']}" + (f"_{task['last']}" if task.get("last") else "")
    return found + (f".{task['reducer'].replace('@', '-v')}" if task.get("reducer") else "")


def granule_ids(task: dict[str, Any]) -> list[str]:
    """The granules a tile task read, as its catalog named them (production time included)."""
    return sorted(g.id for g in from_param(task["granules"])) if task.get("granules") else []


def _provenance(task: dict[str, Any], catalog: dict[str, Any], sources: Iterable[str]) -> dict[str, Any]:
    product = CATALOG[task["product"]]
    found: dict[str, Any] = {
        f"{PREFIX}:product": product.name, f"{PREFIX}:tile": task["tile"], f"{PREFIX}:stage": task["stage"],
        f"{PREFIX}:sources": sorted(set(sources)),
        f"{PREFIX}:catalog": catalog | {"collection": product.stac_collection if catalog.get("kind") == "stac"
                                        else f"{product.name}.{product.cmr_version}"},
        f"{PREFIX}:version": bagpipe_version(),
        "platform": product.platform, "constellation": "modis",
    }
    if task.get("reducer"):
        name, _, version = task["reducer"].partition("@")
        found[f"{PREFIX}:reducer"] = {"name": name, "version": version or None, "installed": not task.get("bundle"),
                                      "digest": task.get("bundle") or task.get("digest") or None,
                                      "args": layout.document(task, "args") or {}}
    return found


def _named(file: str | Path) -> PurePosixPath:
    """A product's file name, whether ``file`` is a path or a link (its query left out)."""
    return PurePosixPath(urlsplit(str(file)).path if "://" in str(file) else str(file))


def build_item(task: dict[str, Any], files: Sequence[str | Path], catalog: dict[str, Any],
               sources: Iterable[str] = ()) -> pystac.Item | None:
    """The item of one task's products (``files``: paths, or links rasterio reads over HTTP;
    they are the asset hrefs, until a catalog makes them relative or an API signs them
    anew); None if it made no raster. ``sources``: a reduction's granules (its tiles')."""
    if layout.is_gather(task):
        return gather_item(task, files)
    rasters = [str(f) for f in files if _named(f).suffix.lower() in RASTERS]
    if not rasters:
        return None
    first, last = layout.dates(task)
    start, end = datetime.combine(first, time(), UTC), datetime.combine(last, time(23, 59, 59), UTC)
    stage_versions = set()
    made_of_synthetic = False
    assets: dict[str, pystac.Asset] = {}
    for href in rasters:
        with rasterio.open(href) as src:
            tags = src.tags()
            bands = get_raster_info(src, max_size=1024)
        key = tags.get("NAME") or (tags.get("LAYER") if task["stage"] != "reduce" and tags.get("LAYER") else None) \
            or _named(href).stem
        if tags.get("BAGPIPE_STAGE"):
            stage_versions.add(tags["BAGPIPE_STAGE"])
        made_of_synthetic = made_of_synthetic or tags.get(synthetic.TAG) == "true"
        assets[key] = pystac.Asset(href, title=key, media_type=COG, roles=["data"],
                                   extra_fields={"raster:bands": bands})
    for file in files:
        name = _named(file)
        if name.suffix.lower() in PICTURES:
            key = name.stem if name.stem not in assets else f"{name.stem}-overview"
            assets[key] = pystac.Asset(str(file), title=name.stem, media_type=PICTURES[name.suffix.lower()],
                                       roles=["overview"])
    own = granule_ids(task)
    properties = _provenance(task, catalog, own or sources) | {
        "start_datetime": pystac.utils.datetime_to_str(start), "end_datetime": pystac.utils.datetime_to_str(end)}
    if stage_versions:
        properties[f"{PREFIX}:stage_version"] = ",".join(sorted(stage_versions))
    if made_of_synthetic:  # made by the local stack from its imitation's synthesized granules
        properties[synthetic.SYNTHETIC] = True
    item = create_stac_item(rasters[0], input_datetime=start, properties=properties, id=item_id(task),
                            assets=assets, with_proj=True, with_raster=False, geom_densify_pts=21,
                            geom_precision=6)
    item.stac_extensions.append(RASTER_SCHEMA)
    _wrap(item)
    return pystac.Item.from_dict(item.to_dict(), migrate=True)  # projection v2 (proj:code), as pystac writes it


def _wrap(item: pystac.Item) -> None:
    """An item whose raster runs past ±180° (a region mosaic in a grid continuous across it)
    given as GeoJSON has it: its footprint cut there into a MultiPolygon of both sides, its
    box's west above its east."""
    if item.bbox is None or (-180.0 <= item.bbox[0] and item.bbox[2] <= 180.0):
        return
    footprint = shapely.geometry.shape(item.geometry)
    sides = [shapely.affinity.translate(footprint.intersection(shapely.geometry.box(w, -90.0, e, 90.0)), -shift)
             for w, e, shift in ((-540.0, -180.0, -360.0), (-180.0, 180.0, 0.0), (180.0, 540.0, 360.0))]
    polygons = [p for side in sides if not side.is_empty
                for p in (side.geoms if isinstance(side, shapely.geometry.MultiPolygon) else [side])]
    item.geometry = shapely.geometry.mapping(shapely.geometry.MultiPolygon(polygons))
    west, south, east, north = item.bbox
    item.bbox = [west + 360.0 if west < -180.0 else west, south, east - 360.0 if east > 180.0 else east, north]


TABLES = {".csv": "text/csv", ".parquet": "application/vnd.apache.parquet", ".nc": "application/netcdf",
          ".zip": "application/zip", ".json": "application/json"}
DATACUBE_SCHEMA = "https://stac-extensions.github.io/datacube/v2.2.0/schema.json"


def gather_item(task: dict[str, Any], files: Sequence[str | Path]) -> pystac.Item | None:
    """The item of a gather's table or cube: its files as assets, its box and span from its
    parameters (``bbox``, ``start``, ``end``); a cube's with the datacube extension (its
    dimensions and its variable)."""
    if not files or not task.get("bbox"):
        return None
    west, south, east, north = layout.numbers(task["bbox"])
    first, last = date.fromisoformat(task["start"]), date.fromisoformat(task["end"])
    start, end = datetime.combine(first, time(), UTC), datetime.combine(last, time(23, 59, 59), UTC)
    boxes = [(west, south, east, north)] if west <= east else [(west, south, 180.0, north),
                                                               (-180.0, south, east, north)]
    geometry = {"type": "MultiPolygon", "coordinates": [[[[w, s], [e, s], [e, n], [w, n], [w, s]]]
                                                        for w, s, e, n in boxes]}
    name = task.get("name") or task["stage"]
    properties: dict[str, Any] = {"start_datetime": pystac.utils.datetime_to_str(start),
                                  "end_datetime": pystac.utils.datetime_to_str(end),
                                  f"{PREFIX}:stage": task["stage"], f"{PREFIX}:version": bagpipe_version()}
    item = pystac.Item(f"{layout.folder(task)}.{name}", geometry, [west, south, east, north], start, properties)
    for file in files:
        suffix = _named(file).suffix.lower()
        item.add_asset(_named(file).name.split(".")[-2] if suffix == ".zip" else suffix.lstrip("."),
                       pystac.Asset(str(file), title=_named(file).name, media_type=TABLES.get(suffix),
                                    roles=["data"]))
    if task["stage"] == "cube":
        unit = (layout.document(task, "encoding") or {}).get("unit", "")
        item.stac_extensions.append(DATACUBE_SCHEMA)
        item.properties["cube:dimensions"] = {
            "time": {"type": "temporal", "extent": [properties["start_datetime"], properties["end_datetime"]]},
            "x": {"type": "spatial", "axis": "x", "extent": [west, east], "reference_system": task.get("crs", 4326)},
            "y": {"type": "spatial", "axis": "y", "extent": [south, north], "reference_system": task.get("crs", 4326)}}
        item.properties["cube:variables"] = {name: {"dimensions": ["time", "y", "x"], "type": "data",
                                                    **({"unit": unit} if unit else {})}}
    return item


def build_collection(manifest: dict[str, Any], items: list[pystac.Item]) -> pystac.Collection:
    """The job as a collection of its items: its region and span, and summaries of what it holds."""
    request = manifest["request"]
    boxes = [item.bbox for item in items if item.bbox] or [list(_request_box(manifest))]
    starts = [pystac.utils.str_to_datetime(i.properties["start_datetime"]) for i in items]
    ends = [pystac.utils.str_to_datetime(i.properties["end_datetime"]) for i in items]
    span = [min(starts), max(ends)] if items else [datetime.combine(date.fromisoformat(request["start"]), time(), UTC),
                                                   datetime.combine(date.fromisoformat(request["end"]), time(), UTC)]
    extent = pystac.Extent(pystac.SpatialExtent([_box_of(boxes)]),
        pystac.TemporalExtent([span]))
    label = manifest.get("label") or ""
    # a summary lists what the items hold: none for a job without products (the schema wants a value)
    summaries = {key: sorted({i.properties[key] for i in items})
                 for key in (f"{PREFIX}:product", f"{PREFIX}:tile", f"{PREFIX}:stage", "platform")}
    collection = pystac.Collection(
        id=manifest["job"], title=label or f"bagpipe job {manifest['job']}", extent=extent, license="other",
        description=f"The products of bagpipe job {manifest['job']}{f' ({label})' if label else ''}: "
                    f"{', '.join(request['products'])} from {request['start']} to {request['end']}, "
                    f"{manifest['state'].lower()}.",
        summaries=pystac.Summaries({key: values for key, values in summaries.items() if values}),
        extra_fields={f"{PREFIX}:job": manifest["job"],  # the request without its owner's address
                      f"{PREFIX}:request": {k: v for k, v in request.items() if k != "email"},
                      f"{PREFIX}:version": bagpipe_version()})
    return collection


def _box_of(boxes: Sequence[Sequence[float]]) -> list[float]:
    """The lon/lat box of ``boxes``; across ±180° (west above east) when one of them is: a
    job's items all lie about the region, so those west of ±180° give its west edge and
    those east of it its east edge."""
    south, north = min(b[1] for b in boxes), max(b[3] for b in boxes)
    if all(b[0] <= b[2] for b in boxes):
        return [min(b[0] for b in boxes), south, max(b[2] for b in boxes), north]
    return [min(b[0] for b in boxes if b[0] > b[2] or b[0] >= 0), south,
            max(b[2] for b in boxes if b[0] > b[2] or b[2] < 0), north]


def _request_box(manifest: dict[str, Any]) -> tuple[float, float, float, float]:
    region = manifest["request"]["region"]
    if region.get("bbox"):
        west, south, east, north = (float(v) for v in region["bbox"])
        return west, south, east, north
    boxes = [lonlat_bounds(t["crs"], t["bounds"]) for t in manifest["tasks"]]
    return (min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes))


def write_catalog(out: Path, manifest: dict[str, Any]) -> Path:
    """Write the job's STAC collection (``collection.json``) and an item beside each task's
    files, every link relative; each manifest task gets ``item`` (its item's path), the
    manifest ``stac``. Returns the collection's path."""
    out = out.resolve()  # pystac takes a relative path for one relative to its item: each file named from here
    catalog = manifest.get("catalog") or {}
    by_key = layout.by_task(manifest["tasks"])
    items: list[pystac.Item] = []
    made: dict[tuple[str, str], pystac.Item] = {}  # by task and tile (a task of several places has an item per place)
    paths: dict[str, Path] = {}
    for task in sorted(manifest["tasks"], key=layout.waits):  # tiles first
        files = [out / name for name in task.get("files", [])]
        if not files:
            continue
        folder = files[0].parent
        deps = layout.dependencies(task, by_key)
        sources = [g for dep in deps for g in granule_ids(dep)]
        item = build_item(task, files, catalog, sources)
        if item is None:
            continue
        for dep in deps:
            if (dep["task"], str(dep.get("tile"))) in made:
                item.add_link(pystac.Link("derived_from", made[(dep["task"], str(dep.get("tile")))],
                                          media_type=pystac.MediaType.GEOJSON))
        made[(task["task"], str(task.get("tile")))] = item
        paths[item.id] = folder / f"{item.id}.json"
        task["item"] = paths[item.id].relative_to(out).as_posix()
        items.append(item)
    items += region_items(out, manifest, made, catalog, paths)
    collection = build_collection(manifest, items)
    collection.add_items(items)
    collection.set_self_href(str(out / COLLECTION_FILE))
    for item in items:
        item.set_self_href(str(paths[item.id]))
    collection.make_all_asset_hrefs_relative()
    collection.save(catalog_type=pystac.CatalogType.SELF_CONTAINED)
    manifest["stac"] = COLLECTION_FILE
    return out / COLLECTION_FILE


def region_items(out: Path, manifest: dict[str, Any], made: dict[tuple[str, str], pystac.Item],
                 catalog: dict[str, Any], paths: dict[str, Path]) -> list[pystac.Item]:
    """An item per region mosaic of a product and period (tile ``region``, stage ``mosaic``),
    ``derived_from`` the items it mosaics (each tile's of the tasks it names), naming all
    their granules."""
    by_key = layout.by_task(manifest["tasks"])
    items_of: dict[str, list[pystac.Item]] = {}
    for (of_task, _), one in made.items():
        items_of.setdefault(of_task, []).append(one)
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for entry in manifest.get("regions", []):
        groups.setdefault((entry["folder"], entry["span"], entry["product"]), []).append(entry)
    found = []
    for (name, span, product), mosaics in sorted(groups.items()):
        tasks = [one for entry in mosaics for t in dict.fromkeys(entry["tasks"]) for one in items_of.get(t, [])]
        reduced = [by_key[t][0] for entry in mosaics for t in entry["tasks"] if by_key[t][0].get("reducer")]
        program: dict[str, Any] = {key: reduced[0][key] for key in ("reducer", "bundle", "digest", "args")
                                   if key in reduced[0]} if reduced else {}
        first = mosaics[0]
        task = {"stage": "mosaic", "product": product, "tile": "region", "date": first["start"],
                "start": first["start"], "end": first["end"], "region": f"{name}.{span}", **program}
        files = [out / entry["file"] for entry in mosaics]
        item = build_item(task, files, catalog, [g for i in tasks for g in i.properties[f"{PREFIX}:sources"]])
        if item is None:
            continue
        for source in {i.id: i for i in tasks}.values():
            item.add_link(pystac.Link("derived_from", source, media_type=pystac.MediaType.GEOJSON))
        paths[item.id] = files[0].parent / f"{item.id}.json"
        found.append(item)
    return found
