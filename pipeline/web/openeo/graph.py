"""An openEO process graph compiled onto a bagpipe request (``pipeline.requests.request``).

bagpipe runs a job as tile tasks (a target tile, a date, a product) and reductions (a target
tile, a group of dates), so a graph is taken apart into those:

- ``load_collection`` and ``filter_bbox``, ``filter_spatial``, ``filter_temporal``,
  ``filter_bands`` are the request's region (a lon/lat box, or polygons: ``region.geometry``,
  which every tile is clipped to), span, products and layers: a dry run pushes them down;
  ``mask_polygon`` is polygons that mask the box, which stays the extent (``region.bbox``
  with ``region.geometry``: every tile of the box, each clipped to them);
- per-date pixel work — ``ndvi``, ``reduce_dimension`` over ``bands`` (band math,
  ``normalized_difference``), ``apply``, ``mask`` by a cube of the same product — is the tile
  task's derived layers (``derive``: an expression per layer, ``pixels``);
- ``reduce_dimension`` over ``t`` and ``aggregate_temporal_period`` are the grouped reduction
  (``reduce``: by span, month, season or year, with a built-in reducer), and an ``apply``
  after it an expression over the reduced inputs;
- ``merge_cubes`` of two products is a reduction's several inputs (the bands of both);
- ``aggregate_spatial`` over polygons is the request's ``zones`` (a pixel counted whole if its
  centre is in a zone, as openEO defines it), per date, or after a temporal reduction over
  its outputs per group (``zones.over``); its table is saved as CSV or Parquet, the zones
  gather's files; at points it is the request's ``sites`` (the value of the MODIS pixel
  holding each point, per date), saved as openEO's time series JSON, CSV or Parquet, the
  sites gather's files;
- ``save_result`` picks the output format: GeoTIFF (a COG per tile and date or group), or a
  cube — netCDF or Zarr, the request's ``output.format``: one per layer and per reduction,
  written by the job's cube gathers over every tile.

The graph is parsed and checked by ``openeo-pg-parser-networkx`` (its data model: nodes,
references, arguments), then walked from its result node. Anything bagpipe cannot run per
tile — model fitting, resampling across tile edges — or any process it does not list is
refused here, naming the process,
before a task exists: a ``CompileError`` carries openEO's error code.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from datetime import date
from typing import Any

import shapely
from pydantic import ValidationError
from shapely.geometry import MultiPolygon, Polygon, shape

from pipeline.modis.products import CATALOG
from pipeline.reduction import bundles, udf
from pipeline.reduction.reducers import Program
from pipeline.requests.reductions import AGGREGATES
from pipeline.requests.request import JobRequest
from pipeline.web.openeo import parameters, pixels
from pipeline.web.openeo.parameters import CompileError
from pipeline.web.openeo.pixels import Bands, Expr

# bagpipe's processes at the cube level (the child graphs' are pixels.PROCESSES)
CUBE_PROCESSES = ("load_collection", "filter_bbox", "filter_spatial", "mask_polygon", "filter_temporal", "filter_bands",
                  "ndvi",
                  "reduce_dimension", "apply", "mask", "aggregate_temporal_period", "merge_cubes", "aggregate_spatial",
                  "apply_dimension", "save_result")
# a temporal reducer's process: the built-in it is (pipeline.science.builtins)
REDUCERS = {"min": "min", "max": "max", "mean": "mean", "median": "median", "sum": "sum", "count": "count",
            "sd": "std", "first": "first", "last": "last"}
PROCESSES = (*CUBE_PROCESSES, *pixels.PROCESSES, *REDUCERS, "quantiles", "run_udf")
UDF = "udf"  # the reduction a UDF is: its outputs' folder
_OPENEO = {bagpipe: openeo for openeo, bagpipe in REDUCERS.items()}
PERIODS = {"month": "month", "season": "season", "year": "year"}
# save_result's formats (openEO's names, any case), and the request's output.format each is
FORMATS = {"gtiff": "GTiff", "geotiff": "GTiff", "tiff": "GTiff", "netcdf": "netCDF", "nc": "netCDF", "zarr": "Zarr"}
FORMATS |= {"csv": "CSV", "parquet": "Parquet", "json": "JSON"}
OUTPUTS = {"GTiff": "cog", "netCDF": "netcdf", "Zarr": "zarr"}
CUBES = ("netCDF", "Zarr")  # a cube per layer or reduction (the gathers'), not a file per tile
TABLES = {"CSV": ".csv", "Parquet": ".parquet"}  # aggregate_spatial's table: the zones gather's file of each
SERIES = {**TABLES, "JSON": ".json"}  # at points: the sites gather's, openEO's time series JSON too
# why a known openEO process cannot run per tile here
NOT_PER_TILE = {
    "resample_spatial": "resampling crosses tile edges; bagpipe's grid is the request's",
    "resample_cube_spatial": "resampling crosses tile edges; bagpipe's grid is the request's",
    "apply_kernel": "a kernel reads across tile edges",
    "apply_neighborhood": "a neighbourhood reads across tile edges",
    "fit_curve": "model fitting needs every pixel of the region at once",
    "fit_class_random_forest": "model fitting needs every pixel of the region at once",
    "fit_regr_random_forest": "model fitting needs every pixel of the region at once",
    "aggregate_temporal": "only aggregate_temporal_period's month, season and year groups are here",
    "run_udf": "a UDF runs over a target tile's dates: as the reducer of reduce_dimension or "
               "aggregate_temporal_period over t, or the process of apply_dimension over t",
}
_NAME = re.compile(r"[^a-z0-9_]")


@dataclass(frozen=True)
class Band:
    """A band of the cube: a product's layer, or an expression over its layers (derived)."""

    product: str
    name: str
    expr: str  # over PRODUCT.LAYER names of its product
    raw: bool = True


@dataclass(frozen=True)
class Cube:
    """What a node of the graph makes, as far as bagpipe's tasks are concerned."""

    bands: tuple[Band, ...]
    bbox: tuple[float, float, float, float]  # with a polygon, its box
    start: date
    end: date  # the last day (openEO's end is exclusive)
    by: str = ""  # grouped by: a temporal reduction has run
    reducer: str = ""
    post: str = ""  # an expression over the reduced input (``x``) an apply after the reduction made
    has_bands: bool = True  # the bands dimension is there (ndvi or a reducer over bands drops it)
    polygon: str = ""  # the polygons the region is clipped to (a GeoJSON geometry in lon/lat, as JSON text)
    masked: bool = False  # the polygons mask the box, which stays the extent (mask_polygon), else they are it
    udf: str = ""  # the temporal reduction is a UDF's: its code, context and mode (JSON text, :func:`_udf`)

    @property
    def products(self) -> list[str]:
        return sorted({b.product for b in self.bands})


@dataclass(frozen=True)
class Table:
    """What ``aggregate_spatial`` makes: the zones' statistics of a cube's bands, a row per
    zone, band and date (or the temporal reduction's group); or, at points, the request's
    sites: a row per site, band and date."""

    cube: Cube
    zones: str  # a GeoJSON FeatureCollection of the zones, each with its id (JSON text)
    statistics: tuple[str, ...]
    percentiles: tuple[float, ...]
    sites: str = ""  # at points: the sites, [{id, lon, lat}…] in the geometries' order (JSON text), and no zones


@dataclass(frozen=True)
class Compiled:
    """A graph as bagpipe runs it: the request, and which of its products are the graph's
    result (a tile task's layers by product, or the reduction's outputs)."""

    request: JobRequest
    layers: dict[str, list[str]] = field(default_factory=dict)  # the result's layers per product (no reduction)
    reduction: str = ""  # the reduction whose outputs are the result
    format: str = "GTiff"
    udf: str = ""  # the reduction's UDF, if it is one: its code, context and mode (JSON text)

    def to_json(self) -> str:
        return json.dumps({"request": self.request.model_dump(mode="json", exclude_none=True), "layers": self.layers,
                           "reduction": self.reduction, "format": self.format}
                          | ({"udf": self.udf} if self.udf else {}))

    @classmethod
    def from_json(cls, text: str) -> Compiled:
        found = json.loads(text)
        return cls(JobRequest.model_validate(found["request"]), found["layers"], found["reduction"], found["format"],
                   found.get("udf", ""))

    def bundle(self) -> bundles.Bundle | None:
        """The reducer bundle of the reduction's UDF (None if it runs none): content-addressed,
        the same code, context and runtime the same digest."""
        if not self.udf:
            return None
        found = json.loads(self.udf)
        return udf.bundle(found["code"], found["context"], found["mode"])

    def program(self) -> Program | None:
        """What the reduction's UDF runs as: its bundle, by digest (None if it runs none)."""
        made = self.bundle()
        return Program(udf.NAME, "openeo", 1, made.digest, udf=True) if made is not None else None


# MODIS bands 1-7 by their EO common names
_MODIS_BANDS = ((1, "red"), (2, "nir"), (3, "blue"), (4, "green"), (6, "swir16"), (7, "swir22"))


def common_names(product: str) -> dict[str, str]:
    """A product's layers by their EO common names (``red``, ``nir``…): what ``ndvi`` finds
    its bands by. The vegetation indices' reflectances (MOD13: red, NIR, blue, and MIR, MODIS
    band 7), the surface and nadir BRDF-adjusted reflectances' bands (MOD09, MCD43A4)."""
    layers = CATALOG[product].layer_names if product in CATALOG else []
    vi = next((n.removesuffix("red_reflectance") for n in layers if n.endswith("_16_days_red_reflectance")), "")
    if vi:
        return {"red": f"{vi}red_reflectance", "nir": f"{vi}NIR_reflectance", "blue": f"{vi}blue_reflectance",
                "swir22": f"{vi}MIR_reflectance"}
    for pattern in ("sur_refl_b{:02d}", "Nadir_Reflectance_Band{}"):
        found = {name: pattern.format(b) for b, name in _MODIS_BANDS if pattern.format(b) in layers}
        if found:
            return found
    return {}


def _crs_names(value: Any) -> Any:
    """``value`` with each GeoJSON crs member given as a named CRS object (GeoJSON's 2008
    draft: ``{"type": "name", "properties": {"name": …}}``) given as its name: the same CRS,
    as the parser models a CRS (a name or a code; it fails on the object)."""
    if isinstance(value, list):
        return [_crs_names(v) for v in value]
    if not isinstance(value, dict):
        return value
    found = {key: _crs_names(v) for key, v in value.items()}
    crs = found.get("crs")
    if "type" in found and isinstance(crs, dict) and isinstance(crs.get("properties"), dict) and isinstance(
            crs["properties"].get("name"), str):
        found["crs"] = crs["properties"]["name"]
    return found


def parse(process: dict[str, Any]) -> dict[str, Any]:
    """The flat graph of a process (``{"process_graph": {...}}``), checked as
    ``openeo-pg-parser-networkx`` models it (every node a process with arguments, every
    reference to a node that exists, one result node, no cycle); ProcessGraphInvalid else."""
    # imported here: it brings dask and xarray (seconds of CPU), which only openEO's requests need
    from openeo_pg_parser_networkx import graph as pg_graph
    from openeo_pg_parser_networkx import pg_schema

    flat = process.get("process_graph") if isinstance(process, dict) else None
    if not isinstance(flat, dict) or not flat:
        raise CompileError("ProcessGraphMissing", "process.process_graph: no process graph given")
    flat = {key: _crs_names(node) for key, node in flat.items()}
    try:
        for key, node in flat.items():  # each node (the nested model takes a referenced node that is not one as data)
            try:
                pg_schema.ProcessNode.model_validate(node)
            except ValidationError as exc:
                first = exc.errors()[0]
                raise CompileError("ProcessGraphInvalid", f"process.process_graph.{key}."
                                   f"{'.'.join(str(p) for p in first['loc'][:3])}: {first['msg']}") from None
        nested = pg_graph.OpenEOProcessGraph._unflatten_raw_process_graph({"process_graph": flat})
        pg_graph.OpenEOProcessGraph._parse_datamodel(nested)
    except CompileError:
        raise
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][:4])
        raise CompileError("ProcessGraphInvalid", f"process.process_graph: {where}: {first['msg']}") from None
    except KeyError as exc:
        raise CompileError("ProcessGraphInvalid", f"process.process_graph: a reference to no node {exc}") from None
    except Exception as exc:  # the parser's own refusals (no result node, a cycle) are plain Exceptions
        raise CompileError("ProcessGraphInvalid", f"process.process_graph: {exc}") from None
    return flat


class _Walker:
    def __init__(self, flat: dict[str, Any]) -> None:
        self.flat = flat
        self.made: dict[str, Any] = {}
        self.format = "GTiff"
        self.names: set[str] = set()

    def cube(self, value: Any, process: str, name: str = "data") -> Cube:
        if not (isinstance(value, dict) and "from_node" in value):
            raise CompileError("ProcessParameterInvalid", f"{process}: argument {name} must be a data cube (the "
                               "result of another process)", process)
        found = self.node(str(value["from_node"]))
        if isinstance(found, Table):
            raise CompileError("ProcessUnsupported", f"{process}: after aggregate_spatial bagpipe saves its table "
                               "(save_result as CSV or Parquet)", process)
        if not isinstance(found, Cube):
            raise CompileError("ProcessParameterInvalid", f"{process}: argument {name} is not a data cube", process)
        return found

    def node(self, key: str) -> Any:
        if key not in self.made:
            node = self.flat[key]
            process, arguments = str(node["process_id"]), node.get("arguments") or {}
            handler = getattr(self, f"_{process}", None)
            if process not in CUBE_PROCESSES or handler is None:
                why = NOT_PER_TILE.get(process)
                raise CompileError("ProcessUnsupported", f"{process}: " + (
                    f"bagpipe cannot run it per tile: {why}" if why else
                    "not a process of this back end (GET /processes lists them)"), process)
            self.made[key] = handler(process, arguments)
        return self.made[key]

    def band_name(self, wanted: str) -> str:
        """A derived layer's name: lower case, unique in the graph, no catalog layer's."""
        base = _NAME.sub("_", wanted.lower())[:28].strip("_") or "band"
        if not base[0].isalpha():
            base = f"b_{base}"[:28]
        name, n = base, 1
        while name in self.names:
            n += 1
            name = f"{base}_{n}"
        self.names.add(name)
        return name

    # --- loading and filtering ------------------------------------------------------------------
    def _load_collection(self, process: str, a: dict[str, Any]) -> Cube:
        product = a.get("id")
        if product not in CATALOG:
            raise CompileError("CollectionNotFound", f"load_collection: no collection {product!r} (GET /collections: "
                               f"{', '.join(sorted(CATALOG))})", process)
        if a.get("properties"):
            raise CompileError("ProcessParameterUnsupported", "load_collection: properties filters are not supported",
                               process)
        extent = a.get("spatial_extent")
        polygon = (parameters.geojson(extent, process, "spatial_extent")
                   if isinstance(extent, dict) and "type" in extent else None)
        bbox = polygon.bounds if polygon is not None else parameters.bbox(extent, process, "spatial_extent")
        start, end = parameters.interval(a.get("temporal_extent"), process, "temporal_extent")
        layers = CATALOG[product].layer_names
        wanted = a.get("bands")
        chosen = layers if wanted is None else [_layer(product, str(b), process) for b in wanted]
        return Cube(tuple(Band(product, n, f"{product}.{n}") for n in chosen), bbox, start, end,
                    polygon=parameters.text(polygon) if polygon is not None else "")

    def _filter_bbox(self, process: str, a: dict[str, Any]) -> Cube:
        cube = self.cube(a.get("data"), process)
        return _restricted(cube, process, "extent", box=parameters.bbox(a.get("extent"), process, "extent"))

    def _filter_spatial(self, process: str, a: dict[str, Any]) -> Cube:
        """The region clipped to polygons (a pixel whose centre is in none is no data): the
        request's ``region.geometry``, which each date's tile is clipped to; so before a
        temporal reduction only (after one, a reducer's value of no dates — a count's 0 —
        would not be the no data openEO gives outside)."""
        cube = self.cube(a.get("data"), process)
        if cube.by:
            raise CompileError("ProcessUnsupported", "filter_spatial: after a temporal reduction (bagpipe clips each "
                               "date's tiles to the polygons: filter before reducing)", process)
        return replace(_restricted(cube, process, "geometries", polygon=parameters.geojson(a.get("geometries"), process,
                                                                                  "geometries")), masked=False)

    def _mask_polygon(self, process: str, a: dict[str, Any]) -> Cube:
        """The pixels whose centre is in no polygon (with ``inside``, in one) made no data,
        the extent kept: the request's region is the box and the polygons (``region.bbox``
        with ``region.geometry``), each of the box's tiles clipped to them. So before a
        temporal reduction only, as filter_spatial; and only to no data (a replacement value
        would need a second layer per band)."""
        cube = self.cube(a.get("data"), process)
        if cube.by:
            raise CompileError("ProcessUnsupported", "mask_polygon: after a temporal reduction (bagpipe clips each "
                               "date's tiles to the polygons: mask before reducing)", process)
        if a.get("replacement") is not None:
            raise CompileError("ProcessParameterUnsupported", "mask_polygon: replacement: bagpipe masks to no data "
                               "(replacement null)", process)
        inside = a.get("inside", False)
        if not isinstance(inside, bool):
            raise CompileError("ProcessParameterInvalid", "mask_polygon: inside is true or false", process)
        polygon = parameters.geojson(a.get("mask"), process, "mask")
        if inside:  # keep what is outside the polygons: the box less them
            outside = parameters.polygonal(shapely.box(*cube.bbox).difference(polygon))
            if outside is None:
                raise CompileError("ProcessParameterInvalid", "mask_polygon: mask: with inside true the polygons "
                                   "cover the data's whole extent, leaving no pixel", process)
            polygon = outside
        return replace(_restricted(cube, process, "mask", polygon=polygon), bbox=cube.bbox, masked=True)

    def _filter_temporal(self, process: str, a: dict[str, Any]) -> Cube:
        cube = self._per_date(self.cube(a.get("data"), process), process)
        start, end = parameters.interval(a.get("extent"), process, "extent")
        first, last = max(cube.start, start), min(cube.end, end)
        if first > last:
            raise CompileError("ProcessParameterInvalid", "filter_temporal: the extent does not overlap the data's",
                               process)
        return replace(cube, start=first, end=last)

    def _filter_bands(self, process: str, a: dict[str, Any]) -> Cube:
        cube = self.cube(a.get("data"), process)
        if a.get("wavelengths"):
            raise CompileError("ProcessParameterUnsupported", "filter_bands: wavelengths are not supported; name the "
                               "bands", process)
        names = [b.name for b in cube.bands]
        chosen = []
        for wanted in a.get("bands") or []:
            name = str(wanted)
            if name not in names:
                common = {c: layer for b in cube.bands for c, layer in common_names(b.product).items()}
                name = common.get(name, name)
            if name not in names:
                raise CompileError("ProcessParameterInvalid", f"filter_bands: no band {wanted!r} (bands: "
                                   f"{', '.join(names)})", process)
            chosen.append(cube.bands[names.index(name)])
        if not chosen:
            raise CompileError("ProcessParameterInvalid", "filter_bands: name one band or more", process)
        return replace(cube, bands=tuple(chosen))

    # --- per-date pixel work: derived layers ------------------------------------------------------
    def _per_date(self, cube: Cube, process: str) -> Cube:
        if cube.by:
            raise CompileError("ProcessUnsupported", f"{process}: after a temporal reduction bagpipe runs only "
                               "apply (an expression over what it made)", process)
        return cube

    def _ndvi(self, process: str, a: dict[str, Any]) -> Cube:
        cube = self._per_date(self.cube(a.get("data"), process), process)
        if len(cube.products) != 1:
            raise CompileError("ProcessUnsupported", "ndvi: of one product's bands (merge after it)", process)
        product = cube.products[0]
        found = {b.name: b for b in cube.bands}
        commons = common_names(product)
        pick = []
        for arg, default in (("nir", "nir"), ("red", "red")):
            wanted = str(a.get(arg) or default)
            layer = commons.get(wanted, wanted)
            if layer not in found:
                raise CompileError("NirBandAmbiguous" if arg == "nir" else "RedBandAmbiguous",
                                   f"ndvi: no {arg} band {wanted!r} among the data's bands "
                                   f"({', '.join(found)})", process)
            pick.append(found[layer].expr)
        nir, red = pick
        target = a.get("target_band")
        band = Band(product, self.band_name(str(target) if target else "ndvi"),
                    f"(({nir} - {red}) / ({nir} + {red}))", raw=False)
        if target:
            return replace(cube, bands=(*cube.bands, band))
        return replace(cube, bands=(band,), has_bands=False)

    def _reduce_dimension(self, process: str, a: dict[str, Any]) -> Cube:
        cube = self.cube(a.get("data"), process)
        dimension = a.get("dimension")
        reducer = a.get("reducer")
        if not isinstance(reducer, dict) or "process_graph" not in reducer:
            raise CompileError("ProcessParameterInvalid", f"{process}: reducer must be a child process graph", process)
        if dimension == "t":
            return self._temporal(cube, process, reducer, "span", a.get("context"))
        if dimension != "bands":
            raise CompileError("DimensionNotAvailable", f"{process}: no dimension {dimension!r} (x, y, t, bands)",
                               process)
        cube = self._per_date(cube, process)
        if len(cube.products) != 1:
            raise CompileError("ProcessUnsupported", f"{process}: band math over two products' bands (bagpipe "
                               "derives a layer from one product's layers; reduce them over t together instead)",
                               process)
        labels = tuple(b.name for b in cube.bands)
        commons = {v: k for k, v in common_names(cube.products[0]).items()}
        values = tuple(Expr(b.expr) for b in cube.bands)
        data = Bands(labels, values)
        aliases = Bands(tuple(commons.get(n, n) for n in labels), values)
        try:
            try:
                found = pixels.expression(reducer, {"data": data}, process, self.layer_names(cube))
            except pixels.Invalid:
                found = pixels.expression(reducer, {"data": aliases}, process, self.layer_names(cube))
        except (pixels.Unsupported, pixels.Invalid) as exc:
            raise _refusal(exc) from None
        name = self.band_name(_top(reducer) or "reduced")
        return replace(cube, bands=(Band(cube.products[0], name, found.text, raw=False),), has_bands=False)

    def layer_names(self, cube: Cube) -> list[str]:
        return [f"{p}.{layer}" for p in cube.products for layer in CATALOG[p].layer_names]

    def _apply(self, process: str, a: dict[str, Any]) -> Cube:
        cube = self.cube(a.get("data"), process)
        child = a.get("process")
        if not isinstance(child, dict) or "process_graph" not in child:
            raise CompileError("ProcessParameterInvalid", "apply: process must be a child process graph", process)
        if cube.udf:
            raise CompileError("ProcessUnsupported", "apply: after run_udf (compute it in the UDF)", process)
        try:
            if cube.by:  # after the reduction: an expression over each reduced input
                found = pixels.expression(child, {"x": Expr(cube.post or "x")}, process, ["x"])
                return replace(cube, post=found.text)
            bands = []
            for band in cube.bands:
                found = pixels.expression(child, {"x": Expr(band.expr)}, process, self.layer_names(cube))
                bands.append(Band(band.product, self.band_name(f"{band.name}_{_top(child) or 'apply'}"), found.text,
                                  raw=False))
        except (pixels.Unsupported, pixels.Invalid) as exc:
            raise _refusal(exc) from None
        return replace(cube, bands=tuple(bands))

    def _mask(self, process: str, a: dict[str, Any]) -> Cube:
        cube = self._per_date(self.cube(a.get("data"), process), process)
        mask = self._per_date(self.cube(a.get("mask"), process, "mask"), process)
        if mask.products != cube.products or len(mask.bands) not in (1, len(cube.bands)):
            raise CompileError("ProcessUnsupported", "mask: by a cube of the data's own product, of one band (or as "
                               "many as the data): bagpipe masks within a product's tile", process)
        try:
            replacement = pixels.number(a.get("replacement"), process, "replacement").text
        except pixels.Unsupported as exc:
            raise _refusal(exc) from None
        bands = []
        for i, band in enumerate(cube.bands):
            m = mask.bands[0 if len(mask.bands) == 1 else i].expr
            bands.append(Band(band.product, self.band_name(f"{band.name}_masked"),
                              # no value in the mask replaces nothing (openEO's mask: non-zero or true replaces)
                              f"where(not isnodata({m}) and ({m}) != 0, {replacement}, {band.expr})", raw=False))
        return replace(cube, bands=tuple(bands))

    # --- reductions in time ---------------------------------------------------------------------
    def _temporal(self, cube: Cube, process: str, reducer: dict[str, Any], by: str, context: Any = None) -> Cube:
        if cube.by:
            raise CompileError("ProcessUnsupported", f"{process}: a second temporal reduction (bagpipe reduces "
                               "a group of dates once)", process)
        nodes = reducer.get("process_graph") or {}
        if len(nodes) == 1 and next(iter(nodes.values())).get("process_id") == "run_udf":
            return replace(cube, by=by, reducer=UDF, udf=_udf(next(iter(nodes.values())), "reduce", context))
        if len(nodes) != 1:
            raise CompileError("ProcessUnsupported", f"{process}: the reducer is one of {', '.join(REDUCERS)} over "
                               "data (bagpipe's built-in reducers)", process)
        (node,) = nodes.values()
        name, arguments = str(node.get("process_id")), node.get("arguments") or {}
        if name not in REDUCERS or arguments.get("data") != {"from_parameter": "data"}:
            raise CompileError("ProcessUnsupported", f"{process}: the reducer {name!r} over time is not one of "
                               f"{', '.join(REDUCERS)} (bagpipe's built-in reducers) applied to data", name)
        if arguments.get("ignore_nodata") is False or arguments.get("condition") not in (None, False):
            raise CompileError("ProcessParameterUnsupported", f"{name}: over time bagpipe ignores no-data "
                               "(ignore_nodata true, no condition)", name)
        return replace(cube, by=by, reducer=REDUCERS[name])

    def _aggregate_temporal_period(self, process: str, a: dict[str, Any]) -> Cube:
        cube = self.cube(a.get("data"), process)
        period = a.get("period")
        if period not in PERIODS:
            raise CompileError("ProcessParameterUnsupported", f"aggregate_temporal_period: period {period!r}: bagpipe "
                               f"groups by {', '.join(PERIODS)}", process)
        if a.get("dimension") not in (None, "t"):
            raise CompileError("DimensionNotAvailable", f"aggregate_temporal_period: no temporal dimension "
                               f"{a.get('dimension')!r} (t)", process)
        reducer = a.get("reducer")
        if not isinstance(reducer, dict):
            raise CompileError("ProcessParameterInvalid", f"{process}: reducer must be a child process graph", process)
        return self._temporal(cube, process, reducer, PERIODS[str(period)], a.get("context"))

    def _apply_dimension(self, process: str, a: dict[str, Any]) -> Cube:
        """A UDF applied over t (its process a ``run_udf``): a reduction of the span whose
        outputs keep t, a tile per date (or label) the UDF returns."""
        cube = self.cube(a.get("data"), process)
        if a.get("dimension") != "t":
            raise CompileError("ProcessParameterUnsupported", f"apply_dimension: dimension {a.get('dimension')!r}: "
                               "bagpipe applies a UDF over t", process)
        if a.get("target_dimension") is not None:
            raise CompileError("ProcessParameterUnsupported", "apply_dimension: target_dimension: the UDF's values "
                               "stay on t", process)
        child = a.get("process")
        nodes = child.get("process_graph") if isinstance(child, dict) else None
        if not isinstance(nodes, dict) or len(nodes) != 1 or next(iter(nodes.values())).get("process_id") != "run_udf":
            raise CompileError("ProcessUnsupported", "apply_dimension: bagpipe applies a UDF over t (process: one "
                               "run_udf node)", process)
        if cube.by:
            raise CompileError("ProcessUnsupported", f"{process}: after a temporal reduction (bagpipe reduces a "
                               "group of dates once)", process)
        return replace(cube, by="span", reducer=UDF, udf=_udf(next(iter(nodes.values())), "apply", a.get("context")))

    def _merge_cubes(self, process: str, a: dict[str, Any]) -> Cube:
        one, two = self.cube(a.get("cube1"), process, "cube1"), self.cube(a.get("cube2"), process, "cube2")
        if a.get("overlap_resolver") is not None or {b.name for b in one.bands} & {b.name for b in two.bands}:
            raise CompileError("ProcessUnsupported", "merge_cubes: of cubes with different bands (no overlap "
                               "resolver)", process)
        if (one.bbox, one.polygon, one.masked, one.start, one.end, one.by, one.reducer, one.post, one.udf) != (
                two.bbox, two.polygon, two.masked, two.start, two.end, two.by, two.reducer, two.post, two.udf):
            raise CompileError("ProcessUnsupported", "merge_cubes: of cubes of the same extent, span and temporal "
                               "reduction (bagpipe computes both on one grid and one grouping)", process)
        return replace(one, bands=(*one.bands, *two.bands), has_bands=True)

    def _save_result(self, process: str, a: dict[str, Any]) -> Cube | Table:
        data = a.get("data")
        found = self.node(str(data["from_node"])) if isinstance(data, dict) and "from_node" in data else None
        saved: Cube | Table = found if isinstance(found, Table) else self.cube(data, process)
        given = str(a.get("format") or "")
        fitting: dict[str, str] = OUTPUTS if not isinstance(saved, Table) else SERIES if saved.sites else TABLES
        if FORMATS.get(given.lower()) not in fitting:
            what = "a raster cube" if not isinstance(saved, Table) else (
                "aggregate_spatial's values at points" if saved.sites else "aggregate_spatial's table over polygons")
            raise CompileError("FormatUnsuitable", f"save_result: format {given!r}: bagpipe writes {what} as "
                               f"{', '.join(fitting)} (GET /file_formats)", process)
        if a.get("options"):
            raise CompileError("ProcessParameterUnsupported", "save_result: no options are supported", process)
        if isinstance(saved, Cube) and saved.udf and FORMATS[given.lower()] != "GTiff":
            raise CompileError("FormatUnsuitable", f"save_result: format {given!r}: run_udf's results are GeoTIFFs, a "
                               "file per band, target tile and group of dates", process)
        self.format = FORMATS[given.lower()]
        return saved

    # --- statistics over polygons -------------------------------------------------------------------
    def _aggregate_spatial(self, process: str, a: dict[str, Any]) -> Table:
        """The zones' statistics of the cube's bands (the request's ``zones``, each pixel whose
        centre is in a zone counted whole, as openEO defines it): per date, or, after a
        temporal reduction, of its outputs per group (``zones.over`` reduction)."""
        cube = self.cube(a.get("data"), process)
        if cube.udf:
            raise CompileError("ProcessUnsupported", "aggregate_spatial: of run_udf's results (bagpipe's zones read "
                               "its built-in reductions' tiles)", process)
        if a.get("target_dimension") is not None:
            raise CompileError("ProcessParameterUnsupported", "aggregate_spatial: target_dimension (the counts of "
                               "pixels beside each value) is not supported; count is a reducer of its own", process)
        if a.get("context") is not None:
            raise CompileError("ProcessParameterUnsupported", "aggregate_spatial: no context is supported", process)
        extent = shape(json.loads(cube.polygon)) if cube.polygon else shapely.box(*cube.bbox)
        sites = parameters.sites(a.get("geometries"), process, extent)
        if sites:
            parameters.point_reducer(a.get("reducer"), process)
            if cube.by:
                raise CompileError("ProcessUnsupported", "aggregate_spatial: at points after a temporal reduction: "
                                   "bagpipe samples sites per date on each product's own grid (sample them, then "
                                   "reduce the table)", process)
            return Table(cube, "", (), (), sites=json.dumps(sites))
        zones = parameters.zones(a.get("geometries"), process)
        statistic, percentiles = parameters.spatial_reducer(a.get("reducer"), process)
        return Table(cube, json.dumps(zones), (statistic,) if statistic else (), tuple(percentiles))


def _udf(node: dict[str, Any], mode: str, context: Any) -> str:
    """A ``run_udf`` node as bagpipe runs it (its code, context and ``mode``, JSON text): its
    data the parent's (``data``), its runtime Python in the version ``GET /udf_runtimes``
    names, its code given inline and checked without running it (its syntax, an entry
    point); ``context`` the parent process's, which the UDF's may name (``from_parameter``)."""
    process = "run_udf"
    a = node.get("arguments") or {}
    if a.get("data") != {"from_parameter": "data"}:
        raise CompileError("ProcessParameterInvalid", "run_udf: data: the values the parent process gives "
                           '({"from_parameter": "data"})', process)
    runtime, version = a.get("runtime"), a.get("version")
    if not isinstance(runtime, str) or runtime.lower() != udf.RUNTIME.lower():
        raise CompileError("InvalidRuntime", f"run_udf: runtime {runtime!r}: bagpipe runs {udf.RUNTIME} UDFs "
                           "(GET /udf_runtimes)", process)
    if version is not None and version != udf.python_version():
        raise CompileError("InvalidVersion", f"run_udf: version {version!r}: bagpipe's {udf.RUNTIME} runtime is "
                           f"{udf.python_version()} (GET /udf_runtimes)", process)
    code = a.get("udf")
    if not isinstance(code, str) or not code.strip():
        raise CompileError("ProcessParameterInvalid", "run_udf: udf: the UDF's source code, as text", process)
    if re.match(r"^https?://", code.strip()):
        raise CompileError("ProcessParameterUnsupported", "run_udf: udf: a URL: bagpipe runs the code the graph "
                           "gives (fetch it and give its source)", process)
    if "\n" not in code and "\r" not in code:
        raise CompileError("FileNotFound", f"run_udf: udf: {code[:80]!r} is a path to a file of a workspace, and "
                           "bagpipe keeps none: give the UDF's source code", process)
    why = udf.problem(code)
    if why:
        raise CompileError("ProcessParameterInvalid", f"run_udf: udf: {why}", process)
    given = a.get("context", {})
    if isinstance(given, dict) and set(given) == {"from_parameter"}:
        if given["from_parameter"] != "context":
            raise CompileError("ProcessParameterInvalid", f"run_udf: context: no parameter "
                               f"{given['from_parameter']!r} (the parent's is context)", process)
        given = context if context is not None else {}
    return json.dumps({"code": code, "context": given, "mode": mode})


def _refusal(exc: pixels.Unsupported | pixels.Invalid) -> CompileError:
    code = "ProcessUnsupported" if isinstance(exc, pixels.Unsupported) else "ProcessGraphInvalid"
    return CompileError(code, exc.message, exc.process)


def _top(child: dict[str, Any]) -> str:
    """The process id of a child graph's result node (what its derived layer is named after)."""
    for node in (child.get("process_graph") or {}).values():
        if isinstance(node, dict) and node.get("result"):
            return str(node.get("process_id") or "")
    return ""


def _layer(product: str, wanted: str, process: str) -> str:
    layers = CATALOG[product].layer_names
    if wanted in layers:
        return wanted
    common = common_names(product)
    if wanted in common:
        return common[wanted]
    raise CompileError("ProcessParameterInvalid", f"{process}: {product} has no band {wanted!r} (its bands: "
                       f"{', '.join(layers)})", process)


def _restricted(cube: Cube, process: str, name: str, box: tuple[float, float, float, float] | None = None,
                polygon: Polygon | MultiPolygon | None = None) -> Cube:
    """The cube restricted to a box or to polygons: its box the overlap of its own and the
    new, its polygons (those it had, those given) cut to that box where they pass it."""
    west, south, east, north = cube.bbox
    if box is not None:
        west, south, east, north = max(west, box[0]), max(south, box[1]), min(east, box[2]), min(north, box[3])
    overlap = west < east and south < north
    clip: Polygon | MultiPolygon | None = polygon
    if cube.polygon:
        had = shape(json.loads(cube.polygon))
        clip = had if clip is None else parameters.polygonal(clip.intersection(had))
    if overlap and clip is not None:
        area = shapely.box(west, south, east, north)
        if not area.contains(clip):
            clip = parameters.polygonal(clip.intersection(area))
        overlap = clip is not None
    if not overlap:
        raise CompileError("ProcessParameterInvalid", f"{process}: {name}: it does not overlap the data's extent",
                           process)
    if clip is None:
        return replace(cube, bbox=(west, south, east, north))
    if cube.masked and polygon is None:  # a box over masked data: the box is the extent, the polygons mask it
        return replace(cube, bbox=(west, south, east, north), polygon=parameters.text(clip))
    return replace(cube, bbox=clip.bounds, polygon=parameters.text(clip))


def compile_graph(process: dict[str, Any], *, label: str = "") -> Compiled:
    """The request a process graph makes, and which of its products are the result;
    CompileError naming the process (and the request's own field, through RequestError) if
    bagpipe cannot run it."""
    flat = parse(process)
    walker = _Walker(flat)
    (result,) = [key for key, node in flat.items() if isinstance(node, dict) and node.get("result")]
    found = walker.node(result)
    table = found if isinstance(found, Table) else None
    cube = table.cube if table is not None else found
    if not isinstance(cube, Cube):
        raise CompileError("ProcessUnsupported", "the graph's result is not a data cube", "")
    derive: dict[str, dict[str, str]] = {}
    layers: dict[str, list[str]] = {}
    for band in cube.bands:
        if band.raw:
            layers.setdefault(band.product, []).append(band.name)
        else:
            derive.setdefault(band.product, {})[band.name] = band.expr
    body: dict[str, Any] = {
        "region": ({"bbox": list(cube.bbox)} if not cube.polygon or cube.masked else {}) | (
            {"geometry": json.loads(cube.polygon)} if cube.polygon else {}),
        "start": cube.start.isoformat(), "end": cube.end.isoformat(),
        "products": cube.products, "label": label[:200],
    }
    if table is not None and table.sites:  # sampled where they are, on each product's own grid: no region
        body = {"sites": {"points": json.loads(table.sites)}} | {k: v for k, v in body.items() if k != "region"}
        if walker.format not in TABLES:  # JSON, or no save_result
            body["output"] = {"format": "json"}
    named = {p: names for p, names in layers.items() if names}
    if named:
        body["layers"] = named
    if walker.format in CUBES:
        body["output"] = {"format": OUTPUTS[walker.format]}
    if derive:
        body["derive"] = derive
    reduction = ""
    if table is not None and not table.sites:  # the zones' statistics per date, or of the reduction's per group
        body["zones"] = {"features": json.loads(table.zones), "statistics": list(table.statistics),
                         "percentiles": list(table.percentiles), "weights": "centre"} | (
            {"over": "reduction"} if cube.by else {"inputs": [f"{b.product}.{b.name}" for b in cube.bands]})
    if cube.udf:
        body["reduce"] = {"by": cube.by, "inputs": [f"{b.product}.{b.name}" for b in cube.bands],
                          "program": {"name": udf.NAME}, "name": UDF}
        reduction = UDF
    elif cube.by:
        refs = [f"{b.product}.{b.name}" for b in cube.bands]
        if cube.post:
            if len(refs) != 1:
                raise CompileError("ProcessUnsupported", "apply after a temporal reduction of several bands (bagpipe "
                                   "writes one expression over one reduced band)", "apply")
            if cube.reducer not in AGGREGATES:
                raise CompileError("ProcessUnsupported", f"apply after a temporal reduction by "
                                   f"{_OPENEO.get(cube.reducer, cube.reducer)}: an expression over a reduced band "
                                   f"takes one reduced by {', '.join(_OPENEO.get(a, a) for a in AGGREGATES)}", "apply")
            body["reduce"] = {"by": cube.by, "inputs": {"x": refs[0]}, "expression": cube.post,
                              "aggregate": cube.reducer, "name": "result"}
            reduction = "result"
        else:
            body["reduce"] = {"by": cube.by, "inputs": refs, "reducer": cube.reducer}
            reduction = cube.reducer
    try:
        request = JobRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise CompileError("ProcessGraphInvalid", f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    result_layers = {} if cube.by or table is not None else {
        p: [b.name for b in cube.bands if b.product == p] for p in cube.products}
    # a table with no save_result is saved as CSV, points' as JSON (a raster cube's default is GeoTIFF)
    form = walker.format if table is None or walker.format in (SERIES if table.sites else TABLES) else (
        "JSON" if table.sites else "CSV")
    return Compiled(request, result_layers, reduction, form, cube.udf)

