"""The stages of built-in work, run in the worker on numpy (no program, no sandbox):

- ``aggregate``: a reduction's built-in reducer or expression over a target tile's group of
  dates (``pipeline.requests.reductions``);
- ``climatology``: a baseline's statistics of one input over one group's days in the
  baseline's years — each year's days reduced by the reduction's ``aggregate``, then the
  years' mean, standard deviation, minimum, maximum and count.

Each reads the rows of the tasks it waited for (their outputs: the tiles of its inputs, a
climatology), fetches those tiles in parallel, and writes its outputs into ``tiles``,
content-addressed by what they are made of (the code's version, what is computed, the input
tiles' own content addresses): an output that exists already ends the task ``CACHED``, and
concurrent tasks make it once. A tile whose task found no data (``NO_DATA``) is a date with
no value; one whose task failed is a date missing, and fails the reduction if its request
says so. An output carries its encoding (data type, nodata, scale, offset, unit) in the file.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import stages
from pipeline.failures import FailureClass, StageFailure
from pipeline.lifecycle import tasks
from pipeline.lifecycle.status import TaskStatus
from pipeline.lifecycle.tasks import TaskRow
from pipeline.reduction import AGGREGATE_STAGE, CLIMATOLOGY_STAGE
from pipeline.science import builtins, climatology, expressions, rasters
from pipeline.science.climatology import STATISTICS, Climatology
from pipeline.science.encoding import Encoding, decode, encode, float32
from pipeline.stages import StageContext
from pipeline.storage import cache, names
from pipeline.storage.clients import Clients

SYNTHETIC_TAG = "BAGPIPE_SYNTHETIC"  # an input's file says it was made from the local imitation's synthetic data
FETCHERS = 8  # input tiles fetched at once
# what an expression may call an input's baseline figures (``ndvi.vci``), from its value and climatology
BASELINE_FIGURES: dict[str, Callable[[np.ndarray, Climatology], np.ndarray]] = {
    "anomaly": lambda v, c: v - c.mean,
    "zscore": lambda v, c: climatology.ratio(v - c.mean, c.std),
    "vci": lambda v, c: 100 * climatology.ratio(v - c.min, c.max - c.min),
    "tci": lambda v, c: 100 * climatology.ratio(c.max - v, c.max - c.min),
    "baseline_mean": lambda v, c: c.mean, "baseline_std": lambda v, c: c.std,
    "baseline_min": lambda v, c: c.min, "baseline_max": lambda v, c: c.max,
}


def layer_of(blob: str) -> str:
    """The layer a tile task's output is (its name says: ``…/PRODUCT.LAYER.DATE.TILE.tif``)."""
    return blob.rsplit("/", 1)[-1].split(".")[1]


def encoding_from(found: dict[str, Any]) -> Encoding:
    valid = found.get("valid")
    return Encoding(found["dtype"], found["nodata"], found["scale"], found["offset"], found.get("unit", ""),
                    tuple(valid) if valid else None, bool(found.get("categorical")))


@dataclass
class Gathered:
    """What a waiting task's dependencies left: per input, its dated tiles (blob names in
    ``tiles``); per input, its climatology's; the dates with no data and those that failed."""

    tiles: dict[str, list[tuple[date, str]]] = field(default_factory=dict)
    climatologies: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def blobs(self) -> list[str]:
        return [blob for dated in self.tiles.values() for _, blob in dated] + list(self.climatologies.values())


def gather(ctx: StageContext, inputs: list[tuple[str, str, str]]) -> Gathered:
    """The outputs of the tasks ``ctx``'s task waited for, for its inputs ((alias, product,
    layer) each), of its own target tile (a tile task of a batch made those of each of its
    target tiles: ``planning.places``)."""
    found = Gathered({alias: [] for alias, _, _ in inputs})
    for row in tasks.list_ranges(ctx.clients.tasks, ctx.part, tasks.ranges_of(ctx.params["deps"])):
        _take(row, inputs, found, ctx.params["tile"])
    for dated in found.tiles.values():
        dated.sort()
    return found


def _take(row: TaskRow, inputs: list[tuple[str, str, str]], found: Gathered, tile: str) -> None:
    places = row.places()  # a batch's: this tile's own (its NO_DATA where the catalog had none of its tiles)
    params, status, made = places[0] if len(places) == 1 else next(p for p in places if p[0]["tile"] == tile)
    outputs = [o.removeprefix(names.TILE_OUTPUT_PREFIX) for o in made]
    if row.stage == CLIMATOLOGY_STAGE:
        alias = json.loads(params["input"])[0]
        if outputs:
            found.climatologies[alias] = outputs[0]
        elif status is not TaskStatus.NO_DATA:
            found.failed.append(f"baseline of {alias}")
        return
    day = params["date"]
    if status is TaskStatus.NO_DATA:
        found.missing.append(day)
    elif not outputs:
        found.failed.append(day)
    by_layer = {layer_of(blob): blob for blob in outputs}
    for alias, product, layer in inputs:
        if product == params["product"] and layer in by_layer:
            found.tiles[alias].append((date.fromisoformat(day), by_layer[layer]))


class Fetched:
    """The input tiles of a task on local disk, fetched in parallel (each once)."""

    def __init__(self, ctx: StageContext, blobs: list[str], folder: Path) -> None:
        self.paths: dict[str, Path] = {}
        wanted = sorted(set(blobs))

        def fetch(item: tuple[int, str]) -> Path:
            index, blob = item
            path = folder / f"{index}.tif"
            path.write_bytes(ctx.clients.transfers.download(ctx.clients.tiles, blob)[0])
            return path

        with ThreadPoolExecutor(FETCHERS) as pool:
            self.paths = dict(zip(wanted, pool.map(fetch, enumerate(wanted)), strict=True))

    def reader(self, dated: list[tuple[date, str]], encoding: Encoding) -> builtins.Read:
        """A stack's reader (``builtins.reduce_stream``'s): date i's decoded values, a block of rows."""
        return lambda index, rows: decode(rasters.read(self.paths[dated[index][1]], rows), encoding)

    def stored(self, dated: list[tuple[date, str]], encoding: Encoding) -> builtins.ReadStored:
        """A stack's reader of stored values (``builtins.reduce_stored``'s): date i's, whole."""
        return lambda index: rasters.read(self.paths[dated[index][1]]).astype(encoding.dtype, copy=False)

    def climatology(self, blob: str) -> Climatology:
        return climatology.from_geotiff(self.paths[blob]).climatology

    def synthetic(self) -> dict[str, str]:
        """The tag that says an output was made from synthetic data, if any input says so."""
        return {SYNTHETIC_TAG: "true"} if any(rasters.tags(p).get(SYNTHETIC_TAG) == "true"
                                             for p in self.paths.values()) else {}


def content_key(kind: str, *parts: Any) -> str:
    """An output's content address: what computed it and what it was computed from."""
    return hashlib.sha256(json.dumps([kind, *parts], sort_keys=True, default=str).encode()).hexdigest()


def _made(ctx: StageContext, outputs: dict[str, Callable[[], bytes]]) -> None:
    """Make each output (its blob name in ``tiles``: the function that makes its bytes)
    once, whoever asks; name them on the task; ``CACHED`` if every one was there."""
    owner = f"{ctx.part}/{ctx.task}"
    made_any = False
    for blob, make in outputs.items():
        found = cache.ensure(ctx.clients.transfers, ctx.clients.tiles, blob, make, "image/tiff", want_data=False,
                             owner=owner, tidy=ctx.attempt > 1)
        made_any = made_any or found.made
        ctx.outputs.append(names.TILE_OUTPUT_PREFIX + blob)
    ctx.cached = not made_any


def _check_failed(ctx: StageContext, found: Gathered) -> None:
    if found.failed and ctx.params.get("on_failure", "fail") == "fail":
        raise StageFailure(FailureClass.DEPENDENCY_FAILED, f"no tile for {', '.join(found.failed)}: its task "
                           "failed (the request says a reduction fails then)")


@stages.stage(AGGREGATE_STAGE)
def aggregate(ctx: StageContext) -> None:
    """A reduction's built-in reducer (an output per input) or expression (one output) over
    its group of dates."""
    params = ctx.params
    spec = json.loads(params["reduce"])
    inputs = [(alias, product, layer) for alias, product, layer in spec["inputs"]]
    encodings = {alias: encoding_from(e) for alias, e in json.loads(params["encodings"]).items()}
    found = gather(ctx, inputs)
    _check_failed(ctx, found)
    if not any(found.tiles.values()):
        if found.failed:
            raise StageFailure(FailureClass.DEPENDENCY_FAILED, "not one tile of the group was made")
        ctx.no_data = True  # the catalog has no data for any date of the group
        return
    group, tile = params["group"], params["tile"]
    version = builtins.VERSION if spec["kind"] == "builtin" else expressions.VERSION
    key = content_key(AGGREGATE_STAGE, version, spec, group, params["start"], params["end"],
                      {alias: [blob for _, blob in dated] for alias, dated in found.tiles.items()},
                      found.climatologies)
    with tempfile.TemporaryDirectory(prefix="bagpipe-aggregate-") as folder:
        fetched: list[Fetched] = []

        def inputs_here() -> Fetched:  # fetched once, only if an output is to be made
            if not fetched:
                fetched.append(Fetched(ctx, found.blobs(), Path(folder)))
                ctx.progress(0.0)
            return fetched[0]

        tags = {"GROUP": group, "START": params["start"], "END": params["end"], "TARGET_TILE": tile,
                "REDUCTION": json.dumps(spec), "BAGPIPE_STAGE": version}
        outputs: dict[str, Callable[[], bytes]] = {}
        if spec["kind"] == "builtin":
            reducer = _reducer(spec["reducer"])
            for alias, _, _ in inputs:
                if not found.tiles[alias]:
                    continue  # this input has no data in the group: no output of it
                name = f"{spec['name']}.{alias}"
                outputs[names.reduced_blob(key, name, group, tile)] = (
                    lambda alias=alias, name=name: _builtin(inputs_here(), reducer, found, alias,  # type: ignore[misc]
                                                            encodings[alias], tags | {"INPUT": alias, "NAME": name}))
        else:
            outputs[names.reduced_blob(key, spec["name"], group, tile)] = lambda: _expression(
                inputs_here(), spec, found, encodings, tags | {"NAME": spec["name"]})
        _made(ctx, outputs)


def _reducer(text: str) -> builtins.Reducer:
    """A built-in reducer as a reduction's params name it (``percentile(90)`` with its p)."""
    name, _, rest = text.partition("(")
    return builtins.Reducer(name, float(rest.rstrip(")")) if rest else None)


def _grid(fetched: Fetched, found: Gathered) -> rasters.Grid:
    first = next(blob for dated in found.tiles.values() for _, blob in dated)
    return rasters.Grid.of(fetched.paths[first])


def _builtin(fetched: Fetched, reducer: builtins.Reducer, found: Gathered, alias: str, encoding: Encoding,
             tags: dict[str, str]) -> bytes:
    dated = found.tiles[alias]
    grid = _grid(fetched, found)
    baseline = fetched.climatology(found.climatologies[alias]) if reducer.needs_baseline else None
    if reducer.needs_baseline and baseline is None:
        raise StageFailure(FailureClass.DEPENDENCY_FAILED, f"no baseline for {alias}")
    out = reducer.output_encoding(encoding)
    dates = [d for d, _ in dated]
    if builtins.on_stored(reducer, encoding):  # the same stored answer, with no float stack decoded
        stored = builtins.reduce_stored(reducer, fetched.stored(dated, encoding), dates, grid.shape, encoding)
    else:
        stored = encode(builtins.reduce_stream(reducer, fetched.reader(dated, encoding), dates, grid.shape, baseline),
                        out)
    return rasters.write_cog([stored], grid, out, [tags["NAME"]], tags | fetched.synthetic(),
                             categorical=out.categorical)


def _expression(fetched: Fetched, spec: dict[str, Any], found: Gathered, encodings: dict[str, Encoding],
                tags: dict[str, str]) -> bytes:
    aliases = [alias for alias, _, _ in spec["inputs"]]
    parsed = expressions.parse(spec["expression"],
                               aliases + [f"{a}.{n}" for a in aliases for n in BASELINE_FIGURES])
    aggregate = _reducer(spec["aggregate"])
    grid = _grid(fetched, found)
    values: dict[str, np.ndarray] = {}
    for alias in aliases:
        dated = found.tiles[alias]
        if dated:
            values[alias] = builtins.reduce_stream(aggregate, fetched.reader(dated, encodings[alias]),
                                                   [d for d, _ in dated], grid.shape).astype(np.float32)
        else:
            values[alias] = np.full(grid.shape, np.nan, np.float32)
    for name in parsed.names:
        alias, _, figure = name.rpartition(".")
        if figure in BASELINE_FIGURES and alias in values:
            if alias not in found.climatologies:
                raise StageFailure(FailureClass.DEPENDENCY_FAILED, f"no baseline for {alias}")
            figures = BASELINE_FIGURES[figure]
            with np.errstate(all="ignore"):
                values[name] = figures(values[alias], fetched.climatology(found.climatologies[alias]))
    result = parsed.evaluate(values)
    out = float32(spec.get("unit", ""))
    return rasters.write_cog([encode(result, out)], grid, out, [tags["NAME"]], tags | fetched.synthetic())


@stages.stage(CLIMATOLOGY_STAGE)
def baseline(ctx: StageContext) -> None:
    """One input's climatology over its baseline group: each year's days reduced by the
    reduction's aggregate, then the statistics over the years."""
    params = ctx.params
    alias, product, layer = json.loads(params["input"])
    encoding = encoding_from(json.loads(params["encoding"]))
    windows = [(date.fromisoformat(a), date.fromisoformat(b)) for a, b in json.loads(params["windows"])]
    found = gather(ctx, [(alias, product, layer)])
    _check_failed(ctx, found)
    dated = found.tiles[alias]
    if not dated:
        if found.failed:
            raise StageFailure(FailureClass.DEPENDENCY_FAILED, "not one tile of the baseline was made")
        ctx.no_data = True
        return
    blob = climatology_blob(params)
    aggregate = _reducer(params["aggregate"])

    def make() -> bytes:
        with tempfile.TemporaryDirectory(prefix="bagpipe-climatology-") as folder:
            fetched = Fetched(ctx, [b for _, b in dated], Path(folder))
            grid = _grid(fetched, found)
            years = climatology.ClimatologyAccumulator(grid.shape)
            for number, (first, last) in enumerate(windows):
                year = [(d, b) for d, b in dated if first <= d <= last]
                if year:
                    years.add(builtins.reduce_stream(aggregate, fetched.reader(year, encoding), [d for d, _ in year],
                                                     grid.shape).astype(np.float32))
                ctx.progress((number + 1) / len(windows))
            stats = years.result()
            made_of = fetched.synthetic()
        out = float32(encoding.unit)
        bands = [np.asarray(getattr(stats, name), np.float32) for name in STATISTICS]  # count: 0, never nodata
        return rasters.write_cog(bands, grid, out, list(STATISTICS),
                                 {"STATISTICS": ",".join(STATISTICS), "DDOF": str(climatology.DDOF),
                                  "BAGPIPE_STAGE": climatology.VERSION, "INPUT": f"{product}.{layer}",
                                  "AGGREGATE": params["aggregate"], "WINDOWS": params["windows"],
                                  "TARGET_TILE": params["tile"]} | made_of)

    _made(ctx, {blob: make})


def climatology_blob(params: dict[str, str]) -> str:
    """Where a climatology task's output is, by its params (its content address, computed
    at planning from the baseline's granules: ``pipeline.requests.expansion``)."""
    _, product, layer = json.loads(params["input"])
    windows = json.loads(params["windows"])
    return names.climatology_blob(params["key"], product, layer, date.fromisoformat(windows[0][0]),
                                  date.fromisoformat(windows[-1][1]), params["tile"])


@stages.made_already(CLIMATOLOGY_STAGE)
def climatologies_made(clients: Clients, rows: list[TaskRow]) -> dict[str, list[str]]:
    """Of the task ``rows``, the PENDING climatologies already in the cache (a job before
    this one made them over the same tiles and years): settled at planning, so that no
    task of theirs runs."""
    wanted = {row.task: climatology_blob(row.parameters()) for row in rows
              if row.stage == CLIMATOLOGY_STAGE and row.status is TaskStatus.PENDING}
    if not wanted:
        return {}
    with cache.Looks(clients) as looks:
        present = looks.present(clients.tiles.container_name, wanted.values())
    return {task: [names.TILE_OUTPUT_PREFIX + blob] for task, blob in wanted.items() if blob in present}
