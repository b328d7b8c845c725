"""Sites, end to end on real workers with granules from the local Planetary Computer: each
site's series equals the pixel values read from the product's own files (where the catalog
found them), its quality decoded, its window's mean; a site over the ocean is a row that
says no data; the table is one CSV and one GeoParquet file, and an identical request finds
it made. A point task reads the blocks holding its sites, a fraction of the granule's bytes,
and a granule the catalog lists but storage has not fails it as a missing source. And the
sites a scientist gives, refused naming what is wrong."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator
from datetime import date

import geopandas
import numpy as np
import pyarrow.parquet as pq
import pytest
import rasterio
from fastapi.testclient import TestClient
from pyproj import Transformer

from bagpipe import modis_world
from bagpipe.planetary import Planetary
from pipeline.failures import FailureClass
from pipeline.lifecycle import attempts, jobs, tasks
from pipeline.lifecycle.status import TaskStatus
from pipeline.modis import POINT_STAGE, collection, grid
from pipeline.modis.access import Access
from pipeline.modis.granules import from_param
from pipeline.modis.products import CATALOG
from pipeline.modis.targets import SINUSOIDAL_PROJ4
from pipeline.planning import RequestError
from pipeline.reduction import SITES_GATHER
from pipeline.requests import application, vectors
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web.api import create_app
from tests.conftest import make_user, on_stac, parts, running_control, running_workers, signed, wait_for

NDVI = "500m_16_days_NDVI"
QA = "500m_16_days_pixel_reliability"
SITES = [{"id": "tower-1", "lon": -107.6, "lat": 35.5}, {"id": "tower-2", "lon": -106.25, "lat": 34.05},
         {"id": "edge", "lon": -103.9, "lat": 39.97}]


def ocean_site() -> dict[str, object]:
    """A point in a MODIS tile with no land (the catalog has no granule of it, ever)."""
    lon, lat = -150.0, 2.0
    assert grid.locate(lon, lat, 2400)[0].name not in modis_world.land_tiles()
    return {"id": "buoy", "lon": lon, "lat": lat}


def run(settings: Settings, body: dict[str, object]) -> tuple[Clients, str]:
    clients = Clients(settings)
    clients.ensure_resources()
    job = application.submit(clients, JobRequest.model_validate(body)).job
    with running_control(settings), running_workers(settings, 1, slots=2):
        wait_for(lambda: jobs.get(clients, job).state.finished, 300, "the job")
    return clients, job


def pixel(path: bytes, lon: float, lat: float) -> tuple[int, int, int]:
    """The stored value at a lon/lat point of a sinusoidal COG, found independently of
    bagpipe's grid code (PROJ and rasterio's index), and its row and column."""
    x, y = Transformer.from_crs("EPSG:4326", SINUSOIDAL_PROJ4, always_xy=True).transform(lon, lat)
    with rasterio.open(io.BytesIO(path)) as src:
        row, col = src.index(x, y)
        return int(src.read(1, window=((row, row + 1), (col, col + 1)))[0, 0]), row, col


def window(path: bytes, row: int, col: int) -> np.ndarray:
    with rasterio.open(io.BytesIO(path)) as src:
        return np.asarray(src.read(1, window=((row - 1, row + 2), (col - 1, col + 2))))


@pytest.mark.timeout(900)  # three jobs of full-size granules (the first synthesizes and collects them), a preview
def test_a_sites_series_equals_the_pixels_of_the_products_own_files(settings: Settings, planetary: Planetary,
                                                                    admin_token: str) -> None:
    body = {"sites": {"points": [*SITES, ocean_site()], "window": 3}, "start": "2022-01-01", "end": "2022-02-28",
            "products": ["MOD13A1"]}
    mine = on_stac(settings, planetary)
    clients, job = run(mine, body)
    row = jobs.get(clients, job)
    rows = tasks.list_tasks(clients.tasks, parts(clients, job))
    assert row.state.value == "SUCCEEDED", [a.error for a in attempts.list_attempts(clients.tasks, parts(clients, job))]
    points = [r for r in rows if r.stage == POINT_STAGE]
    assert sorted({r.parameters()["tile"] for r in points}) == sorted({
        grid.locate(s["lon"], s["lat"], 2400)[0].name for s in [*SITES, ocean_site()]})  # type: ignore[arg-type]
    assert len(points) == 4 * 3, "a point task per (MODIS tile, date): 3 tiles × 4 composites"
    (gather,) = [r for r in rows if r.stage == SITES_GATHER]
    assert gather.status is TaskStatus.SUCCEEDED and gather.seq == len(rows) - 1
    outputs = {o.rsplit("/", 1)[-1]: o.removeprefix(names.TILE_OUTPUT_PREFIX) for o in gather.output_names()}
    assert sorted(outputs) == ["sites.csv", "sites.parquet"]
    data = clients.tiles.download_blob(outputs["sites.parquet"]).readall()
    table = pq.read_table(io.BytesIO(data)).to_pylist()
    assert len(table) == 4 * 4, "a row per site and date"
    assert pq.read_schema(io.BytesIO(data)).metadata[b"geo"], "GeoParquet"
    frame = geopandas.read_parquet(io.BytesIO(data))
    assert frame.crs.to_string() == "OGC:CRS84" and len(frame) == 16
    assert np.allclose(frame.geometry.x, [r["lon"] for r in table])
    csv = clients.tiles.download_blob(outputs["sites.csv"]).readall().decode()
    assert csv.splitlines()[0].startswith('"site","lon","lat"') and len(csv.splitlines()) == 17
    layer = CATALOG["MOD13A1"].layer(NDVI)
    archive = Access(planetary.sas_url, "", "")  # the product's own files, where the catalog found them
    checked = 0
    for task in points:
        params = task.parameters()
        granules = from_param(params["granules"])
        day = date.fromisoformat(params["date"])
        mine_rows = [r for r in table if r["tile"] == params["tile"] and r["date"] == day]
        if not granules:  # the ocean's tile: no granule, rows of no data
            assert [r["site"] for r in mine_rows] == ["buoy"] and mine_rows[0]["status"] == "no data"
            assert mine_rows[0]["value"] is None
            continue
        (granule,) = granules
        ndvi, qa = archive.fetch(granule.href(NDVI)).data, archive.fetch(granule.href(QA)).data
        for found in mine_rows:
            stored, r, c = pixel(ndvi, found["lon"], found["lat"])
            code, _, _ = pixel(qa, found["lon"], found["lat"])
            assert (found["row"], found["col"]) == (r, c)
            valid = layer.valid[0] <= stored <= layer.valid[1] and stored != layer.nodata
            if valid:
                assert found["value"] == pytest.approx(stored * layer.scale)
            else:
                assert found["value"] is None and found["status"] == "no data"
            assert found["quality"] == code and found["unit"] == "NDVI"
            assert found["usable"] == (valid and code in (0, 1))
            assert "rank=" in found["quality_flags"]
            values, codes = window(ndvi, r, c), window(qa, r, c)
            good = (values >= layer.valid[0]) & (values <= layer.valid[1]) & (values != layer.nodata) & (codes <= 1)
            if good.any():
                assert found["window_mean"] == pytest.approx(float(values[good].mean()) * layer.scale)
            assert found["window_count"] == int(good.sum())
            checked += 1
    assert checked == 3 * 4

    # the job page's preview of the table: its first rows, its ids, a site's series as the table has it
    with TestClient(create_app(mine), headers=signed(admin_token)) as api:
        answer = api.get(f"/api/jobs/{job}/tables/sites", params={"rows": 5, "id": "tower-2"})
        assert answer.status_code == 200, answer.text
        seen = answer.json()
        columns = [c for c in table[0] if c != "geometry"]  # a point's WKB: lon and lat are columns
        plain = [[r[c].isoformat() if isinstance(r[c], date) else r[c] for c in columns] for r in table[:5]]
        assert seen["total"] == 16 and seen["columns"] == columns and seen["rows"] == plain
        assert seen["ids"] == list(dict.fromkeys(r["site"] for r in table)) and seen["id"] == "tower-2"
        (series,) = seen["series"]
        tower = sorted((r["date"].isoformat(), r["value"]) for r in table if r["site"] == "tower-2")
        assert series["name"] == NDVI and series["unit"] == "NDVI" and [tuple(p) for p in series["points"]] == tower
        assert api.get(f"/api/jobs/{job}/tables/sites").json()["id"] == table[0]["site"], "the first site's"
        assert api.get(f"/api/jobs/{job}/tables/zones").status_code == 404, "a job of sites made no zones table"
        assert api.get(f"/api/jobs/{job}/tables/sites", params={"rows": 0}).status_code == 422
        other = make_user(clients, "other")
        assert api.get(f"/api/jobs/{job}/tables/sites", headers=signed(other)).status_code == 404, "not theirs"

    again = application.submit(clients, JobRequest.model_validate(body)).job
    with running_control(mine), running_workers(mine, 1, slots=2):
        wait_for(lambda: jobs.get(clients, again).state.finished, 300, "the second job")
    (second,) = [r for r in tasks.list_tasks(clients.tasks, parts(clients, again)) if r.stage == SITES_GATHER]
    assert second.status is TaskStatus.CACHED and second.output_names() == gather.output_names()

    # asked as openEO's time series too: a value per layer (NDVI, then the derived one) per site in the
    # order given, per date, none where the table has no value
    derived = {"derive": {"MOD13A1": {"half": f"MOD13A1.{NDVI} / 2"}}, "layers": {"MOD13A1": [NDVI]}}
    series = application.submit(clients, JobRequest.model_validate(body | derived | {"output": {"format": "json"}})).job
    with running_control(mine), running_workers(mine, 1, slots=2):
        wait_for(lambda: jobs.get(clients, series).state.finished, 300, "the job of a time series")
    (third,) = [r for r in tasks.list_tasks(clients.tasks, parts(clients, series)) if r.stage == SITES_GATHER]
    made = {o.rsplit("/", 1)[-1]: o.removeprefix(names.TILE_OUTPUT_PREFIX) for o in third.output_names()}
    assert third.status is TaskStatus.SUCCEEDED and sorted(made) == ["sites.csv", "sites.json", "sites.parquet"]
    assert third.parameters()["series"] == f"MOD13A1.{NDVI},MOD13A1.half"
    timeseries = json.loads(clients.tiles.download_blob(made["sites.json"]).readall())
    rows = pq.read_table(io.BytesIO(clients.tiles.download_blob(made["sites.parquet"]).readall())).to_pylist()
    assert list(timeseries) == sorted({f"{r['date'].isoformat()}T00:00:00Z" for r in rows}) and len(timeseries) == 4
    order = [s["id"] for s in [*SITES, ocean_site()]]
    for when, per_site in timeseries.items():
        assert len(per_site) == len(order)
        for site, values in zip(order, per_site, strict=True):
            expected = {r["layer"]: r["value"] for r in rows
                        if r["site"] == site and r["date"].isoformat() == when[:10]}
            assert values == [expected[NDVI], expected["half"]], (site, when)
            if values[0] is not None:
                assert values[1] == pytest.approx(values[0] / 2)
    assert [v for per_site in timeseries.values() for v in per_site[order.index("buoy")]] == [None] * 8
    assert any(v is not None for per_site in timeseries.values() for v in per_site[0])


@pytest.mark.timeout(600)  # two jobs of one granule, its two files synthesized (about 20 s each) by the first
def test_a_point_task_reads_the_blocks_holding_its_sites_not_the_whole_granule(settings: Settings,
                                                                              planetary: Planetary) -> None:
    """Counted where the files are served (the imitation's storage), not timed: the two sites'
    blocks of each of the granule's two files, their header, a fraction of the file; nothing
    cached in ``sources``. The same granule withheld from storage (listed, not there): the
    task fails, classified a missing source, not retried as if busy."""
    body = {"sites": {"points": SITES[:2]}, "start": "2021-03-06", "end": "2021-03-21", "products": ["MOD13A1"]}
    mine = on_stac(settings, planetary)
    before = planetary.bytes_read.copy()
    clients, job = run(mine, body)
    assert jobs.get(clients, job).state.value == "SUCCEEDED", [
        a.error for a in attempts.list_attempts(clients.tasks, parts(clients, job))]
    (point,) = [r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.stage == POINT_STAGE]
    (granule,) = from_param(point.parameters()["granules"])
    for layer in (NDVI, QA):
        path = granule.href(layer).split("/", 4)[-1]  # {container}/{blob} in the imitation's account
        container, blob = path.split("/", 1)
        size = planetary.blobs.get_blob_client(container, blob).get_blob_properties().size
        read = planetary.bytes_read[path] - before[path]
        assert 0 < read < size / 4, (layer, read, size)
        assert not clients.sources.get_blob_client(
            collection.source_blob(CATALOG["MOD13A1"], granule, layer)).exists(), "not fetched into the cache"

    planetary.withheld.add(granule.id.split(".h")[0])  # MOD13A1.A2021065: listed, not in storage
    try:
        clients, job = run(mine, body | {"sites": {"points": SITES[:1]}})  # another task: not the cached part
    finally:
        planetary.withheld.clear()
    assert jobs.get(clients, job).state.value == "FAILED"
    (point,) = [r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.stage == POINT_STAGE]
    found = [a for a in attempts.list_attempts(clients.tasks, parts(clients, job)) if a.task == point.task]
    assert found and {a.failure_class for a in found} == {FailureClass.SOURCE_DOWNLOAD.value}, found
    assert "the archive has no" in found[-1].error and "sig=" not in found[-1].error


@pytest.mark.parametrize("points,field,words", [
    ("id,lon,lat\na,-107.5,35\nb,west,35\n", "sites.points line 3, column lon", "'west' is not a number"),
    ("id,lat\na,35\n", "sites.points", "no lon column"),
    ([{"id": "a", "lon": 200, "lat": 0}], "sites.points[0].lon", "not within"),
    ([{"id": "a", "lon": 1, "lat": 0}, {"id": "a", "lon": 2, "lat": 0}], "sites.points", "given twice"),
    ([{"id": "a", "lon": True, "lat": 0}], "sites.points[0].lon", "not true or false"),
    ({"type": "FeatureCollection", "features": [{"type": "Feature", "geometry": {"type": "Polygon"}}]},
     "sites.points[0]", "a Point feature"),
    ([], "sites.points", "no site"),
])
def test_sites_refused_naming_what_is_wrong(points: object, field: str, words: str) -> None:
    with pytest.raises(RequestError) as refused:
        vectors.sites_of(points)
    assert refused.value.field == field and words in refused.value.message
    assert 400 <= refused.value.status < 500


def test_sites_from_csv_json_and_geojson_are_the_same_document() -> None:
    csv = "site,longitude,latitude\n" + "".join(f"{s['id']},{s['lon']},{s['lat']}\n" for s in SITES)
    geojson = {"type": "FeatureCollection", "features": [
        {"type": "Feature", "id": s["id"], "geometry": {"type": "Point", "coordinates": [s["lon"], s["lat"]]},
         "properties": {}} for s in SITES]}
    found = {json.dumps([(s.id, s.lon, s.lat) for s in vectors.sites_of(form)]) for form in (SITES, csv, geojson)}
    assert len(found) == 1
    summary = vectors.summarize_sites(vectors.sites_of(SITES))
    assert summary["count"] == 3 and sum(summary["tiles"].values()) == 3
    assert all(math.isfinite(b) for b in summary["bbox"])


@pytest.fixture
def api(settings: Settings, clients: Clients, admin_token: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings), headers=signed(admin_token)) as client:
        yield client


def test_the_api_keeps_sites_once_and_a_request_names_them_or_carries_them(api: TestClient, clients: Clients) -> None:
    csv = "id,lon,lat\n" + "".join(f"s{i},{-107 + i / 1000},{35 + i / 1000}\n" for i in range(2000))
    kept = api.post("/api/vectors", json={"kind": "sites", "data": csv})
    assert kept.status_code == 201, kept.text
    ref = kept.json()["ref"]
    assert kept.json()["count"] == 2000 and api.post("/api/vectors", json={"kind": "sites", "data": csv}).json()[
        "ref"] == ref, "the same points are the same document"
    body = {"sites": {"kept": {"ref": ref}}, "start": "2022-01-01", "end": "2022-01-31", "products": ["MOD13A1"]}
    estimate = api.post("/api/estimate", json=body)
    assert estimate.status_code == 200 and estimate.json()["tasks"] == 2 + 1, estimate.text  # 2 dates, a gather
    created = api.post("/api/jobs", json=body)
    assert created.status_code == 202, created.text
    stored = json.loads(jobs.get(clients, created.json()["job"]).request)
    assert stored["sites"]["kept"]["ref"] == ref and stored["sites"]["kept"]["count"] == 2000
    assert stored["sites"]["points"] is None and len(json.dumps(stored)) < 2000, "the job row holds no point"
    inline = api.post("/api/jobs", json=body | {"sites": {"points": SITES}})  # a request that carries them
    assert inline.status_code == 202, inline.text


@pytest.mark.parametrize("body,status,field", [
    ({"sites": {"points": "id,lon,lat\na,abc,3\n"}}, 422, "sites.points line 2, column lon"),
    ({"sites": {"kept": {"ref": "0" * 64}}}, 400, "sites.kept.ref"),
    ({"sites": {"points": SITES}, "region": {"bbox": [0, 0, 1, 1]}}, 422, "region"),
    ({"sites": {"points": SITES}, "output": {"format": "netcdf"}}, 422, "output.format"),
    ({"region": {"bbox": [-108, 35, -107, 36]}, "output": {"format": "json"}}, 422, "output.format"),
    ({"region": {"geometry": {"type": "Polygon", "coordinates": [[[0, 0], [1, 1], [1, 0], [0, 1], [0, 0]]]}}},
     422, "region.geometry"),
    ({"region": {"geometry": "not GeoJSON"}}, 422, "region.geometry"),
    ({"zones": {"features": {"type": "FeatureCollection", "features": [{"type": "Feature", "geometry": {
        "type": "Point", "coordinates": [0, 0]}, "properties": {"id": "a"}}]}}}, 422, "zones.features[0].geometry"),
])
def test_hostile_vectors_are_refused_naming_the_field(api: TestClient, clients: Clients, body: dict[str, object],
                                                      status: int, field: str) -> None:
    request = {"start": "2022-01-01", "end": "2022-01-31", "products": ["MOD13A1"]} | body
    answer = api.post("/api/jobs", json=request)
    assert answer.status_code == status and answer.json()["field"] == field, answer.text
    assert not list(clients.jobs.list_entities())
