"""A scientist's processing request: its schema, its checks, and the tasks it expands to."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import date
from datetime import date as Day  # where a field named ``date`` hides the type
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, EmailStr, Field, field_validator, model_validator
from pyproj import CRS
from pyproj.exceptions import CRSError

from pipeline.modis import TILE_STAGE
from pipeline.modis.granules import Granule, as_param
from pipeline.modis.grid import Tile
from pipeline.modis.products import CATALOG, period_count, periods
from pipeline.modis.targets import MAX_TILE_PIXELS, GridSpec, TargetTile
from pipeline.modis.targets import NATIVE as NATIVE_CRS
from pipeline.planning import RequestError, TaskPlan
from pipeline.reduction import REDUCE_STAGE, reducers
from pipeline.reduction.reducers import Program


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


class Region(BaseModel):
    """A lon/lat box ``[west, south, east, north]`` (west > east: it crosses ±180°) or a list
    of MODIS tiles, not both."""

    model_config = ConfigDict(extra="forbid")
    bbox: tuple[Lon, Lat, Lon, Lat] | None = None
    tiles: Annotated[list[str], Field(min_length=1, max_length=648)] | None = None

    @field_validator("tiles")
    @classmethod
    def _tiles_exist(cls, tiles: list[str] | None) -> list[str] | None:
        if tiles is not None:
            for name in tiles:
                Tile.parse(name)
        return tiles

    @model_validator(mode="after")
    def _one_kind(self) -> Region:
        if (self.bbox is None) == (self.tiles is None):
            raise ValueError("give either bbox [west, south, east, north] or tiles, not both" if self.bbox is not None
                             else "give bbox [west, south, east, north] or tiles")
        return self


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
    def _known_crs(cls, crs: str) -> str:
        try:
            CRS.from_user_input(crs)
        except CRSError:
            raise ValueError(f"unknown CRS {crs!r} (give e.g. EPSG:4326)") from None
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


class JobRequest(BaseModel):
    """What ``POST /api/jobs`` takes."""

    model_config = ConfigDict(extra="forbid")
    region: Region
    start: Annotated[date, Field(ge=FIRST_DAY, le=LAST_DAY)]
    end: Annotated[date, Field(ge=FIRST_DAY, le=LAST_DAY)]
    products: Annotated[list[Annotated[str, Field(max_length=32)]], Field(min_length=1, max_length=16)]
    # the layers to make of a product, by product (a product not named: its default layer)
    layers: Annotated[dict[Annotated[str, Field(max_length=32)],
                           Annotated[list[Annotated[str, Field(max_length=64)]], Field(min_length=1, max_length=16)]],
                      Field(max_length=16)] | None = None
    grid: Grid | None = None  # a bbox region defaults to Grid(); MODIS tiles use their own grid
    reducer: Reducer | None = None
    email: EmailStr | None = None
    label: Annotated[str, Field(max_length=200)] = ""

    @field_validator("label")
    @classmethod
    def _one_line(cls, label: str) -> str:
        if any(not c.isprintable() for c in label):
            raise ValueError("a label is one line of printable text (no line breaks, tabs or control characters)")
        return label


@dataclass(frozen=True)
class TaskSpec:
    """One task a request expands to: a stage run over one (target tile, date, product) —
    or, for a reduction, over the target tile's tile tasks ``deps`` (first seq, count)."""

    stage: str
    product: str
    target: TargetTile
    date: date
    reduction: int | None = None  # a tile task: the seq of the reduction waiting for it
    reducer: Reducer | None = None  # a reduction: the program asked for, its args, its failure rule
    program: Program | None = None  # a reduction: the program it resolved to
    deps: tuple[int, int] = (0, 0)
    last: Day | None = None  # a reduction: the first day of the span's last period
    layers: tuple[str, ...] = ()  # the product's layers to make (first: the reduction's inputs)
    # a tile task's granules, once the planner has searched the catalog (None: not searched)
    granules: tuple[Granule, ...] | None = field(default=None, compare=False)

    @property
    def tile(self) -> str:
        return self.target.name

    def params(self) -> dict[str, str]:
        """What the task row carries for its stage (strings, as a table row keeps them)."""
        grid = self.target.grid
        return {
            "product": self.product, "tile": self.tile, "date": self.date.isoformat(),
            "crs": grid.crs, "res": repr(grid.resolution),
            "bounds": ",".join(map(repr, self.target.bounds())),
            "sources": ",".join(t.name for t in self.target.sources()),
            "layers": ",".join(self.layers),
        } | self._links() | ({} if self.granules is None else {"granules": as_param(self.granules)})

    def work(self) -> float:
        """Its work in megapixels (the unit of the runtime history): the target tile's pixels
        times the layers it makes, times the dates a reduction reads (its inputs' size)."""
        grid = self.target.grid
        if grid.native:
            pixels = float(CATALOG[self.product].pixels) ** 2
        else:
            west, south, east, north = self.target.bounds()
            pixels = round(abs(east - west) / grid.resolution) * round(abs(north - south) / grid.resolution)
        dates = self.deps[1] if self.reducer is not None else 1
        return max(pixels * max(1, len(self.layers)) * max(dates, 1) / 1e6, 1e-6)

    def history(self) -> str:
        """What its runtime is kept per within its stage: the product (and reducer, if any:
        an uploaded bundle by its digest, as two users' bundles may share a name)."""
        if self.reducer is None:
            return self.product
        program = self.program or Program(self.reducer.name)
        return f"{self.product}~{program.digest[:16]}" if program.digest else f"{self.product}~{program.name}"

    def _links(self) -> dict[str, str]:
        if self.reducer is not None:
            program = self.program or Program(self.reducer.name)
            return program.params() | {"args": json.dumps(self.reducer.args),
                    "on_failure": self.reducer.on_dependency_failure, "deps": f"{self.deps[0]},{self.deps[1]}",
                    "last": self.last.isoformat() if self.last else ""}
        return {}


def plan_of(specs: list[TaskSpec]) -> list[TaskPlan]:
    """The lifecycle's plan of the tasks ``specs``: a tile task feeds the reduction waiting
    for it, and shares its partition."""
    return [TaskPlan(spec.stage, spec.params(), waits_for=spec.deps[1] if spec.reducer is not None else 0,
                     feeds=(spec.reduction,) if spec.reduction is not None else (),
                     group=seq if spec.reducer is not None else spec.reduction,
                     work=spec.work(), history=spec.history()) for seq, spec in enumerate(specs)]


def installed(name: str, reducers_path: str = "") -> Program:
    """An installed reducer by name; RequestError if the workers have none of that name."""
    known = reducers.catalog(reducers_path)
    if name not in known:
        raise RequestError(400, "reducer.name", f"unknown reducer {name!r} ({', '.join(sorted(known))})")
    return Program(name)


def target_count(request: JobRequest) -> int:
    """How many target tiles the request's region has (before dropping those with no MODIS
    source), counted without making them; a RequestError if the region cannot be cut."""
    region = request.region
    if region.tiles is not None:
        if request.grid is not None:
            raise RequestError(400, "grid", "a region given as MODIS tiles is processed on their own "
                               "grid; give region.bbox to choose a target grid")
        return len(set(region.tiles))
    west, south, east, north = region.bbox  # type: ignore[misc]  # a region has tiles or a bbox
    if west == east or south >= north:
        raise RequestError(400, "region.bbox", "the region is empty: need west != east (west > east crosses "
                           "±180°) and south < north")
    try:
        return (request.grid or Grid()).spec().count_for_lonlat_box(west, south, east, north)
    except ValueError as exc:
        raise RequestError(400, "grid.crs", str(exc)) from None


def targets_of(request: JobRequest) -> list[TargetTile]:
    """The request's target tiles (before dropping those with no MODIS source), once
    :func:`target_count` has checked the region."""
    region = request.region
    if region.tiles is not None:
        native = GridSpec(NATIVE_CRS, 0.0, 0.0)
        return [native.native_tile(t) for t in sorted({Tile.parse(t) for t in region.tiles})]
    return (request.grid or Grid()).spec().tiles_for_lonlat_box(*region.bbox)  # type: ignore[misc]  # tiles or bbox


def expand(request: JobRequest, max_tasks: int, tile_stage: str = TILE_STAGE,
           program: Program | None = None) -> list[TaskSpec]:
    """The tasks of a request, in release order — each target tile's dates together, so
    that its reduction (if any) can run early — then the reductions; or a RequestError.
    ``program`` is what the request's reducer resolved to (``pipeline.web.registry.resolve``
    checks the name first); without it the reducer is an installed one of that name."""
    unknown = [p for p in request.products if p not in CATALOG]
    if unknown:
        raise RequestError(
            400, "products", f"unknown product(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(CATALOG))}"
        )
    if len(set(request.products)) != len(request.products):
        raise RequestError(400, "products", "a product is named twice")
    if request.end < request.start:
        raise RequestError(400, "end", "the time span is empty: end is before start")
    layers = layers_of(request)
    # counted before anything is made: a world box of tiny tiles must not exhaust the memory
    places = target_count(request)
    groups = places * len(request.products) if request.reducer else 0
    count = places * sum(period_count(CATALOG[p], request.start, request.end) for p in request.products) + groups
    if count > max_tasks:
        raise RequestError(
            413, "region", f"the request makes {count} tasks, more than the limit of {max_tasks}",
            tasks=count, limit=max_tasks,
        )
    dates = {p: periods(CATALOG[p], request.start, request.end) for p in request.products}
    targets = [t for t in targets_of(request) if t.sources()]
    if not targets:
        raise RequestError(400, "region", "the region covers no MODIS tile")
    pairs = [(product, target) for product in request.products for target in targets if dates[product]]
    tiles = sum(len(dates[product]) for product, _ in pairs)
    specs: list[TaskSpec] = []
    reductions: list[TaskSpec] = []
    for product, target in pairs:
        first = len(specs)
        reduction = tiles + len(reductions) if request.reducer else None
        specs += [TaskSpec(tile_stage, product, target, day, reduction=reduction, layers=layers[product])
                  for day in dates[product]]
        if request.reducer:
            reductions.append(TaskSpec(REDUCE_STAGE, product, target, dates[product][0], reducer=request.reducer,
                                       program=program, deps=(first, len(dates[product])),
                                       last=dates[product][-1], layers=layers[product]))
    return specs + reductions


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
