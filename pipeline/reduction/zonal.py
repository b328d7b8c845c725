"""Zonal statistics: per zone (a polygon with an id) and date — or group of dates — the
statistics of an input's pixels on the target grid, each pixel weighted by the share of its
area inside the zone, as ``exactextract`` computes them (its ``values`` and ``coverage``:
the cells a polygon touches and the fraction of each inside it; its ``mean`` is
Σ c·x / Σ c, its ``count`` Σ c, its ``sum`` Σ c·x, its ``stdev`` the weighted population
deviation); or, with ``centre`` weights, each pixel whose centre is in the zone weighted 1
and the others left out, as openEO's ``aggregate_spatial`` and ``filter_spatial`` take a
pixel (GDAL's rasterizer's rule, by which a polygon region's tiles are clipped too): then
``count`` is the number of pixels with data, ``sd`` the sample deviation and a percentile
the unweighted one of Hyndman and Fan's type 7, as openEO's ``sd`` and ``quantiles`` have
them.

- A **zonal** task per (target tile, group) (``zonal``) waits for the target tile's tile
  tasks of its inputs (as a reduction does, in their partition), runs ``exactextract`` (or,
  with centre weights, GDAL's rasterizer) over each tile file for the zones that meet the
  tile (found by a spatial index of the zones, which a stage process parses once per
  document, :func:`zone_index`; each file read once into memory, decoded as exactextract's
  own rasterio source decodes it window by window, and the zones handed over as WKB), and
  keeps per (zone, input, date or
  group) a *partial*: Σ c, Σ c·x, Σ c·x², the minimum and maximum of the cells with data,
  the count of those cells, and, when percentiles are asked, every (value, coverage) pair;
  zones over a reduction read instead the outputs of the reduction task of its group there
  (a built-in's or an expression's, one raster per group: each pixel's monthly mean, say).
  One Parquet part in ``tiles``, content-addressed by its tiles and zones.
- The **gather** (``zones``), after every other task, joins the partials across tiles: the
  weighted sums add exactly (a pixel belongs to one target tile, and its coverage by a
  polygon does not depend on which tile holds it), minima and maxima fold, and a
  percentile is computed from the union of every tile's (value, coverage) pairs — the very
  cells, values and weights ``exactextract`` would see over a mosaic of the tiles — by its
  own weighted-quantile rule (``builtins.weighted_quantile``), so that it equals
  ``exactextract`` over the
  mosaic, not an average of the tiles' percentiles, which would be wrong. A zone across
  two tiles, or across ±180° (its two parts in tiles on either side), is one row per date
  or group. The table is one CSV and one Parquet file. The join is a merge of the parts,
  each sorted by (zone, input, key), read a batch at a time (``joined``): memory holds a
  batch of each part and one key's partials, whatever the number of zones and tiles.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import tempfile
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import rasterio
import shapely
from exactextract import exact_extract
from exactextract.feature import Feature, FeatureSource
from exactextract.raster import NumPyRasterSource
from pyproj import CRS, Transformer
from rasterio.features import geometry_mask
from rasterio.windows import Window

from pipeline import stages
from pipeline.failures import FailureClass, StageFailure
from pipeline.lifecycle import tasks
from pipeline.lifecycle.status import ENDED_WELL, MADE, TaskStatus
from pipeline.reduction import ZONAL_STAGE, ZONES_GATHER, gather
from pipeline.reduction.builtin import Fetched, Gathered, _check_failed, encoding_from
from pipeline.reduction.builtin import gather as gather_tiles
from pipeline.science import tables, vectors
from pipeline.science.builtins import weighted_quantile
from pipeline.science.vectors import Zone
from pipeline.stages import StageContext
from pipeline.storage import cache, names
from pipeline.storage.clients import Clients

VERSION = "zonal-1"  # change when the partials of the same inputs would change
KEPT_ZONES = 4  # zones' documents a stage process keeps parsed
BATCH = 256  # rows of a part read, or of the table written, at a time
FAN_IN = 64  # parts a join reads at once (more are merged first, as many at a time)
PARTIAL = pa.schema([
    ("zone", pa.string()), ("input", pa.string()), ("key", pa.string()), ("start", pa.date32()),
    ("end", pa.date32()), ("unit", pa.string()), ("sum_w", pa.float64()), ("sum_wx", pa.float64()),
    ("sum_wxx", pa.float64()), ("min", pa.float64()), ("max", pa.float64()), ("cells", pa.int64()),
    ("values", pa.list_(pa.float64())), ("weights", pa.list_(pa.float64())),
])


@dataclass
class Partial:
    """One (zone, input, key)'s partial statistics, which add across tiles and dates."""

    unit: str = ""
    start: Any = None
    end: Any = None
    sum_w: float = 0.0
    sum_wx: float = 0.0
    sum_wxx: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    cells: int = 0
    values: list[np.ndarray] = field(default_factory=list)
    weights: list[np.ndarray] = field(default_factory=list)

    def add(self, x: np.ndarray, w: np.ndarray, keep: bool) -> None:
        """Cells of values ``x`` covered by fractions ``w`` (those with data only)."""
        if not len(x):
            return
        self.sum_w += float(np.sum(w))
        self.sum_wx += float(np.sum(w * x))
        self.sum_wxx += float(np.sum(w * x * x))
        self.low, self.high = min(self.low, float(x.min())), max(self.high, float(x.max()))
        self.cells += len(x)
        if keep:
            self.values.append(x)
            self.weights.append(w)

    def join(self, other: Partial) -> None:
        self.sum_w += other.sum_w
        self.sum_wx += other.sum_wx
        self.sum_wxx += other.sum_wxx
        self.low, self.high = min(self.low, other.low), max(self.high, other.high)
        self.cells += other.cells
        self.values += other.values
        self.weights += other.weights
        self.start = min(d for d in (self.start, other.start) if d is not None)
        self.end = max(d for d in (self.end, other.end) if d is not None)
        self.unit = self.unit or other.unit

    def statistics(self, names: Iterable[str], percentiles: Iterable[float]) -> dict[str, float | None]:
        """The statistics asked for (None where the zone has no cell with data)."""
        empty = self.sum_w <= 0
        mean = self.sum_wx / self.sum_w if not empty else math.nan
        found: dict[str, float | None] = {}
        for name in names:
            if name == "count":
                found[name] = self.sum_w
            elif empty:
                found[name] = None
            elif name == "mean":
                found[name] = mean
            elif name == "sum":
                found[name] = self.sum_wx
            elif name == "min":
                found[name] = self.low
            elif name == "max":
                found[name] = self.high
            elif name == "std":
                found[name] = math.sqrt(max(0.0, self.sum_wxx / self.sum_w - mean * mean))
            elif name == "sd":  # Bessel's correction (frequency weights): none of a single pixel
                found[name] = math.sqrt(max(0.0, (self.sum_wxx - self.sum_w * mean * mean) / (self.sum_w - 1))) \
                    if self.sum_w > 1 else None
            elif name == "median":
                found[name] = weighted_quantile(np.concatenate(self.values), np.concatenate(self.weights), 0.5)
        for p in percentiles:
            found[f"p{p:g}"] = None if empty else weighted_quantile(np.concatenate(self.values),
                                                                     np.concatenate(self.weights),
                                                            p / 100)
        return found


class ZoneIndex:
    """A zones' document parsed, with a spatial index of its polygons (lon/lat)."""

    def __init__(self, zones: list[Zone]) -> None:
        self.zones = zones
        self.tree = shapely.STRtree([z.geometry for z in zones])

    def meeting(self, box: shapely.Polygon) -> list[Zone]:
        """The zones that meet ``box``, in the document's order."""
        return [self.zones[i] for i in sorted(self.tree.query(box, predicate="intersects"))]


_KEPT: OrderedDict[str, ZoneIndex] = OrderedDict()  # this process's parsed zones, by digest, latest last


def zone_index(clients: Clients, digest: str) -> ZoneIndex:
    """The zones of the document ``digest`` names, parsed once per stage process (kept warm,
    it runs task after task of a job: the same zones for each) and kept for the last
    :data:`KEPT_ZONES` documents; read and checked against its digest when first wanted."""
    found = _KEPT.pop(digest, None)
    if found is None:
        found = ZoneIndex(vectors.zones_from(stages.kept_document(clients, digest)))
    _KEPT[digest] = found
    while len(_KEPT) > KEPT_ZONES:
        _KEPT.popitem(last=False)
    return found


def zones_meeting(index: ZoneIndex, crs: str, bounds: tuple[float, float, float, float],
                  lonlat: tuple[float, float, float, float]) -> list[Zone]:
    """The zones that meet a target tile (its ``bounds`` in its CRS, ``lonlat`` its lon/lat
    box), their geometries in the tile's CRS."""
    near = index.meeting(shapely.box(*lonlat))
    if CRS.from_user_input(crs).to_epsg() != 4326:
        move = Transformer.from_crs("EPSG:4326", CRS.from_user_input(crs), always_xy=True)
        near = [Zone(z.id, shapely.transform(z.geometry, lambda xy: np.column_stack(move.transform(
            xy[:, 0], xy[:, 1])))) for z in near]
    tile = shapely.box(*bounds)
    return [z for z in near if z.geometry.intersects(tile)]


class _Feature(Feature):  # type: ignore[misc]  # exactextract has no type information
    """A zone as exactextract reads it: its id, its geometry as WKB (not GeoJSON text, which
    it would parse for every zone)."""

    def __init__(self, zone: Zone) -> None:
        Feature.__init__(self)
        self.ident = zone.id
        self.wkb = shapely.to_wkb(zone.geometry)

    def get(self, name: str) -> str:
        return self.ident

    def geometry(self) -> bytes:
        return bytes(self.wkb)

    def set_geometry_format(self) -> str:
        return "wkb"

    def fields(self) -> list[str]:
        return ["id"]


class Features(FeatureSource):  # type: ignore[misc]
    """A tile's zones as exactextract reads them, made once for each of the task's files."""

    def __init__(self, zones: list[Zone]) -> None:
        super().__init__()
        self.zones = zones
        self.features = [_Feature(z) for z in zones]

    def count(self) -> int:
        return len(self.features)

    def __iter__(self) -> Iterator[_Feature]:
        return iter(self.features)

    def srs_wkt(self) -> None:
        return None


def _decoded(path: Path) -> NumPyRasterSource:
    """A tile file as exactextract's in-memory raster: read once, its nodata masked and its
    values decoded by its scale and offset, as exactextract's rasterio source decodes each
    window it reads (a read and a masked decode per zone)."""
    with rasterio.open(path) as src:
        values = src.read(1, masked=True)
        if src.scales[0] != 1.0 or src.offsets[0] != 0.0:
            if np.issubdtype(values.dtype, np.integer):
                values = values.astype(np.float64)
            values = values * src.scales[0] + src.offsets[0]
        if src.transform.b or src.transform.d:
            raise ValueError(f"{path.name}: a rotated raster")
        west, south, east, north = src.bounds
        return NumPyRasterSource(values, west, south, east, north, srs_wkt=src.crs.wkt if src.crs else None)


def extract(path: Path, zones: Features, centre: bool = False) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per zone, the values (decoded by the file's scale and offset, nodata left out) and
    coverage fractions of the tile's cells it touches: exactextract's ``values`` and
    ``coverage``; with ``centre``, those of the cells whose centre is in the zone, each
    weighted 1 (:func:`centred`)."""
    if not zones.zones:
        return {}
    if centre:
        return centred(path, zones.zones)
    found = exact_extract(_decoded(path), zones, ["values", "coverage"], include_cols=["id"],
                          output="geojson")
    return {str(f["id"]): (np.asarray(f["properties"]["values"], np.float64),
                           np.asarray(f["properties"]["coverage"], np.float64)) for f in found}


def centred(path: Path, zones: list[Zone]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per zone, the values (decoded, nodata left out) of the tile's pixels whose centre is
    in the zone, each weighted 1: GDAL's rasterizer's rule (``geometry_mask``), which the
    tiles of a polygon region are clipped by too (``tilestage.clipped``), over the window of
    the zone's box. (exactextract's cells are not used: it leaves out a cell now and then
    along a zone's edge whose centre is inside.)"""
    made = {}
    with rasterio.open(path) as src:
        transform, scale, offset = src.transform, src.scales[0], src.offsets[0]
        for zone in zones:
            ident, geometry = zone.id, zone.geometry
            west, south, east, north = geometry.bounds
            first_col = max(0, math.floor((west - transform.c) / transform.a))
            last_col = min(src.width, math.ceil((east - transform.c) / transform.a))
            first_row = max(0, math.floor((north - transform.f) / transform.e))
            last_row = min(src.height, math.ceil((south - transform.f) / transform.e))
            if first_col >= last_col or first_row >= last_row:
                made[ident] = (np.empty(0), np.empty(0))
                continue
            window = Window(first_col, first_row, last_col - first_col, last_row - first_row)
            inside = geometry_mask([geometry], out_shape=(window.height, window.width),
                                   transform=src.window_transform(window), invert=True)
            good = inside & (src.read_masks(1, window=window) > 0)
            x = src.read(1, window=window)[good].astype(np.float64) * scale + offset
            made[ident] = (x, np.ones(len(x)))
    return made


@stages.stage(ZONAL_STAGE)
def zonal(ctx: StageContext) -> None:
    """A target tile's partial zonal statistics over its group's dates (or over the outputs
    of the reduction of its group, for zones over a reduction)."""
    params = ctx.params
    spec = json.loads(params["reduce"])
    inputs = [(alias, product, layer) for alias, product, layer in spec["inputs"]]
    encodings = {alias: encoding_from(e) for alias, e in json.loads(params["encodings"]).items()}
    over = bool(spec.get("over"))
    found = reduced(ctx, [alias for alias, _, _ in inputs]) if over else gather_tiles(ctx, inputs)
    _check_failed(ctx, found)
    if not any(found.tiles.values()):
        ctx.no_data = True
        return
    per_date = params["per"] == "date"
    keep = bool(params.get("percentiles"))
    centre = params.get("weights") == "centre"
    key = hashlib.sha256(json.dumps([VERSION, params["zones"], per_date, keep, params["group"],
                                     {a: [b for _, b in d] for a, d in found.tiles.items()},
                                     *(["centre"] if centre else [])]).encode()).hexdigest()
    blob = names.table_blob(key, f"zones.{params['group']}.{params['tile']}.parquet")

    def make() -> bytes:
        west, south, east, north = (float(b) for b in params["bounds"].split(","))
        lon0, lat0, lon1, lat1 = (float(b) for b in params["lonlat"].split(","))
        features = Features(zones_meeting(zone_index(ctx.clients, params["zones"]), params["crs"],
                                          (west, south, east, north), (lon0, lat0, lon1, lat1)))
        partials: dict[tuple[str, str, str], Partial] = {}
        with tempfile.TemporaryDirectory(prefix="bagpipe-zonal-") as folder:
            fetched = Fetched(ctx, found.blobs(), Path(folder))
            done, total = 0, max(1, sum(len(d) for d in found.tiles.values()))
            for alias, dated in found.tiles.items():
                for day, tile in dated:
                    where = day.isoformat() if per_date else params["group"]
                    unit = _unit(fetched.paths[tile]) if over else encodings[alias].unit  # a reduction's: its file's
                    for zone, (x, w) in extract(fetched.paths[tile], features, centre).items():
                        one = partials.setdefault((zone, alias, where), Partial(unit))
                        one.start = min(d for d in (one.start, day) if d is not None)
                        one.end = max(d for d in (one.end, day) if d is not None)
                        one.add(x, w, keep)
                    done += 1
                    ctx.progress(done / total)
        return tables.to_parquet(_partials_table(sorted(partials.items())))

    made = cache.ensure(ctx.clients.transfers, ctx.clients.tiles, blob, make, "application/vnd.apache.parquet",
                        want_data=False, owner=f"{ctx.part}/{ctx.task}", tidy=ctx.attempt > 1)
    ctx.outputs.append(names.TILE_OUTPUT_PREFIX + blob)
    ctx.cached = not made.made


def reduced(ctx: StageContext, aliases: list[str]) -> Gathered:
    """What the reduction task a zonal task over a reduction waited for (its group's, on its
    tile) made, by output name (a built-in's ``NAME.ALIAS``, an expression's ``NAME``: the
    file's name less its group and tile), dated by the group's first day."""
    found = Gathered({alias: [] for alias in aliases})
    for row in tasks.list_ranges(ctx.clients.tasks, ctx.part, tasks.ranges_of(ctx.params["deps"])):
        params = row.parameters()
        if row.status is TaskStatus.NO_DATA:
            found.missing.append(params["group"])
        elif row.status not in MADE:
            found.failed.append(f"the reduction of {params['group']}")
        for output in row.output_names() if row.status in MADE else []:
            blob = output.removeprefix(names.TILE_OUTPUT_PREFIX)
            name = ".".join(blob.rsplit("/", 1)[-1].removesuffix(".tif").split(".")[:-2])
            if name in found.tiles:
                found.tiles[name].append((date.fromisoformat(params["start"]), blob))
    return found


def _unit(path: Path) -> str:
    """A reduction output's unit, as its file says it."""
    with rasterio.open(path) as src:
        return str(src.units[0] or "")


def _partials_table(partials: Iterable[tuple[tuple[str, str, str], Partial]]) -> pa.Table:
    """Partials as a part's rows, in the order given (a part's and a merge's: by key)."""
    rows: dict[str, list[Any]] = {name: [] for name in PARTIAL.names}
    for (zone, alias, where), one in partials:
        for name, value in (("zone", zone), ("input", alias), ("key", where), ("start", one.start),
                            ("end", one.end), ("unit", one.unit), ("sum_w", one.sum_w), ("sum_wx", one.sum_wx),
                            ("sum_wxx", one.sum_wxx), ("min", one.low if one.cells else None),
                            ("max", one.high if one.cells else None), ("cells", one.cells),
                            ("values", np.concatenate(one.values).tolist() if one.values else []),
                            ("weights", np.concatenate(one.weights).tolist() if one.weights else [])):
            rows[name].append(value)
    return pa.table(rows, schema=PARTIAL)


def _read_partials(table: pa.Table) -> Iterable[tuple[tuple[str, str, str], Partial]]:
    for row in table.to_pylist():
        one = Partial(row["unit"], row["start"], row["end"], row["sum_w"], row["sum_wx"], row["sum_wxx"],
                      row["min"] if row["min"] is not None else math.inf,
                      row["max"] if row["max"] is not None else -math.inf, row["cells"],
                      [np.asarray(row["values"], np.float64)] if row["values"] else [],
                      [np.asarray(row["weights"], np.float64)] if row["weights"] else [])
        yield (row["zone"], row["input"], row["key"]), one


def _partials_in(path: Path) -> Iterator[tuple[tuple[str, str, str], Partial]]:
    """A part file's partials in its order (by key), read :data:`BATCH` rows at a time."""
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
        yield from _read_partials(pa.Table.from_batches([batch]))


def _merged(paths: list[Path]) -> Iterator[tuple[tuple[str, str, str], Partial]]:
    """The partials of part files (each sorted by key) joined per key, in key order."""
    key: tuple[str, str, str] | None = None
    joined: Partial | None = None
    for found, one in heapq.merge(*(_partials_in(p) for p in paths), key=lambda item: item[0]):
        if joined is not None and found == key:
            joined.join(one)
            continue
        if joined is not None and key is not None:
            yield key, joined
        key, joined = found, one
    if joined is not None and key is not None:
        yield key, joined


def joined(paths: list[Path], folder: Path, fan_in: int = FAN_IN) -> Iterator[tuple[tuple[str, str, str], Partial]]:
    """Every part's partials joined per (zone, input, key), in key order, in bounded memory:
    a merge of the parts (each sorted by key), at most ``fan_in`` open at once — more are
    merged first, ``fan_in`` at a time, into part files of their own in ``folder`` — so
    that memory holds a batch of rows of each open part and one key's partials, whatever
    the number of zones, dates and tiles."""
    paths, level = list(paths), 0
    while len(paths) > fan_in:
        merged = []
        for number in range(0, len(paths), fan_in):
            path = folder / f"merged-{level}-{number}.parquet"
            with pq.ParquetWriter(path, PARTIAL, compression="zstd") as out:
                batch: list[tuple[tuple[str, str, str], Partial]] = []
                for item in _merged(paths[number:number + fan_in]):
                    batch.append(item)
                    if len(batch) == BATCH:
                        out.write_table(_partials_table(batch))
                        batch = []
                out.write_table(_partials_table(batch))
            merged.append(path)
        paths, level = merged, level + 1
    return _merged(paths)


@stages.stage(ZONES_GATHER)
def zones_table(ctx: StageContext) -> None:
    """The zones' statistics joined across tiles: a row per zone, input and date or group."""
    params = ctx.params
    rows = gather.gathered(ctx)
    failed = [r.task for r in rows if r.status not in ENDED_WELL]
    if failed:
        raise StageFailure(FailureClass.DEPENDENCY_FAILED, f"{len(failed)} zonal tasks failed (first: {failed[0]})")
    blobs = [o.removeprefix(names.TILE_OUTPUT_PREFIX) for r in rows if r.status in MADE
             for o in r.output_names()]
    statistics = [name for name in params["statistics"].split(",") if name]
    percentiles = [float(p) for p in params.get("percentiles", "").split(",") if p]
    key = hashlib.sha256(json.dumps([VERSION, ZONES_GATHER, sorted(blobs), statistics, percentiles]).encode()
                         ).hexdigest()

    columns = ["zone", "input", "key", "start", "end", "unit", *statistics, *(f"p{p:g}" for p in percentiles)]
    schema = pa.schema([("zone", pa.string()), ("input", pa.string()), ("key", pa.string()), ("start", pa.date32()),
                        ("end", pa.date32()), ("unit", pa.string()), *((name, pa.float64()) for name in columns[6:])])

    def write(folder: Path) -> None:
        paths = []
        for number, blob in enumerate(blobs):
            path = folder / f"part-{number}.parquet"
            path.write_bytes(ctx.clients.transfers.download(ctx.clients.tiles, blob)[0])
            paths.append(path)
            ctx.progress((number + 1) / max(1, len(blobs)) * 0.5)
        with tables.Writer(folder / "zones.csv", folder / "zones.parquet", schema) as writer:
            out: dict[str, list[Any]] = {name: [] for name in columns}
            for (zone, alias, where), one in joined(paths, folder):
                figures = one.statistics(statistics, percentiles)
                for name, value in (("zone", zone), ("input", alias), ("key", where), ("start", one.start),
                                    ("end", one.end), ("unit", one.unit), *figures.items()):
                    out[name].append(value)
                if len(out["zone"]) == BATCH:
                    writer.write(pa.table(out, schema=schema))
                    out = {name: [] for name in columns}
            writer.write(pa.table(out, schema=schema))

    gather.publish(ctx, key, {"zones.csv": "zones.csv", "zones.parquet": "zones.parquet"}, write)
