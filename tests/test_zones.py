"""Zonal statistics end to end on real workers with granules from the local Planetary
Computer: per zone and date, each statistic equal to exactextract run by hand over a mosaic
of the job's tile files (a zone across two target tiles is one row), percentiles included;
a zone across ±180° (a MultiPolygon cut there) is one row too, equal to exactextract run on
the tile files of either side. And hostile polygons refused, naming what is wrong."""

from __future__ import annotations

import io
import json
import math
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import rasterio
import shapely
import shapely.geometry
from affine import Affine
from azure.core.exceptions import ResourceNotFoundError
from exactextract import exact_extract
from rasterio.features import geometry_mask
from rasterio.io import MemoryFile
from rasterio.merge import merge

from bagpipe.planetary import Planetary
from pipeline.lifecycle import attempts, jobs, tasks
from pipeline.lifecycle.status import TaskStatus
from pipeline.planning import RequestError
from pipeline.reduction import ZONAL_STAGE, ZONES_GATHER, zonal
from pipeline.reduction.zonal import Partial, _partials_table, joined
from pipeline.requests import application, vectors
from pipeline.requests.request import JobRequest
from pipeline.science import vectors as science_vectors
from pipeline.science.builtins import weighted_quantile as quantile
from pipeline.science.vectors import Zone
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import decided_within, on_stac, parts, running_control, running_workers, wait_for

GRID = {"tile_size": 1.0, "resolution": 0.01}


def feature(ident: str, geometry: dict[str, object]) -> dict[str, object]:
    return {"type": "Feature", "id": ident, "properties": {}, "geometry": geometry}


def box(west: float, south: float, east: float, north: float) -> list[list[list[float]]]:
    return [[[west, south], [east, south], [east, north], [west, north], [west, south]]]


ACROSS = feature("across", {"type": "Polygon", "coordinates": [[[-107.6, 35.3], [-106.4, 35.2], [-106.5, 35.7],
                                                                [-107.1, 35.9], [-107.6, 35.3]]]})
INSIDE = feature("inside", {"type": "Polygon", "coordinates": box(-107.8, 35.1, -107.65, 35.25)})
DATELINE = feature("dateline", {"type": "MultiPolygon", "coordinates": [box(179.55, 65.6, 180.0, 65.9),
                                                                        box(-180.0, 65.6, -179.6, 65.9)]})


def run(settings: Settings, body: dict[str, object]) -> tuple[Clients, str, list[tasks.TaskRow]]:
    clients = Clients(settings)
    clients.ensure_resources()
    job = application.submit(clients, JobRequest.model_validate(body)).job
    with running_control(settings), running_workers(settings, 1, slots=2):
        wait_for(lambda: jobs.get(clients, job).state.finished, 300, "the job")
    rows = tasks.list_tasks(clients.tasks, parts(clients, job))
    assert jobs.get(clients, job).state.value == "SUCCEEDED", [
        a.error for a in attempts.list_attempts(clients.tasks, parts(clients, job))][:3]
    return clients, job, rows


def table_of(clients: Clients, rows: list[tasks.TaskRow]) -> list[dict[str, object]]:
    (gather,) = [r for r in rows if r.stage == ZONES_GATHER]
    assert gather.status is TaskStatus.SUCCEEDED and gather.seq == len(rows) - 1
    (parquet,) = [o for o in gather.output_names() if o.endswith(".parquet")]
    found: list[dict[str, object]] = pq.read_table(io.BytesIO(clients.tiles.download_blob(
        parquet.removeprefix(names.TILE_OUTPUT_PREFIX)).readall())).to_pylist()
    return found


def tile_files(clients: Clients, rows: list[tasks.TaskRow]) -> dict[date, list[bytes]]:
    found: dict[date, list[bytes]] = {}
    for row in rows:
        if row.stage == "modis" and row.status in (TaskStatus.SUCCEEDED, TaskStatus.CACHED):
            for output in row.output_names():  # a batch's: each target tile's
                found.setdefault(date.fromisoformat(row.parameters()["date"]), []).append(
                    clients.tiles.download_blob(output.removeprefix(names.TILE_OUTPUT_PREFIX)).readall())
    return found


def by_hand(found: list[bytes], zone: dict[str, object]) -> dict[str, float]:
    """exactextract run by hand on each tile file: the zone's cells, values and coverage on
    every tile, and the statistics of all of them together."""
    values, weights = [], []
    for data in found:
        with MemoryFile(data) as memory:
            one = exact_extract(memory.open(), [zone], ["values", "coverage"], output="pandas")
        values.append(np.asarray(one["values"][0], float))
        weights.append(np.asarray(one["coverage"][0], float))
    x, w = np.concatenate(values), np.concatenate(weights)
    mean = float((w * x).sum() / w.sum())
    return {"mean": mean, "sum": float((w * x).sum()), "count": float(w.sum()), "min": float(x.min()),
            "max": float(x.max()), "std": math.sqrt(float((w * (x - mean) ** 2).sum() / w.sum()))}


def cells(found: list[bytes], zone: dict[str, object]) -> np.ndarray:
    """The values of a zone's cells on the tile files."""
    values = []
    for data in found:
        with MemoryFile(data) as memory:
            values.append(np.asarray(exact_extract(memory.open(), [zone], ["values"], output="pandas")["values"][0]))
    return np.concatenate(values)


def mosaic_of(found: list[bytes]) -> MemoryFile:
    datasets = [MemoryFile(data).open() for data in found]
    mosaic, transform = merge(datasets)
    profile = datasets[0].profile | {"driver": "GTiff", "height": mosaic.shape[1], "width": mosaic.shape[2],
                                     "transform": transform}
    memory = MemoryFile()
    with memory.open(**profile) as out:
        out.write(mosaic)
        out.scales = datasets[0].scales
    return memory


def test_zonal_statistics_equal_exactextract_on_the_tile_files(settings: Settings, planetary: Planetary) -> None:
    zones = {"type": "FeatureCollection", "features": [ACROSS, INSIDE]}
    body = {"zones": {"features": zones, "percentiles": [10, 50, 90]}, "start": "2022-07-01", "end": "2022-07-31",
            "products": ["MOD13A1"], "grid": GRID}
    clients, _, rows = run(on_stac(settings, planetary), body)
    zonal = [r for r in rows if r.stage == ZONAL_STAGE]
    assert sorted(r.parameters()["tile"] for r in zonal) == ["x-0107y+0035", "x-0108y+0035"], "a zonal task per tile"
    table = table_of(clients, rows)
    files = tile_files(clients, rows)
    assert sorted((r["zone"], r["key"]) for r in table) == sorted(
        (z, d.isoformat()) for z in ("across", "inside") for d in files), "one row per zone and date"
    for day, found in files.items():
        with mosaic_of(found) as memory:
            mosaic = exact_extract(memory.open(), [ACROSS, INSIDE],
                                   ["mean", "count", "quantile(q=0.1)", "quantile(q=0.5)", "quantile(q=0.9)"],
                                   output="pandas", include_cols=["id"])
        for zone in (ACROSS, INSIDE):
            (got,) = [r for r in table if r["zone"] == zone["id"] and r["key"] == day.isoformat()]
            assert got["unit"] == "NDVI" and got["start"] == got["end"] == day
            for name, value in by_hand(found, zone).items():  # the tiles' exactextract, joined: exactly
                assert got[name] == pytest.approx(value, rel=1e-12, abs=1e-12), (zone["id"], name)
            (over,) = [w for _, w in mosaic.iterrows() if w["id"] == zone["id"]]
            # over a mosaic exactextract may classify a cell otherwise than over its tile (its
            # grid's origin differs): one cell of 5,250 at most here
            assert got["count"] == pytest.approx(float(over["count"]), abs=1.0)
            assert got["mean"] == pytest.approx(float(over["mean"]), rel=1e-3)
            if zone is INSIDE:  # within one tile, on the same grid: the percentiles are exactextract's, up to
                values = np.unique(cells(found, zone))  # the order its sort leaves cells of one value in:
                for p in (10, 50, 90):  # the same two neighbouring values, interpolated between
                    ours, theirs = float(got[f"p{p}"]), float(over[f"quantile_{p}"])
                    k = int(np.searchsorted(values, min(ours, theirs), side="right")) - 1
                    assert values[k] <= min(ours, theirs) <= max(ours, theirs) <= values[min(k + 1, len(values) - 1)]


def test_a_zone_across_the_antimeridian_is_one_row_per_date(settings: Settings, planetary: Planetary) -> None:
    body = {"zones": {"features": {"type": "FeatureCollection", "features": [DATELINE]}, "statistics": ["mean",
            "count"]}, "start": "2022-07-01", "end": "2022-07-20", "products": ["MOD13A1"], "grid": GRID}
    clients, _, rows = run(on_stac(settings, planetary), body)
    assert sorted(r.parameters()["tile"] for r in rows if r.stage == ZONAL_STAGE) == ["x+0179y+0065", "x-0180y+0065"]
    table = table_of(clients, rows)
    for day, found in tile_files(clients, rows).items():
        (got,) = [r for r in table if r["key"] == day.isoformat()]
        sums = [0.0, 0.0]
        for data in found:
            with MemoryFile(data) as memory:
                one = exact_extract(memory.open(), [DATELINE], ["sum", "count"], output="pandas")
            sums = [sums[0] + float(one["sum"][0]), sums[1] + float(one["count"][0])]
        assert got["count"] == pytest.approx(sums[1]) and got["count"] > 0
        assert got["mean"] == pytest.approx(sums[0] / sums[1])


def centred(found: list[bytes], zone: dict[str, object]) -> np.ndarray:
    """The values (decoded, no data left out) of every tile file's pixels whose centre is in
    the zone, by hand: GDAL's rasterizer over each whole tile, which agrees with shapely's
    test of each pixel's centre wherever a centre is not on an edge (on one, a rounding
    decides either way)."""
    geometry = shapely.geometry.shape(zone["geometry"])  # type: ignore[arg-type]
    values = []
    for data in found:
        with MemoryFile(data) as memory, memory.open() as src:
            stored = src.read(1).astype(np.float64)
            inside = geometry_mask([geometry], out_shape=stored.shape, transform=src.transform, invert=True)
            rows, cols = np.indices(stored.shape)
            xs, ys = rasterio.transform.xy(src.transform, rows.ravel(), cols.ravel())
            centres = shapely.points(np.asarray(xs), np.asarray(ys)).reshape(stored.shape)
            off_edges = shapely.distance(geometry.boundary, centres) > 1e-9
            assert (inside == shapely.intersects(geometry, centres))[off_edges].all()
            good = inside & (src.read_masks(1) > 0)
            values.append(stored[good] * src.scales[0] + src.offsets[0])
    return np.concatenate(values)


def test_centre_weights_take_each_pixel_whose_centre_is_in_the_zone_whole(
        settings: Settings, planetary: Planetary) -> None:
    """weights centre (openEO's aggregate_spatial): the statistics of the pixels whose centre
    is in the zone, unweighted — count the pixels with data, sd the sample deviation, the
    median and percentiles numpy's (type 7) — across the tiles a zone spans."""
    zones = {"type": "FeatureCollection", "features": [ACROSS, INSIDE]}
    body = {"zones": {"features": zones, "statistics": ["mean", "count", "sd", "median", "min", "max", "sum"],
                      "percentiles": [10, 90], "weights": "centre"},
            "start": "2022-07-01", "end": "2022-07-20", "products": ["MOD13A1"], "grid": GRID}
    clients, _, rows = run(on_stac(settings, planetary), body)
    table = table_of(clients, rows)
    files = tile_files(clients, rows)
    assert len(table) == 2 * len(files) and files
    for day, found in files.items():
        for zone in (ACROSS, INSIDE):
            (got,) = [r for r in table if r["zone"] == zone["id"] and r["key"] == day.isoformat()]
            x = centred(found, zone)
            assert got["count"] == len(x) > 10, zone["id"]
            want = {"mean": x.mean(), "sd": x.std(ddof=1), "median": np.median(x), "min": x.min(), "max": x.max(),
                    "sum": x.sum(), "p10": np.percentile(x, 10), "p90": np.percentile(x, 90)}
            for name, value in want.items():
                assert got[name] == pytest.approx(float(value), rel=1e-9, abs=1e-12), (zone["id"], name)
            assert "std" not in got


def test_sd_and_median_of_unit_weights_are_numpys() -> None:
    rng = np.random.default_rng(11)
    one = Partial("NDVI", date(2022, 7, 12), date(2022, 7, 27))
    x = rng.normal(size=40)
    one.add(x[:25], np.ones(25), keep=True)
    other = Partial("NDVI", date(2022, 7, 28), date(2022, 8, 12))
    other.add(x[25:], np.ones(15), keep=True)
    one.join(other)
    found = one.statistics(["sd", "median", "count"], [5, 37.5])
    assert found["sd"] == pytest.approx(float(x.std(ddof=1))) and found["median"] == pytest.approx(float(np.median(x)))
    assert found["p5"] == pytest.approx(float(np.percentile(x, 5)))
    assert found["p37.5"] == pytest.approx(float(np.percentile(x, 37.5))) and found["count"] == 40
    single = Partial("NDVI")
    single.add(np.array([0.3]), np.ones(1), keep=True)
    assert single.statistics(["sd", "median"], []) == {"sd": None, "median": 0.3}  # no deviation of one pixel


def test_the_weighted_quantile_is_exactextracts() -> None:
    rng = np.random.default_rng(7)
    x, w = rng.normal(size=50), rng.uniform(0.01, 1, size=50)
    data = np.zeros((1, 50), np.float64)
    data[0] = x
    with MemoryFile() as memory:
        with memory.open(driver="GTiff", width=50, height=1, count=1, dtype="float64", crs="EPSG:4326",
                         transform=Affine(1, 0, 0, 0, -1, 1)) as out:
            out.write(data, 1)
        found = exact_extract(memory.open(), [feature("q", {"type": "Polygon", "coordinates": box(0, 0, 50, 1)})],
                              ["quantile(q=0.25)", "quantile(q=0.75)"], output="pandas")
    assert quantile(x, np.ones(50), 0.25) == pytest.approx(float(found["quantile_25"][0]))
    assert quantile(x, np.ones(50), 0.75) == pytest.approx(float(found["quantile_75"][0]))
    assert math.isfinite(quantile(x, w, 0.5))


def test_parts_are_joined_per_zone_in_order_whatever_their_number(tmp_path: Path) -> None:
    """The zones' gather joins parts by merging them (each sorted by key), a few at a time:
    seven parts, merged two at a time, give per key what one join of all in memory gives."""
    rng = np.random.default_rng(3)
    everything: dict[tuple[str, str, str], Partial] = {}
    paths = []
    for number in range(7):
        part: dict[tuple[str, str, str], Partial] = {}
        for zone in rng.choice(40, size=25, replace=False):
            for day in ("2022-07-12", "2022-07-28"):
                key = (f"zone-{zone:02d}", "ndvi", day)
                one = Partial("NDVI", date(2022, 7, 12), date(2022, 7, 27))
                one.add(rng.normal(size=5), rng.uniform(0.1, 1, 5), keep=True)
                part[key] = one
                mine = Partial("NDVI", date(2022, 7, 12), date(2022, 7, 27))
                mine.join(one)
                if key in everything:
                    everything[key].join(mine)
                else:
                    everything[key] = mine
        path = tmp_path / f"part-{number}.parquet"
        pq.write_table(_partials_table(sorted(part.items())), path)
        paths.append(path)
    found = list(joined(paths, tmp_path, fan_in=2))
    assert [key for key, _ in found] == sorted(everything), "one row per key, in key order"
    assert list(tmp_path.glob("merged-*")), "more parts than the fan-in were merged first"
    for key, one in found:
        want = everything[key]
        assert one.cells == want.cells and one.sum_w == pytest.approx(want.sum_w)
        assert one.statistics(["mean", "std", "min", "max", "count", "sum"], [10, 90]) == pytest.approx(
            want.statistics(["mean", "std", "min", "max", "count", "sum"], [10, 90]))


def test_a_stage_process_parses_a_zones_document_once_and_keeps_the_last_few(clients: Clients) -> None:
    """Every zonal task of a job names the same zones: a stage process (kept warm, task after
    task) reads and parses them once, and keeps the last ``KEPT_ZONES`` documents, not every
    one it has seen. Seen by the kept blob's removal: a document kept is not read again, one
    dropped is."""
    digests = [application.store_vector(clients, science_vectors.zones_document(
        [Zone(f"z{n}", shapely.box(n, 0, n + 1, 1)), Zone(f"y{n}", shapely.box(n, 5, n + 1, 6))]))
        for n in range(zonal.KEPT_ZONES + 1)]
    first = zonal.zone_index(clients, digests[0])
    clients.tiles.delete_blob(names.vector_blob(digests[0]))
    assert zonal.zone_index(clients, digests[0]) is first, "parsed once, not read again"
    assert [z.id for z in first.meeting(shapely.box(0.5, 0.5, 0.6, 5.5))] == ["z0", "y0"], "in the document's order"
    assert [z.id for z in first.meeting(shapely.box(0.5, 2, 0.6, 3))] == []
    for digest in digests[1:]:
        zonal.zone_index(clients, digest)
    with pytest.raises(ResourceNotFoundError):  # dropped for the later ones: read again, and gone
        zonal.zone_index(clients, digests[0])


def polygon_of(points: int) -> dict[str, object]:
    ring = [[math.cos(a) * 0.5 - 107, math.sin(a) * 0.5 + 35] for a in np.linspace(0, 2 * math.pi, points)]
    ring[-1] = ring[0]
    return {"type": "Polygon", "coordinates": [ring]}


@pytest.mark.parametrize("geometry,status,words", [
    ({"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]}, 422, "Self-intersection"),
    ({"type": "LineString", "coordinates": [[0, 0], [1, 1]]}, 422, "not a polygon"),
    ("POLYGON((0 0, 1 0, 1 1, 0 0))", 422, "not a GeoJSON geometry"),
    ({"type": "Polygon", "coordinates": [[[0, 0], [400, 0], [1, 1], [0, 0]]]}, 422, "off the globe"),
    ({"type": "Polygon", "coordinates": box(-170, -80, 170, 80)}, 413, "km²"),
])
def test_hostile_polygons_are_refused_naming_the_field(geometry: object, status: int, words: str) -> None:
    with pytest.raises(RequestError) as refused:
        vectors.parse_polygon(geometry, "region.geometry")
    assert refused.value.field == "region.geometry" and refused.value.status == status
    assert words in refused.value.message


def test_a_million_vertices_are_refused_in_milliseconds() -> None:
    geometry = json.loads(json.dumps(polygon_of(1_000_001)))
    with decided_within(0.2), pytest.raises(RequestError) as refused:
        vectors.parse_polygon(geometry, "region.geometry")
    assert refused.value.status == 413 and "vertices" in refused.value.message


def test_zones_over_a_reduction_are_the_statistics_of_its_outputs_per_group(
        settings: Settings, planetary: Planetary) -> None:
    """zones.over reduction: per zone and month the statistics of the pixels of the month's
    mean (each pixel's mean of its dates with data), not of the month's pixels and dates
    pooled; each zonal task waits for its group's reduction task on its tile."""
    zones = {"type": "FeatureCollection", "features": [ACROSS, INSIDE]}
    body = {"zones": {"features": zones, "statistics": ["mean", "count"], "weights": "centre", "over": "reduction"},
            "start": "2022-07-01", "end": "2022-08-31", "products": ["MOD13A1"], "grid": GRID,
            "reduce": {"by": "month", "reducer": "mean"}}
    planned = application.plan(settings, vectors.kept(JobRequest.model_validate(body), vectors.digest_only,
                                                      lambda ref: {}))
    reductions = {seq for seq, p in enumerate(planned) if p.stage == "aggregate"}
    for plan in planned:
        if plan.stage == ZONAL_STAGE:
            assert plan.waits_for == 1 and plan.params["per"] == "group"
            (first, count), = (map(int, r.split(",")) for r in plan.params["deps"].split(";"))
            assert count == 1 and first in reductions
            assert planned[first].params["group"] == plan.params["group"]
            assert planned[first].params["tile"] == plan.params["tile"]
    clients, _, rows = run(on_stac(settings, planetary), body)
    table = table_of(clients, rows)
    reduced: dict[str, list[bytes]] = {}
    for row in rows:
        if row.stage == "aggregate" and row.status in (TaskStatus.SUCCEEDED, TaskStatus.CACHED):
            (output,) = row.output_names()
            reduced.setdefault(row.parameters()["group"], []).append(
                clients.tiles.download_blob(output.removeprefix(names.TILE_OUTPUT_PREFIX)).readall())
    assert sorted(reduced) == ["2022-07", "2022-08"] and all(len(found) == 2 for found in reduced.values())
    assert sorted((r["zone"], r["key"]) for r in table) == sorted(
        (z, g) for z in ("across", "inside") for g in reduced)
    for group, found in reduced.items():
        for zone in (ACROSS, INSIDE):
            (got,) = [r for r in table if r["zone"] == zone["id"] and r["key"] == group]
            x = centred(found, zone)
            assert got["input"] == "mean.MOD13A1.500m_16_days_NDVI" and got["unit"] == "NDVI"
            assert got["count"] == len(x) > 10 and got["mean"] == pytest.approx(float(x.mean()), rel=1e-9)


@pytest.mark.parametrize(("change", "field"), [
    ({"reduce": None}, "zones.over"),  # no reduction to read
    ({"products": ["MOD10A2"], "reduce": {"by": "month", "program": {"name": "snow_fraction"}}},
     "zones.over"),  # a program's files
    ({"zones_by": "month"}, "zones.by"),  # the reduction's groups are the zones'
    ({"zones_inputs": ["MOD13A1.500m_16_days_NDVI"]}, "zones.inputs"),  # its outputs are
])
def test_zones_over_a_reduction_need_a_built_in_or_an_expression_and_take_its_groups(
        settings: Settings, change: dict[str, object], field: str) -> None:
    zones: dict[str, object] = {"features": {"type": "FeatureCollection", "features": [INSIDE]}, "over": "reduction"}
    body: dict[str, object] = {"zones": zones, "start": "2022-07-01", "end": "2022-08-31", "products": ["MOD13A1"],
                               "grid": GRID, "reduce": {"by": "month", "reducer": "mean"}}
    for key, value in change.items():
        if key.startswith("zones_"):
            zones[key.removeprefix("zones_")] = value
        elif value is None:
            del body[key]
        else:
            body[key] = value
    request = vectors.kept(JobRequest.model_validate(body), vectors.digest_only, lambda ref: {})
    with pytest.raises(RequestError) as refused:
        application.plan(settings, request)
    assert refused.value.field == field, refused.value.message
