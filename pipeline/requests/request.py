"""A scientist's processing request: its schema, its checks, and the tasks it expands to."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, EmailStr, Field, field_validator, model_validator
from pyproj import CRS
from pyproj.exceptions import ProjError

from pipeline.modis.grid import Tile
from pipeline.modis.products import CATALOG
from pipeline.modis.targets import MAX_TILE_PIXELS, GridSpec, TargetTile, crs_problem
from pipeline.modis.targets import NATIVE as NATIVE_CRS
from pipeline.planning import RequestError
from pipeline.reduction import reducers
from pipeline.reduction.reducers import Program
from pipeline.requests import reductions
from pipeline.science import expressions


def _number(value: Any) -> Any:
    """A number as JSON writes one: true and false are not taken for 1 and 0."""
    if isinstance(value, bool):
        raise ValueError("a number, not true or false")
    return value


Lon = Annotated[float, BeforeValidator(_number), Field(ge=-180, le=180, allow_inf_nan=False)]
Lat = Annotated[float, BeforeValidator(_number), Field(ge=-90, le=90, allow_inf_nan=False)]
Size = Annotated[float, BeforeValidator(_number), Field(gt=0, allow_inf_nan=False)]
# MODIS (Terra) data begins in 2000; the far bound keeps a typo from planning millennia.
FIRST_DAY, LAST_DAY = date(2000, 1, 1), date(2100, 12, 31)
ArgValue = Union[Annotated[str, Field(max_length=1000)], int, float, bool]


Digest = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]  # a kept vector document's SHA-256


class Kept(BaseModel):
    """A vector document kept in storage (``pipeline.requests.vectors``: its SHA-256), with
    what planning needs of it, which the server writes when it keeps it (what a caller gives
    of these is replaced): its lon/lat box (west > east across ±180°), how many items it
    holds, and the tiles it touches (target tiles as rows of column runs, or MODIS tiles
    with their count of sites)."""

    model_config = ConfigDict(extra="forbid")
    ref: Digest
    bbox: tuple[float, float, float, float] | None = None
    count: int | None = None
    touched: Annotated[str, Field(max_length=20_000)] | None = None  # target tiles: "row:c0..c1,c2..c3;row:…"
    tiles: Annotated[dict[str, int], Field(max_length=648)] | None = None  # MODIS tiles: sites in each


class Region(BaseModel):
    """A lon/lat box ``[west, south, east, north]`` (west > east: it crosses ±180°), a list
    of MODIS tiles, or a polygon: ``geometry``, a GeoJSON Polygon or MultiPolygon in lon/lat
    (across ±180°, cut there as GeoJSON has it), kept at submission as ``kept``. One of them;
    or a box with a polygon, a mask that keeps the box's extent: every target tile of the box,
    each clipped to the polygon (a polygon alone plans only the tiles it touches)."""

    model_config = ConfigDict(extra="forbid")
    bbox: tuple[Lon, Lat, Lon, Lat] | None = None
    tiles: Annotated[list[str], Field(min_length=1, max_length=648)] | None = None
    geometry: dict[str, Any] | None = None
    kept: Kept | None = None

    @field_validator("tiles")
    @classmethod
    def _tiles_exist(cls, tiles: list[str] | None) -> list[str] | None:
        if tiles is not None:
            for name in tiles:
                Tile.parse(name)
        return tiles

    @model_validator(mode="after")
    def _one_kind(self) -> Region:
        given = [k for k in ("bbox", "tiles", "geometry", "kept") if getattr(self, k) is not None]
        if len(given) != 1 and given not in (["bbox", "geometry"], ["bbox", "kept"]):
            raise ValueError(f"give one of bbox [west, south, east, north], tiles or geometry, not "
                             f"{' and '.join(given)}" if given
                             else "give bbox [west, south, east, north], tiles or geometry (a polygon)")
        return self

    @property
    def polygon(self) -> bool:
        return self.geometry is not None or self.kept is not None

    @property
    def masked(self) -> bool:
        """A box with a polygon: the box's tiles, each clipped to the polygon."""
        return self.bbox is not None and self.polygon


class Grid(BaseModel):
    """The output grid: square tiles of ``tile_size`` CRS units with pixels ``resolution``
    units wide. Defaults: 1° tiles at 0.005° (about 500 m) in EPSG:4326; 100 km tiles at
    500 m in a projected CRS."""

    model_config = ConfigDict(extra="forbid")
    crs: Annotated[str, Field(max_length=64)] = "EPSG:4326"
    tile_size: Size | None = None
    resolution: Size | None = None

    @field_validator("crs")
    @classmethod
    def _usable_crs(cls, crs: str) -> str:
        problem = crs_problem(crs)  # a 2-D CRS of the Earth that pyproj and GDAL both work in
        if problem:
            raise ValueError(problem)
        return crs

    def spec(self) -> GridSpec:
        geographic = CRS.from_user_input(self.crs).is_geographic
        tile_size = self.tile_size or (1.0 if geographic else 100_000.0)
        resolution = self.resolution or (0.005 if geographic else 500.0)
        return GridSpec(self.crs, tile_size, resolution)

    @model_validator(mode="after")
    def _tile_fits(self) -> Grid:
        pixels = self.spec().tile_size / self.spec().resolution
        if not 1 <= pixels <= MAX_TILE_PIXELS:
            raise ValueError(f"a tile would be {pixels:.0f} pixels wide; keep tile_size / resolution "
                             f"between 1 and {MAX_TILE_PIXELS}")
        return self


class Reducer(BaseModel):
    """The scientist's program run over each target tile's whole time span (per product)."""

    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Field(min_length=1, max_length=64)]
    args: Annotated[dict[Annotated[str, Field(max_length=64)], ArgValue], Field(max_length=32)] = {}
    # if a tile task of the span ends DEAD: "run" on the tiles that exist, or "fail"
    on_dependency_failure: Literal["run", "fail"] = "fail"


class Baseline(BaseModel):
    """The years of reference a reduction compares each group with (anomalies, z-scores,
    VCI, TCI): the same days of the year in each year from ``start`` to ``end``."""

    model_config = ConfigDict(extra="forbid")
    start: Annotated[date, Field(ge=FIRST_DAY, le=LAST_DAY)]
    end: Annotated[date, Field(ge=FIRST_DAY, le=LAST_DAY)]


Name = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,31}$")]
Ref = Annotated[str, Field(min_length=3, max_length=100)]  # PRODUCT.LAYER


class Reduce(BaseModel):
    """A reduction over the request's inputs, per target tile and group of dates: a
    built-in ``reducer``, an ``expression``, or a ``program`` (the scientist's own, in the
    sandbox); ``pipeline.requests.reductions`` says what each means."""

    model_config = ConfigDict(extra="forbid")
    by: Annotated[str, Field(max_length=32)] = "span"  # span, month, season, year, days:N, month-of-year, day-of-year
    # PRODUCT.LAYER, or names for them (an expression's); default: the layers the request makes
    inputs: Annotated[list[Ref], Field(min_length=1, max_length=16)] | Annotated[
        dict[Name, Ref], Field(min_length=1, max_length=16)] | None = None
    reducer: Annotated[str, Field(max_length=32)] | None = None
    percentile: Annotated[float, BeforeValidator(_number), Field(ge=0, le=100)] | None = None
    aggregate: Literal["mean", "median", "min", "max", "sum", "first", "last"] = "mean"
    expression: Annotated[str, Field(max_length=4096)] | None = None
    program: Reducer | None = None
    name: Name | None = None
    unit: Annotated[str, Field(max_length=32)] = ""  # an expression's output's unit
    baseline: Baseline | None = None
    # if a tile task of a group ends DEAD: "run" on the tiles that exist, or "fail"
    on_dependency_failure: Literal["run", "fail"] = "fail"

    @model_validator(mode="after")
    def _one_kind(self) -> Reduce:
        given = [k for k in ("reducer", "expression", "program") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give one of reducer (a built-in: max, mean, percentile…), expression or program"
                             + (f", not {' and '.join(given)}" if given else ""))
        return self


class Sites(BaseModel):
    """A point sample: for each site and date, the value of the pixel holding it on each
    product's own grid (``pipeline.modis.points``). ``points``: a JSON list of ``{id, lon,
    lat}``, a GeoJSON FeatureCollection of Points or CSV text (``id,lon,lat``); kept at
    submission as ``kept``. ``window``: also the mean of the usable pixels of a 3 × 3 or 5 × 5
    window around it."""

    model_config = ConfigDict(extra="forbid")
    points: list[Any] | dict[str, Any] | Annotated[str, Field(max_length=8_000_000)] | None = None
    kept: Kept | None = None
    window: Literal[1, 3, 5] = 1

    @model_validator(mode="after")
    def _one_kind(self) -> Sites:
        if (self.points is None) == (self.kept is None):
            raise ValueError("give points (a list, GeoJSON or CSV), or kept (a kept document's ref)")
        return self


Statistic = Literal["mean", "min", "max", "std", "count", "sum", "sd", "median"]
STATISTICS: tuple[Statistic, ...] = ("mean", "min", "max", "std", "count", "sum")  # the default


class Zones(BaseModel):
    """Zonal statistics: per zone (a polygon with an id) and date — or group of dates
    (``by``: a grouping of ``reduce``'s) — the statistics of each input's pixels on the
    target grid (``pipeline.reduction.zonal``), each pixel weighted (``weights``) by the share
    of its area inside the zone (``coverage``), or whole if its centre is in the zone and not
    at all otherwise (``centre``: openEO's ``aggregate_spatial``). ``std`` is the weighted
    population deviation, ``sd`` the sample deviation (Bessel's correction, as openEO's
    ``sd``), ``median`` the 50th percentile. ``over``: the statistics of the layers' pixels
    of each date (or of a group's dates pooled), or of the request's reduction's outputs
    (``reduction``: a raster per group and tile, so a zone's mean of each pixel's monthly
    mean; its groups are ``reduce.by``'s). ``features``: a GeoJSON FeatureCollection; kept
    at submission as ``kept``."""

    model_config = ConfigDict(extra="forbid")
    features: dict[str, Any] | None = None
    kept: Kept | None = None
    statistics: Annotated[list[Statistic], Field(max_length=8)] = list(STATISTICS)
    percentiles: Annotated[list[Annotated[float, BeforeValidator(_number), Field(ge=0, le=100)]],
                           Field(max_length=9)] = []
    by: Annotated[str, Field(max_length=32)] = "date"  # date, or span, month, season, year, days:N…
    inputs: Annotated[list[Ref], Field(min_length=1, max_length=16)] | None = None  # default: the layers made
    weights: Literal["coverage", "centre"] = "coverage"
    over: Literal["layers", "reduction"] = "layers"

    @model_validator(mode="after")
    def _one_kind(self) -> Zones:
        if (self.features is None) == (self.kept is None):
            raise ValueError("give features (a GeoJSON FeatureCollection of polygons), or kept (a kept document's ref)")
        if not self.statistics and not self.percentiles:
            raise ValueError("ask for statistics or percentiles, one at least")
        return self


class Output(BaseModel):
    """What a job writes beside its tiles' COGs: ``netcdf`` (one CF netCDF) or ``zarr`` (one
    Zarr store) per product and layer over the region and dates, and per reduction output
    over its groups (``pipeline.reduction.cubes``); for a request of sites, ``json``: its
    table also as openEO's time series JSON (``pipeline.reduction.gather``)."""

    model_config = ConfigDict(extra="forbid")
    format: Literal["cog", "netcdf", "zarr", "json"] = "cog"


class JobRequest(BaseModel):
    """What ``POST /api/jobs`` takes."""

    model_config = ConfigDict(extra="forbid")
    region: Region | None = None  # none for sites: they are sampled where they are
    sites: Sites | None = None
    zones: Zones | None = None
    output: Output | None = None
    start: Annotated[date, Field(ge=FIRST_DAY, le=LAST_DAY)]
    end: Annotated[date, Field(ge=FIRST_DAY, le=LAST_DAY)]
    products: Annotated[list[Annotated[str, Field(max_length=32)]], Field(min_length=1, max_length=16)]
    # the layers to make of a product, by product (a product not named: its default layer)
    layers: Annotated[dict[Annotated[str, Field(max_length=32)],
                           Annotated[list[Annotated[str, Field(max_length=64)]], Field(min_length=1, max_length=16)]],
                      Field(max_length=16)] | None = None
    grid: Grid | None = None  # a bbox region defaults to Grid(); MODIS tiles use their own grid
    # per-date derived layers, by product: name → an expression over that product's layers (PRODUCT.LAYER)
    derive: Annotated[dict[Annotated[str, Field(max_length=32)],
                           Annotated[dict[Name, Annotated[str, Field(max_length=4096)]], Field(min_length=1,
                                                                                                max_length=8)]],
                      Field(max_length=16)] | None = None
    reduce: Reduce | None = None
    reducer: Reducer | None = None  # a program over each product's span (``reduce`` with a program, per product)
    email: EmailStr | None = None
    label: Annotated[str, Field(max_length=200)] = ""

    @model_validator(mode="after")
    def _one_reduction(self) -> JobRequest:
        if self.reduce is not None and self.reducer is not None:
            raise ValueError("give reduce or reducer (a program over each product's span), not both")
        return self

    @field_validator("label")
    @classmethod
    def _one_line(cls, label: str) -> str:
        if any(not c.isprintable() for c in label):
            raise ValueError("a label is one line of printable text (no line breaks, tabs or control characters)")
        return label


def check_where(request: JobRequest) -> None:
    """A RequestError naming the field if the request's place is not one thing: a region (a
    box, tiles or a polygon, zones optional within it), zones alone, or sites alone."""
    if request.sites is not None:
        if request.region is not None:
            raise RequestError(422, "region", "sites are sampled where they are, on each product's own grid: "
                               "give no region")
        for name in ("zones", "reduce", "reducer", "grid"):
            if getattr(request, name) is not None:
                raise RequestError(422, name, f"a request of sites takes products, layers, derive and a span, "
                                   f"not {name}")
        if request.output is not None and request.output.format not in ("cog", "json"):
            raise RequestError(422, "output.format", "a request of sites makes a table, not a cube (json: the table "
                               "also as openEO's time series)")
    elif request.region is None and request.zones is None:
        raise RequestError(422, "region", "give a region (bbox, tiles or geometry), sites or zones")
    elif request.output is not None and request.output.format == "json":
        raise RequestError(422, "output.format", "json is a request of sites' time series: a region's results are "
                           "cog, netcdf or zarr")
    if request.zones is not None and request.region is not None and request.region.tiles is not None:
        raise RequestError(422, "zones", "zonal statistics are made on a target grid: give region.bbox or "
                           "region.geometry, or no region (the zones' own box)")


def program_name(request: JobRequest) -> tuple[str, str] | None:
    """The name of the program a request runs, and its field (the old ``reducer`` or
    ``reduce.program``); None if it runs none."""
    if request.reducer is not None:
        return request.reducer.name, "reducer.name"
    if request.reduce is not None and request.reduce.program is not None:
        return request.reduce.program.name, "reduce.program.name"
    return None


def installed(name: str, reducers_path: str = "", field: str = "reducer.name") -> Program:
    """An installed reducer by name; RequestError naming ``field`` if the workers have none
    of that name."""
    known = reducers.catalog(reducers_path)
    if name not in known:
        raise RequestError(400, field, f"unknown reducer {name!r} ({', '.join(sorted(known))})")
    return Program(name, accepts=known[name].accepts)


def _placed(request: JobRequest) -> tuple[tuple[float, float, float, float] | None, list[Kept]]:
    """The lon/lat box a request's target tiles are cut from (None: it gives MODIS tiles),
    and the kept polygons that keep only the tiles they touch (a region's, unless it masks a
    box, and the zones')."""
    region, zones = request.region, request.zones
    polygons = [k for k in (region.kept if region else None, zones.kept if zones else None) if k is not None]
    for kept in polygons:
        if kept.bbox is None or kept.touched is None:
            raise RequestError(400, "region", "a polygon not kept: submit it through the API, which keeps it")
    if region is not None and region.masked:
        polygons = [k for k in polygons if k is not region.kept]
    if region is not None and region.bbox is not None:
        return region.bbox, polygons
    if region is not None and region.tiles is not None:
        return None, polygons
    if polygons:
        return polygons[0].bbox, polygons
    raise RequestError(422, "region", "give a region (bbox, tiles or geometry), sites or zones")


def target_count(request: JobRequest) -> int:
    """How many target tiles the request's region has (before dropping those with no MODIS
    source), counted without making them; a RequestError if the region cannot be cut."""
    region = request.region
    if region is not None and region.tiles is not None:
        if request.grid is not None:
            raise RequestError(400, "grid", "a region given as MODIS tiles is processed on their own "
                               "grid; give region.bbox to choose a target grid")
        return len(set(region.tiles))
    bbox, polygons = _placed(request)
    assert bbox is not None
    if polygons:
        return min(len(vectors_touched(k)) for k in polygons)
    west, south, east, north = bbox
    if west == east or south >= north:
        raise RequestError(400, "region.bbox", "the region is empty: need west != east (west > east crosses "
                           "±180°) and south < north")
    try:
        return (request.grid or Grid()).spec().count_for_lonlat_box(west, south, east, north)
    except (ValueError, ProjError) as exc:
        raise RequestError(400, "grid.crs", str(exc)) from None


def vectors_touched(kept: Kept) -> set[tuple[int, int]]:
    """The (col, row) of the target tiles a kept polygon touches (its summary's runs)."""
    found = set()
    for part in filter(None, (kept.touched or "").split(";")):
        row, runs = part.split(":")
        for run in runs.split(","):
            first, last = run.split("..")
            found |= {(col, int(row)) for col in range(int(first), int(last) + 1)}
    return found


def targets_of(request: JobRequest) -> list[TargetTile]:
    """The request's target tiles (before dropping those with no MODIS source), once
    :func:`target_count` has checked the region: those of its box, or its MODIS tiles, that
    its polygons (a region's, the zones') touch."""
    region = request.region
    if region is not None and region.tiles is not None:
        native = GridSpec(NATIVE_CRS, 0.0, 0.0)
        return [native.native_tile(t) for t in sorted({Tile.parse(t) for t in region.tiles})]
    bbox, polygons = _placed(request)
    assert bbox is not None
    found = (request.grid or Grid()).spec().tiles_for_lonlat_box(*bbox)
    for kept in polygons:
        touched = vectors_touched(kept)
        found = [t for t in found if (t.col, t.row) in touched]
    return found


def clip_of(request: JobRequest) -> str:
    """The digest of the polygon every product of the request is clipped to ("" for none)."""
    region = request.region
    return region.kept.ref if region is not None and region.kept is not None else ""


def layers_of(request: JobRequest) -> dict[str, tuple[str, ...]]:
    """The layers to make of each product: those ``layers`` names, else its default layer;
    or a RequestError naming the field."""
    named = request.layers or {}
    for product in named:
        if product not in request.products:
            raise RequestError(400, "layers", f"layers are named for {product!r}, which is not among the products")
    found = {}
    for product in request.products:
        chosen = named.get(product) or [CATALOG[product].default.name]
        known = CATALOG[product].layer_names
        unknown = [name for name in chosen if name not in known]
        if unknown:
            raise RequestError(400, f"layers.{product}", f"{product} has no layer {', '.join(map(repr, unknown))}; "
                               f"its layers: {', '.join(known)}")
        if len(set(chosen)) != len(chosen):
            raise RequestError(400, f"layers.{product}", "a layer is named twice")
        found[product] = tuple(chosen)
    return found


def derived_of(request: JobRequest) -> dict[str, dict[str, str]]:
    """The derived layers of each product (name → expression over its layers, as
    ``PRODUCT.LAYER``), checked: each names a product of the request, is a new layer name,
    and reads that product's layers only; a RequestError naming the field."""
    found: dict[str, dict[str, str]] = {}
    for product, made in (request.derive or {}).items():
        where = f"derive.{product}"
        if product not in request.products:
            raise RequestError(400, "derive", f"layers are derived for {product!r}, which is not among the products")
        known = CATALOG[product].layer_names
        for name, text in made.items():
            if name in known:
                raise RequestError(400, f"{where}.{name}", f"{product} has a layer {name!r} already: name it otherwise")
            try:
                parsed = expressions.parse(text, [f"{product}.{layer}" for layer in known])
            except expressions.ExpressionError as exc:
                raise RequestError(400, f"{where}.{name}", f"{exc} (a derived layer reads its product's layers, "
                                   f"as {product}.LAYER)") from None
            if not parsed.names:
                raise RequestError(400, f"{where}.{name}", "the expression reads no layer")
        found[product] = dict(made)
    return found


def reductions_of(request: JobRequest, program: Program | None = None) -> list[reductions.Reduction]:
    """The request's reductions, checked (``reductions``); ``program`` what its program
    resolved to (else an installed one of its name); a RequestError naming the field."""
    derived = derived_of(request)
    layers = layers_of(request)
    known = {f"{p}.{layer}": (p, layer) for p in request.products
             for layer in [*CATALOG[p].layer_names, *derived.get(p, {})]}
    made = [f"{p}.{layer}" for p in request.products for layer in [*layers[p], *derived.get(p, {})]]
    if request.reducer is not None:  # the old form: a program over each product's whole span
        legacy = request.reducer
        program = program or installed(legacy.name)
        _fits(program, [f"{p}.{layers[p][0]}" for p in request.products], "reducer.name")  # its "inputs" each
        return [reductions.Reduction(
            reductions.parse_grouping_or("span", "reducer"), tuple(reductions.Input(f"{p}.{layer}", p, layer)
                                                                   for layer in layers[p]),
            "program", legacy.name, program=program, args=dict(legacy.args),
            on_failure=legacy.on_dependency_failure, legacy=True) for p in request.products]
    asked = request.reduce
    if asked is None:
        return []
    by = reductions.parse_grouping_or(asked.by, "reduce.by")
    baseline = None
    if asked.baseline is not None:
        baseline = reductions.span_of(asked.baseline.start, asked.baseline.end, "reduce.baseline")
    if asked.expression is not None:
        default = [name for name in reductions.names_in(asked.expression) if name in known]
        inputs = reductions.parse_inputs(asked.inputs, known, default, "reduce.inputs")
        reductions.check_expression(asked.expression, inputs, baseline is not None, "reduce.expression")
        return [reductions.Reduction(by, inputs, "expression", asked.name or "expression",
                                     aggregate=reductions.builtin(asked.aggregate, None, "reduce.aggregate"),
                                     expression=asked.expression, baseline=baseline, unit=asked.unit,
                                     on_failure=asked.on_dependency_failure)]
    inputs = reductions.parse_inputs(asked.inputs, known, made, "reduce.inputs")
    if asked.program is not None:
        program = program or installed(asked.program.name, field="reduce.program.name")
        _fits(program, [i.ref for i in inputs], "reduce.program.name")
        return [reductions.Reduction(by, inputs, "program", asked.name or asked.program.name,
                                     program=program, args=dict(asked.program.args),
                                     aggregate=reductions.builtin(asked.aggregate, None, "reduce.aggregate"),
                                     baseline=baseline, on_failure=asked.on_dependency_failure)]
    assert asked.reducer is not None
    reducer = reductions.builtin(asked.reducer, asked.percentile, "reduce.reducer")
    if reducer.needs_baseline and baseline is None:
        raise RequestError(400, "reduce.baseline", f"{reducer} compares each group with a baseline: give "
                           "reduce.baseline {start, end}")
    for one in inputs:
        try:
            reducer.output_encoding(reductions.encoding_for(one.product, one.layer, {
                (p, name) for p, made in derived.items() for name in made}))
        except ValueError as exc:
            raise RequestError(400, "reduce.reducer", f"{one.ref}: {exc}") from None
    return [reductions.Reduction(by, inputs, "builtin", asked.name or str(reducer).split("(")[0], reducer=reducer,
                                 aggregate=reductions.builtin(asked.aggregate, None, "reduce.aggregate"),
                                 baseline=baseline, on_failure=asked.on_dependency_failure)]


def _fits(program: Program, refs: list[str], where: str) -> None:
    """A RequestError naming ``where`` if the program's manifest does not take one of the
    inputs ``refs``: a program run on what it does not understand "succeeds" with nonsense."""
    refused = program.refused(refs)
    if refused:
        raise RequestError(400, where, f"{program.label} takes {', '.join(program.accepts)} (its reducer.json "
                           f"accepts), not {', '.join(refused)}")


def layers_needed(request: JobRequest, planned: list[reductions.Reduction]) -> dict[str, tuple[str, ...]]:
    """The layers each product's tile tasks make: those the request names (else the
    product's default), then those its derived layers and reductions read."""
    layers = layers_of(request)
    derived = derived_of(request)
    found = {p: list(layers[p]) for p in request.products}
    for product, made in derived.items():
        for text in made.values():
            for name in expressions.parse(text).names:
                layer = name.removeprefix(f"{product}.")
                if layer not in found[product]:
                    found[product].append(layer)
    for reduction in planned:
        for one in reduction.inputs:
            if one.layer not in derived.get(one.product, {}) and one.layer not in found[one.product]:
                found[one.product].append(one.layer)
    return {p: tuple(names) for p, names in found.items()}
