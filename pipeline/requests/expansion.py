"""What a request becomes: its tile tasks, the climatologies of its baseline, its reductions.

- A **tile task** per (batch of target tiles, date, product) makes, for each target tile of
  its batch (``pipeline.modis.batches``), the product's layers the request names (and those
  its reductions and derived layers read) on the target grid, and its derived layers
  (per-date expressions): one output per target tile and layer, as a task per target tile
  would make them, in a fraction of the tasks. A tile stage other than ``modis`` (the
  tests' stand-ins) warps one target tile a task.
- A **climatology** task per (target tile, input, baseline group) reduces each baseline
  year's days of the group and keeps the years' mean, standard deviation, minimum and
  maximum (``pipeline.science.climatology``): content-addressed by what it is made of, so a
  later job over the same tiles and years finds it made.
- A **reduction** task per (target tile, group) waits for the tile tasks of its inputs whose
  dates fall in the group (a composite period belongs to the group holding its first day)
  and for its inputs' climatologies, then runs its built-in, its expression or its program;
  a **zonal** task per (target tile, group) likewise makes the zones' partial statistics
  there (``pipeline.reduction.zonal``).
- A **point** task per (MODIS tile holding sites, date, product) samples its sites on the
  granule's own grid (``pipeline.modis.points``).
- A **gather** per table or cube (``planning.TaskPlan.after_all``), after every other task:
  the sites' table, the zones' table joined across tiles, a netCDF or Zarr cube per product
  and layer and per reduction output.

The tasks are listed in release order: every tile task first (the window releases them),
each batch's baseline dates, then its span's dates group by group, so that its first
reductions can run early; then the climatologies; then the reductions; the gathers last. A
task and those it waits for share a partition (the batch's: a tile task feeds the
reductions and climatologies of each target tile of its batch), so that each end counts
itself off in its own transaction; a batch is kept small enough that a tile task feeds at
most ``batches.MAX_FEEDS`` of them, within a transaction's 100 operations. A gather, which
waits for tasks of every partition, is released by the lifecycle once all the others have
ended.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import date
from datetime import date as Day  # where a field named ``date`` hides the type

from pipeline import planning
from pipeline.modis import POINT_STAGE, TILE_STAGE, batches
from pipeline.modis.granules import Granule, as_param
from pipeline.modis.grid import Tile
from pipeline.modis.products import CATALOG, period_count, periods
from pipeline.modis.targets import NATIVE, GridSpec, TargetTile, lonlat_bounds, with_sources
from pipeline.planning import RequestError, TaskPlan
from pipeline.reduction import (
    AGGREGATE_STAGE,
    CLIMATOLOGY_STAGE,
    CUBE_GATHER,
    REDUCE_STAGE,
    SITES_GATHER,
    ZONAL_STAGE,
    ZONES_GATHER,
)
from pipeline.reduction.reducers import Program
from pipeline.requests import reductions as checks
from pipeline.requests.reductions import Input, Reduction, encoding_for
from pipeline.requests.request import (
    JobRequest,
    check_where,
    clip_of,
    derived_of,
    layers_needed,
    layers_of,
    reductions_of,
    target_count,
    targets_of,
)
from pipeline.science.groups import Group, Period, Span, assign, baseline_of, members

Window = tuple[date, date]


@dataclass(frozen=True)
class TaskSpec:
    """One task a request expands to: a tile task (a stage over a batch of target tiles, a
    date and a product), a climatology or a reduction (of one target tile, over the tasks
    ``deps``, ranges of sequence numbers: (first, count) each)."""

    stage: str
    product: str
    target: TargetTile  # a tile task's: its batch's first
    date: Day
    layers: tuple[str, ...] = ()  # a tile task's layers to make (first: a legacy reduction's input)
    derived: tuple[tuple[str, str], ...] = ()  # a tile task's derived layers: (name, expression)
    derived_layers: frozenset[tuple[str, str]] = frozenset()  # a waiting task's: (product, name) of each
    feeds: tuple[int, ...] = ()  # the tasks that wait for this one
    deps: tuple[tuple[int, int], ...] = ()  # a waiting task's dependencies: (first seq, count) ranges
    reduction: Reduction | None = None  # a climatology's or a reduction's
    group: Group | None = None  # a reduction's group; a climatology's baseline group
    intermediate: bool = False  # a tile task only a climatology reads: no product of the job
    partition: int | None = None  # its partition group (the target tile's index)
    # a tile task's granules, once the planner has searched the catalog (None: not searched)
    granules: tuple[Granule, ...] | None = field(default=None, compare=False)
    # a climatology's tile tasks' granules, by date (the content address of what it makes)
    sources: tuple[tuple[str, tuple[str, ...]], ...] = field(default=(), compare=False)
    clip: str = ""  # a tile task's: the digest of the polygon its pixels are clipped to
    extra: tuple[tuple[str, str], ...] = ()  # further parameters of its stage (a point task's sites, a zonal's zones)
    sites: int = 0  # a point task's count of sites
    batch: tuple[TargetTile, ...] = ()  # a tile task's target tiles, if more than its target

    @property
    def tile(self) -> str:
        """Its target tile (a tile task's: its batch's, comma-separated)."""
        return ",".join(t.name for t in self.targets)

    @property
    def targets(self) -> tuple[TargetTile, ...]:
        return self.batch or (self.target,)

    @property
    def waits(self) -> int:
        return sum(count for _, count in self.deps)

    def params(self) -> dict[str, str]:
        """What the task row carries for its stage (strings, as a table row keeps them)."""
        grid = self.target.grid
        found = {  # a batch's places: its tiles by ",", their bounds, sources and reads by ";" (``planning.places``)
            "product": self.product, "tile": self.tile, "date": self.date.isoformat(),
            "crs": grid.crs, "res": repr(grid.resolution),
            "bounds": planning.PLACES.join(",".join(map(repr, t.bounds())) for t in self.targets),
            "sources": planning.PLACES.join(",".join(s.name for s in t.sources()) for t in self.targets),
            "layers": ",".join(self.layers),
        }
        if self.batch:
            found[planning.READS] = planning.PLACES.join(",".join(t.name for t in tiles)
                                                         for tiles in self.place_reads())
        if self.derived:
            found["derived"] = json.dumps(dict(self.derived))
        if self.intermediate:
            found["intermediate"] = "1"
        if self.clip:
            found["clip"] = self.clip
        if self.stage == ZONAL_STAGE:  # where its zones are looked for
            found["lonlat"] = ",".join(map(repr, lonlat_bounds(grid.crs, found["bounds"])))
        found |= dict(self.extra)
        if self.granules is not None:
            found["granules"] = as_param(self.granules)
        if self.deps:
            found["deps"] = ";".join(f"{first},{count}" for first, count in self.deps)
        reduction = self.reduction
        if reduction is None:
            return found
        if self.stage == CLIMATOLOGY_STAGE:
            (one,) = reduction.inputs
            return found | {
                "input": json.dumps([one.alias, one.product, one.layer]),
                "encoding": json.dumps(encoding_json(one, self.derived_layers)),
                "aggregate": str(reduction.aggregate), "windows": windows_json(self.group),
                "key": self.climatology_key(),
            }
        group = self.group
        assert group is not None
        found |= {"group": group.key, "start": group.start.isoformat(), "end": group.end.isoformat(),
                  "reduce": json.dumps(reduction.describe()), "on_failure": reduction.on_failure,
                  "encodings": json.dumps({i.alias: encoding_json(i, self.derived_layers) for i in reduction.inputs})}
        if reduction.kind == "program":
            program = reduction.program or Program("")
            found |= program.params() | {"args": json.dumps(reduction.args)}
            if reduction.legacy:  # as the old reduction's: its product's span, from the first day of its first period
                found["last"] = self.last_period().isoformat()
        return found

    def place_reads(self) -> list[list[Tile]]:
        """Per target tile of its batch, the MODIS tiles whose granules its warp reads: those
        within its reach (``TargetTile.reads``) the catalog has, if it has one of those the
        target covers (none otherwise: that target has no data, as a task of it alone)."""
        if self.granules is None:
            return [t.reads() for t in self.targets]
        have = {g.tile for g in self.granules}
        return [[r for r in t.reads() if r.name in have] if any(s.name in have for s in t.sources()) else []
                for t in self.targets]

    def last_period(self) -> Day:
        """A legacy reduction's last period's first day (its span's, as it was named)."""
        assert self.group is not None
        return max(periods(CATALOG[self.product], self.group.start, self.group.end), default=self.group.start)

    def climatology_key(self) -> str:
        """What a climatology is made of, as a digest: its kind's version, its target tile,
        input and aggregate, its baseline group's days, and each baseline date's granules
        (their ids carry their production time: the same ids, the same pixels)."""
        assert self.reduction is not None
        blob = json.dumps([CLIMATOLOGY_STAGE, self.target.grid.crs, repr(self.target.grid.resolution),
                           list(self.target.bounds()), self.reduction.inputs[0].ref, str(self.reduction.aggregate),
                           windows_json(self.group), list(self.sources)])
        return hashlib.sha256(blob.encode()).hexdigest()

    def work(self) -> float:
        """Its work in megapixels (the unit of the runtime history): the target tile's pixels
        times the layers it makes, times the dates a waiting task reads (its inputs' size)."""
        if self.stage == POINT_STAGE:  # its sites' windows, and a granule's file read for each layer
            return max(self.sites * len(self.layers) / 1e3, 1e-6)
        pixels = float(sum(batches.pixels_of(t, CATALOG[self.product].pixels) for t in self.targets))
        count = max(1, len(self.layers) + len(self.derived)) if self.reduction is None else max(1, self.waits)
        return max(pixels * count / 1e6, 1e-6)

    def history(self) -> str:
        """What its runtime is kept per within its stage: the product for a tile task; for a
        reduction its reducer (a program by name, an uploaded bundle by its digest, as two
        users' bundles may share a name), its expression's inputs, or a climatology's."""
        reduction = self.reduction
        if reduction is None:
            return self.product
        if reduction.kind == "program":
            program = reduction.program or Program("")
            return f"{self.product}~{program.digest[:16]}" if program.digest else f"{self.product}~{program.name}"
        if reduction.kind == "builtin":
            return f"{self.product}~{reduction.reducer}"
        if reduction.kind == "zonal":
            return f"{self.product}~zonal"
        return f"{self.product}~{reduction.kind}~{reduction.aggregate}"


@dataclass(frozen=True)
class GatherSpec:
    """A gather: one task after every other of the job (``planning.TaskPlan.after_all``) that
    joins what the tasks ``over`` made ((first seq, count) ranges) into one table or cube."""

    stage: str  # what it makes: sites, zones, cube (also its runtime history's key)
    over: tuple[tuple[int, int], ...]
    extra: tuple[tuple[str, str], ...] = ()
    work: float = 1.0

    def params(self) -> dict[str, str]:
        return {"over": ";".join(f"{first},{count}" for first, count in self.over)} | dict(
            self.extra)


Spec = TaskSpec | GatherSpec


def encoding_json(one: Input, derived: frozenset[tuple[str, str]]) -> dict[str, object]:
    encoding = encoding_for(one.product, one.layer, derived)
    return {"dtype": encoding.dtype, "nodata": encoding.nodata, "scale": encoding.scale, "offset": encoding.offset,
            "unit": encoding.unit, "valid": list(encoding.valid) if encoding.valid else None,
            "categorical": encoding.categorical}


def windows_json(group: Group | None) -> str:
    return json.dumps([[first.isoformat(), last.isoformat()] for first, last in group.windows] if group else [])


def _ranges(seqs: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Sequence numbers as (first, count) runs."""
    found: list[list[int]] = []
    for seq in sorted(set(seqs)):
        if found and found[-1][0] + found[-1][1] == seq:
            found[-1][1] += 1
        else:
            found.append([seq, 1])
    return tuple((first, count) for first, count in found)


def count_tasks(request: JobRequest, reductions: list[Reduction]) -> int:
    """How many tasks the request makes at most (tile tasks of the span and of its
    baselines, and a reduction per target tile and group of dates; a point task per MODIS
    tile of its sites and date; its gathers), counted without making them: what the task
    limit is checked against before anything is made."""
    if request.sites is not None:
        kept = request.sites.kept
        tiles = len(kept.tiles or {}) if kept else 0
        return tiles * sum(period_count(CATALOG[p], request.start, request.end) for p in request.products) + 1
    gathers = (1 if request.zones is not None else 0) + (
        sum(len(v) for v in layers_of(request).values()) + len(reductions)
        if request.output is not None and request.output.format != "cog" else 0)
    places = target_count(request)
    dates = sum(period_count(CATALOG[p], request.start, request.end) for p in request.products)
    extra = 0
    for reduction in reductions:
        span_days = (request.end - request.start).days + 1
        groups = 1 if str(reduction.by) == "span" else min(span_days, 366 * (request.end.year - request.start.year + 1))
        extra += groups
        if reduction.baseline is not None:
            products = {i.product for i in reduction.inputs}
            extra += sum(period_count(CATALOG[p], reduction.baseline.start, reduction.baseline.end) for p in products)
            extra += groups * len(reduction.inputs)
    return places * (dates + extra) + gathers


def expand(request: JobRequest, max_tasks: int, tile_stage: str = TILE_STAGE,
           program: Program | None = None, batch: int = 1) -> list[Spec]:
    """The tasks of a request, in release order (see the module's text); or a RequestError.
    ``program`` is what the request's program resolved to (``pipeline.web.registry.resolve``
    checks the name first); without it the program is an installed one of that name. ``batch``:
    the most target tiles a tile task warps (``pipeline.modis.batches``; 1: a task each)."""
    unknown = [p for p in request.products if p not in CATALOG]
    if unknown:
        raise RequestError(400, "products", f"unknown product(s) {', '.join(map(repr, unknown))}; "
                           f"known: {', '.join(sorted(CATALOG))}")
    if len(set(request.products)) != len(request.products):
        raise RequestError(400, "products", "a product is named twice")
    if request.end < request.start:
        raise RequestError(400, "end", "the time span is empty: end is before start")
    check_where(request)
    derived = derived_of(request)
    reductions = reductions_of(request, program)
    zonal = zonal_of(request, derived, reductions)
    # counted before anything is made: a world box of tiny tiles must not exhaust the memory
    count = count_tasks(request, reductions + ([zonal] if zonal else []))
    if count > max_tasks:
        raise RequestError(413, "sites" if request.sites else "region", f"the request makes {count} tasks, more "
                           f"than the limit of {max_tasks}", tasks=count, limit=max_tasks)
    if request.sites is not None:
        return _sites(request, derived)
    targets = [t for t in with_sources(targets_of(request)) if t.sources()]
    if not targets:
        raise RequestError(400, "region", "the region covers no MODIS tile")
    needed = layers_needed(request, reductions + ([zonal] if zonal else []))
    native = max(CATALOG[p].pixels for p in request.products)
    most = max(1, batch)
    while True:
        plan = _Plan(request, tile_stage, needed, derived)
        for index, targets_of_one in enumerate(batches.batches(targets, native, most)):
            plan.batch(index, targets_of_one, reductions, zonal)
        listed = plan.listed()
        if most == 1 or max((len(s.feeds) for s in listed if len(s.targets) > 1), default=0) <= batches.MAX_FEEDS:
            return listed + _gathers(request, listed, derived)
        most //= 2  # its tile tasks would feed more than a transaction can count off: smaller batches


def zonal_of(request: JobRequest, derived: dict[str, dict[str, str]],
             reductions: list[Reduction]) -> Reduction | None:
    """The request's zonal statistics as a reduction of kind ``zonal`` (its grouping: the
    span when they are per date; over a reduction, that reduction's, its inputs the
    reduction's outputs), checked; None if it asks for none."""
    zones = request.zones
    if zones is None:
        return None
    if zones.over == "reduction":
        reduced = reductions[0] if request.reduce is not None and reductions else None
        if reduced is None or reduced.kind not in ("builtin", "expression"):
            raise RequestError(400, "zones.over", "zones over a reduction read a built-in's or an expression's "
                               "outputs: give reduce with a reducer or an expression (a program's files are its own)")
        for name, given in (("by", zones.by != "date"), ("inputs", zones.inputs is not None)):
            if given:
                raise RequestError(400, f"zones.{name}", "zones over a reduction take its groups (reduce.by) and "
                                   "its outputs: give no zones.by or zones.inputs")
        return Reduction(reduced.by, reduced.outputs(), "zonal", "zones", over=reduced.name)
    layers = layers_of(request)
    known = {f"{p}.{layer}": (p, layer) for p in request.products
             for layer in [*CATALOG[p].layer_names, *derived.get(p, {})]}
    made = [f"{p}.{layer}" for p in request.products for layer in [*layers[p], *derived.get(p, {})]]
    inputs = checks.parse_inputs(zones.inputs, known, made, "zones.inputs")
    for one in inputs:
        if encoding_for(one.product, one.layer, {(p, n) for p, made in derived.items() for n in made}).categorical:
            raise RequestError(400, "zones.inputs", f"{one.ref} holds classes or bit fields: a mean of them means "
                               "nothing")
    by = checks.parse_grouping_or("span" if zones.by == "date" else zones.by, "zones.by")
    return Reduction(by, inputs, "zonal", "zones")


def _sites(request: JobRequest, derived: dict[str, dict[str, str]]) -> list[Spec]:
    """A request of sites: a point task per (MODIS tile holding sites, date, product), in
    the order of their tiles, then the gather of their tables."""
    sites = request.sites
    assert sites is not None and sites.kept is not None and sites.kept.tiles is not None
    layers = layers_of(request)
    native = GridSpec(NATIVE, 0.0, 0.0)
    extra = (("sites", sites.kept.ref), ("window", str(sites.window)))
    specs: list[Spec] = []
    for name, count in sorted(sites.kept.tiles.items()):
        target = native.native_tile(Tile.parse(name))
        for product in request.products:
            for day in periods(CATALOG[product], request.start, request.end):
                specs.append(TaskSpec(POINT_STAGE, product, target, day, layers=layers[product],
                                      derived=tuple(sorted(derived.get(product, {}).items())), extra=extra,
                                      sites=count))
    if not specs:
        raise RequestError(400, "sites", "no product has a date in the span")
    box = ",".join(map(repr, sites.kept.bbox or (-180.0, -90.0, 180.0, 90.0)))
    span = (("start", request.start.isoformat()), ("end", request.end.isoformat()))
    # openEO's time series JSON: a value per layer in this order (each product's layers, then its derived ones)
    series = (("series", ",".join(f"{p}.{layer}" for p in request.products
                                  for layer in [*layers[p], *derived.get(p, {})])),) if (
        request.output is not None and request.output.format == "json") else ()
    specs.append(GatherSpec(SITES_GATHER, ((0, len(specs)),), extra=(("sites", sites.kept.ref), ("bbox", box), *span,
                                                                       *series),
                            work=max(1e-6, sites.kept.count or 1) * len(specs) / 1e6))
    return specs


def _gathers(request: JobRequest, listed: list[TaskSpec], derived: dict[str, dict[str, str]]) -> list[Spec]:
    """The gathers of a request over a target grid: the zones' table (over its zonal
    tasks), and with a cube format one cube per product and layer (over the span's tile
    tasks of the product) and per output of each built-in or expression reduction (over its
    tasks)."""
    found: list[Spec] = []
    output = request.output
    cubes = output is not None and output.format != "cog"
    if request.zones is None and not cubes:
        return found  # (the box below is a reprojection of every target's bounds: 20 s at the task limit)
    span = (("start", request.start.isoformat()), ("end", request.end.isoformat()), ("bbox", _lonlat_box(listed)))
    if request.zones is not None:
        zonal = [seq for seq, spec in enumerate(listed) if spec.stage == ZONAL_STAGE]
        kept = request.zones.kept
        assert kept is not None
        found.append(GatherSpec(ZONES_GATHER, _ranges(zonal), extra=(
            ("zones", kept.ref), ("statistics", ",".join(dict.fromkeys(request.zones.statistics))),
            ("percentiles", ",".join(map(repr, request.zones.percentiles))), ("per", request.zones.by), *span),
            work=len(zonal) * max(1, kept.count or 1) / 1e3))
    if output is None or not cubes:
        return found
    layers = layers_of(request)
    derived_layers = frozenset((p, name) for p, made in derived.items() for name in made)
    for product in request.products:
        seqs = [seq for seq, spec in enumerate(listed)
                if spec.stage not in (AGGREGATE_STAGE, REDUCE_STAGE, CLIMATOLOGY_STAGE, ZONAL_STAGE)
                and spec.product == product and not spec.intermediate]
        for layer in [*layers[product], *derived.get(product, {})]:
            encoding = encoding_json(Input(layer, product, layer), derived_layers)
            found.append(_cube(output.format, seqs, [("product", product), ("layer", layer), ("name", layer),
                                                      ("encoding", json.dumps(encoding)), *span], listed))
    names: dict[str, list[int]] = {}
    for seq, spec in enumerate(listed):
        if spec.stage == AGGREGATE_STAGE and spec.reduction is not None:
            names.setdefault(spec.reduction.name, []).append(seq)
    for name, seqs in names.items():
        found.append(_cube(output.format, seqs, [("product", listed[seqs[0]].product), ("layer", ""),
                                                  ("name", name), *span], listed))
    return found


def _lonlat_box(listed: list[TaskSpec]) -> str:
    """The lon/lat box of the tasks' target tiles (what a table or cube covers): west > east
    across ±180°, as the tiles on either side say."""
    targets = {(t.grid.crs, t.bounds()) for s in listed for t in s.targets}  # each once (a task a date each)
    boxes = {lonlat_bounds(crs, bounds) for crs, bounds in targets}
    west, south = min(b[0] for b in boxes), min(b[1] for b in boxes)
    east, north = max(b[2] for b in boxes), max(b[3] for b in boxes)
    if west <= -180.0 and east >= 180.0:  # tiles on both sides of ±180°: from the eastern ones' west to the others'
        west = min((b[0] for b in boxes if b[0] > 0), default=west)
        east = max((b[2] for b in boxes if b[2] < 0), default=east)
    return ",".join(map(repr, (west, south, east, north)))


def _cube(form: str, seqs: list[int], extra: list[tuple[str, str]], listed: list[TaskSpec]) -> GatherSpec:
    work = sum(listed[seq].work() for seq in seqs) / max(1, len(listed[seqs[0]].layers) if seqs else 1)
    return GatherSpec(CUBE_GATHER, _ranges(seqs), extra=(("format", form), *extra),
                      work=max(work, 1e-6))


class _Plan:
    """The tasks being planned: tile tasks first (their sequence numbers known as they are
    made), climatologies and reductions numbered once every tile task is known."""

    def __init__(self, request: JobRequest, tile_stage: str, layers: dict[str, tuple[str, ...]],
                 derived: dict[str, dict[str, str]]) -> None:
        self.span = Span(request.start, request.end)
        self.dates = {p: periods(CATALOG[p], request.start, request.end) for p in request.products}
        self.products, self.tile_stage, self.layers, self.derived = request.products, tile_stage, layers, derived
        self.derived_layers = frozenset((p, name) for p, made in derived.items() for name in made)
        self.clip = clip_of(request)
        zones = request.zones
        # a zonal task's: its zones, its grouping, whether it keeps every value (for percentiles, the
        # median's included) and how it weights a pixel (its default, coverage, unnamed)
        self.zones: tuple[tuple[str, str], ...] = () if zones is None or zones.kept is None else (
            ("zones", zones.kept.ref), ("per", "group" if zones.over == "reduction" else zones.by),
            ("percentiles", ",".join(map(repr, sorted(
                {*zones.percentiles, *([50.0] if "median" in zones.statistics else [])})))),
            *((("weights", zones.weights),) if zones.weights != "coverage" else ()))
        self.tiles: list[TaskSpec] = []
        self.climatologies: list[TaskSpec] = []
        # (spec, tile seqs, climatology indexes, indexes of the reductions it reads the outputs of)
        self.reductions: list[tuple[TaskSpec, list[int], list[int], list[int]]] = []

    def _derived(self, product: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.derived.get(product, {}).items()))

    def batch(self, index: int, batch: tuple[TargetTile, ...], reductions: list[Reduction],
              zonal: Reduction | None = None) -> None:
        """Plan one batch of target tiles: its tile tasks (baselines' first), then for each
        target tile its climatologies, reductions and zonal statistics."""
        seq_of: dict[tuple[str, date], int] = {}
        reductions = reductions + ([zonal] if zonal is not None else [])
        partition = index if reductions else None

        def tile(product: str, day: date, intermediate: bool) -> int:
            key = (product, day)
            if key not in seq_of:
                seq_of[key] = len(self.tiles)
                self.tiles.append(TaskSpec(self.tile_stage, product, batch[0], day, layers=self.layers[product],
                                           derived=self._derived(product), intermediate=intermediate,
                                           partition=partition, clip=self.clip,
                                           batch=batch if len(batch) > 1 else ()))
            elif not intermediate and self.tiles[seq_of[key]].intermediate:
                self.tiles[seq_of[key]] = replace(self.tiles[seq_of[key]], intermediate=False)
            return seq_of[key]

        planned: list[tuple[TaskSpec, list[int], list[int], list[int]]] = []
        for target in batch:  # the reductions one reads the outputs of: indexes among its own, then among planned
            planned += [(spec, deps, climates, [len(planned) + r for r in after])
                        for spec, deps, climates, after in self._target(target, reductions, partition, tile)]
        for spec, deps, _, _ in planned:  # a reduction's tiles, group by group: its inputs' dates in its group
            assert spec.reduction is not None and spec.group is not None
            if spec.reduction.over:
                continue  # it reads a reduction's outputs, which read the tiles
            for product in sorted({i.product for i in spec.reduction.inputs}):
                days = members(spec.reduction.by, spec.group, self.span,
                               [Period(d, CATALOG[product].period_days) for d in self.dates[product]])
                deps += [tile(product, p.first, False) for p in days]
        for product in self.products:  # the span's other dates (of a product no reduction reads)
            for day in self.dates[product]:
                tile(product, day, False)
        first = len(self.reductions)
        self.reductions += [(spec, deps, climates, [first + r for r in after])
                            for spec, deps, climates, after in planned]

    def _target(self, target: TargetTile, reductions: list[Reduction], partition: int | None,
                tile: Callable[[str, date, bool], int]) -> list[tuple[TaskSpec, list[int], list[int], list[int]]]:
        """One target tile's climatologies (planned) and reductions and zonal statistics
        (each with the climatologies it reads and the reductions, among those returned,
        it reads the outputs of)."""
        made: dict[tuple[Input, tuple[Window, ...], str], int] = {}  # climatologies, by what they are
        planned: list[tuple[TaskSpec, list[int], list[int], list[int]]] = []
        at: dict[tuple[str, str], int] = {}  # (a reduction's name, a group's key): its task among planned
        for reduction in reductions:
            products = sorted({i.product for i in reduction.inputs})
            span_periods = [Period(d, CATALOG[p].period_days) for p in products for d in self.dates[p]]
            stage = {"program": REDUCE_STAGE, "zonal": ZONAL_STAGE}.get(reduction.kind, AGGREGATE_STAGE)
            for group, _ in assign(reduction.by, self.span, span_periods):
                climates = self._climatologies(reduction, group, target, partition, tile, made)
                # zones over a reduction read its task of the group (the same groups: its grouping)
                after = [at[(reduction.over, group.key)]] if reduction.over else []
                at[(reduction.name, group.key)] = len(planned)
                planned.append((TaskSpec(stage, products[0], target, group.start, layers=self.layers[products[0]],
                                         reduction=reduction, group=group, partition=partition,
                                         derived_layers=self.derived_layers,
                                         extra=self.zones if reduction.kind == "zonal" else ()),
                                [], climates, after))
        return planned

    def _climatologies(self, reduction: Reduction, group: Group, target: TargetTile, partition: int | None,
                       tile: Callable[[str, date, bool], int],
                       made: dict[tuple[Input, tuple[Window, ...], str], int]) -> list[int]:
        """The climatologies a reduction of ``group`` compares against (indexes among this
        job's), planned with their baseline tile tasks if not already."""
        if reduction.baseline is None:
            return []
        reference = baseline_of(reduction.by, group, reduction.baseline)
        if reference is None:
            raise RequestError(400, "reduce.baseline", f"the baseline holds no day of group {group.key}")
        found = []
        for one in reduction.inputs:
            key = (one, reference.windows, str(reduction.aggregate))
            if key not in made:
                product = CATALOG[one.product]
                days = members(reduction.by, reference, reduction.baseline,
                               [Period(d, product.period_days)
                                for d in periods(product, reduction.baseline.start, reduction.baseline.end)])
                if not days:
                    raise RequestError(400, "reduce.baseline", f"{one.ref} has no date in the baseline's days "
                                       f"of group {group.key}")
                deps = _ranges(tile(one.product, p.first, True) for p in days)
                made[key] = len(self.climatologies)
                self.climatologies.append(TaskSpec(
                    CLIMATOLOGY_STAGE, one.product, target, reference.start,
                    reduction=replace(reduction, inputs=(one,)), group=reference, deps=deps, partition=partition,
                    derived_layers=self.derived_layers))
            found.append(made[key])
        return found

    def listed(self) -> list[TaskSpec]:
        """Every task in release order, each with the tasks it waits for and those it feeds."""
        first_climatology, first_reduction = len(self.tiles), len(self.tiles) + len(self.climatologies)
        waiting = list(self.climatologies) + [
            replace(spec, deps=_ranges([*tiles, *(first_climatology + c for c in climates),
                                        *(first_reduction + r for r in reductions)]))
            for spec, tiles, climates, reductions in self.reductions]
        feeds: dict[int, list[int]] = {}
        for seq, spec in enumerate(waiting, start=first_climatology):
            for first, count in spec.deps:
                for dep in range(first, first + count):
                    feeds.setdefault(dep, []).append(seq)
        assert first_reduction == first_climatology + len(self.climatologies)
        listed = [*self.tiles, *waiting]
        return [replace(spec, feeds=tuple(feeds.get(seq, ()))) if seq in feeds else spec
                for seq, spec in enumerate(listed)]


def plan_of(specs: list[Spec]) -> list[TaskPlan]:
    """The lifecycle's plan of the tasks ``specs``: each feeds the tasks that wait for it, and
    shares their partition; a gather waits for the whole job."""
    return [TaskPlan(spec.stage, spec.params(), after_all=True, work=spec.work, history=spec.stage)
            if isinstance(spec, GatherSpec) else
            TaskPlan(spec.stage, spec.params(), waits_for=spec.waits, feeds=spec.feeds, group=spec.partition,
                     work=spec.work(), history=spec.history()) for spec in specs]
