"""The official openEO Python client, end to end against the local stack (the API under
uvicorn, the control loop, real workers, the local Planetary Computer): connect, sign in with
basic authentication, list collections and processes, build a graph — MOD13A1 NDVI over a box
and a year, its maximum per month, saved as GeoTIFF —, create, start, poll, download, and find
the same pixels as the native API's products for the same request. Then a job that fails in
part offers what it made (partial results) and its failures (logs), and a restart runs only
what did not succeed. The same maximum saved as netCDF is one cube xarray opens, equal to the
native API's GeoTIFFs; a month's mean NDVI over two fields (aggregate_spatial), saved as CSV
and as Parquet, is the native API's zones table for the same request, and so is the fields'
mean of each pixel's monthly mean, equal to the mean of the native API's monthly GeoTIFFs
over each field's pixels."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openeo
import pandas
import pytest
import rasterio
import shapely.geometry
import xarray
from openeo.rest.conversions import timeseries_json_to_pandas
from rasterio.features import geometry_mask
from rasterio.io import MemoryFile

from bagpipe.azurite import Azurite
from bagpipe.client import Api
from bagpipe.stack import LocalStack
from pipeline.lifecycle import jobs, results
from pipeline.storage.clients import clients_for
from pipeline.web.openeo import store
from tests.conftest import wait_for

BOX = {"west": -108.0, "south": 35.2, "east": -107.5, "north": 35.8}  # one 1° target tile inside h09v05
SPAN = ["2022-01-01", "2023-01-01"]  # openEO's end is exclusive: the year 2022
NATIVE = {"region": {"bbox": [-108.0, 35.2, -107.5, 35.8]}, "start": "2022-01-01", "end": "2022-12-31",
          "products": ["MOD13A1"], "layers": {"MOD13A1": ["500m_16_days_NDVI"]},
          "reduce": {"by": "month", "reducer": "max"}}


@pytest.fixture(scope="module")
def stack(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("openeo")
    with LocalStack(tmp / "stack", workers=1, slots=2, connection=azurite.connection_string,
                    namespace=f"oeo{tmp.name[-6:].replace('_', '')}") as running:
        yield running


def connected(stack: LocalStack) -> openeo.Connection:
    connection = openeo.connect(f"{stack.api_url}/openeo/1.2")
    connection.authenticate_basic("admin", stack.token)
    return connection


def monthly_max(connection: openeo.Connection) -> Any:
    cube = connection.load_collection("MOD13A1", spatial_extent=BOX, temporal_extent=SPAN,
                                      bands=["500m_16_days_NDVI"])
    return cube.aggregate_temporal_period("month", "max").save_result(format="GTiff")


def native_job(stack: LocalStack, request: dict[str, Any]) -> dict[str, Any]:
    """The manifest, with its links, of the native API's job of ``request``, run to its end."""
    api = Api(stack.api_url, stack.token)
    native = api.submit(request)["job"]
    wait_for(lambda: api.status(native)["state"] in ("SUCCEEDED", "FAILED"), 300, "the native job")
    clients = clients_for(stack.settings)
    return results.with_links(clients, native, results.manifest(clients, native) or {})


def native_table(manifest: dict[str, Any], stage: str) -> pandas.DataFrame:
    """The table a native job's gather (``stage``) made, read from its Parquet file's link."""
    (gather,) = [t for t in manifest["tasks"] if t["stage"] == stage]
    (link,) = [link for blob, link in gather["links"].items() if blob.endswith(".parquet")]
    return pandas.read_parquet(io.BytesIO(httpx.get(link).content))


def pixels_by_month(folder: Path) -> dict[str, np.ndarray]:
    found = {}
    for path in sorted(folder.rglob("*.tif")):
        with rasterio.open(path) as src:
            found[path.name] = src.read(1)
    return found


@pytest.mark.timeout(2400)
def test_the_client_runs_a_monthly_maximum_and_finds_the_native_apis_pixels(
        stack: LocalStack, tmp_path: Path) -> None:
    connection = connected(stack)
    assert connection.describe_account()["user_id"] == "admin"
    assert "MOD13A1" in connection.list_collection_ids()
    assert {"load_collection", "aggregate_temporal_period", "save_result", "max"} <= {
        p["id"] for p in connection.list_processes()}
    job = monthly_max(connection).create_job(title="NDVI monthly max")
    assert job.status() == "created"
    job.start_and_wait(max_poll_interval=2, print=lambda *_: None)
    assert job.status() == "finished"
    described = job.describe()
    assert described["progress"] == 100 and described["started"] and described["costs"] is not None
    got = job.get_results()
    assets = got.get_metadata()["assets"]
    assert len(assets) == 12 and all("sig=" in a["href"] for a in assets.values())  # signed links, a month each
    got.download_files(tmp_path / "openeo")
    made = pixels_by_month(tmp_path / "openeo")
    assert sorted(made) == sorted(assets)

    manifest = native_job(stack, NATIVE)
    theirs = tmp_path / "native"
    theirs.mkdir()
    for task in manifest["tasks"]:
        if task["stage"] == "aggregate":
            for blob, link in task["links"].items():
                (theirs / blob.rsplit("/", 1)[-1].replace("+", "")).write_bytes(httpx.get(link).content)
    expected = pixels_by_month(theirs)
    assert sorted(expected) == sorted(made)
    for name, values in made.items():
        assert np.array_equal(values, expected[name]), name
    assert any((v != -3000).any() for v in made.values())  # not all no-data


def test_a_graph_bagpipe_cannot_run_is_refused_by_the_client_naming_the_process(stack: LocalStack) -> None:
    connection = connected(stack)
    cube = connection.load_collection("MOD13A1", spatial_extent=BOX, temporal_extent=SPAN,
                                      bands=["500m_16_days_NDVI"])
    with pytest.raises(openeo.rest.OpenEoApiError) as refused:
        cube.resample_spatial(resolution=0.1).save_result("GTiff").create_job()
    assert refused.value.code == "ProcessUnsupported" and "resample_spatial" in refused.value.message


@pytest.mark.timeout(2400)
def test_a_job_failing_in_part_offers_what_it_made_and_a_restart_runs_only_the_rest(stack: LocalStack) -> None:
    connection = connected(stack)
    cube = connection.load_collection("MCD43A4", spatial_extent=BOX, temporal_extent=["2022-03-01", "2022-03-05"],
                                      bands=["red", "nir"])
    job = cube.ndvi().save_result("GTiff").create_job(title="NDVI per day")
    stack.planetary.withheld.add("MCD43A4.A2022062")  # 3 March's granule: listed, not in storage
    try:
        job.start_job()
        wait_for(lambda: job.status() in ("finished", "error"), 600, "the job")
    finally:
        stack.planetary.withheld.clear()
    assert job.status() == "error"
    errors = job.logs(level="error")
    assert errors and any("source_download_failed" in entry.message for entry in errors), errors
    assert all(entry.level == "error" for entry in errors)
    with pytest.raises(openeo.rest.OpenEoApiError) as unfinished:
        job.get_results().get_metadata()
    assert unfinished.value.code == "JobNotFinished"
    partial = connection.get(f"/jobs/{job.job_id}/results", params={"partial": "true"}).json()
    assert partial["openeo:status"] == "error"
    assert sorted(key.split(".")[2] for key in partial["assets"]) == ["2022-03-01", "2022-03-02", "2022-03-04"]
    job.start_job()  # again: only 3 March runs, the three made are settled from the cache
    wait_for(lambda: job.status() in ("finished", "error"), 600, "the restart")
    assert job.status() == "finished"
    record = store.get(clients_for(stack.settings), "admin", job.job_id)
    assert record is not None and len(record.run_ids) == 2
    counts = jobs.status(clients_for(stack.settings), record.latest)["counts"]
    assert counts["CACHED"] == 3 and counts["SUCCEEDED"] == 1, counts
    assert len(job.get_results().get_metadata()["assets"]) == 4


def decoded(data: bytes) -> tuple[np.ndarray, Any]:
    """A COG's first band in physical units (no data as NaN), and its transform."""
    with MemoryFile(data) as memory, memory.open() as src:
        values = src.read(1).astype("float64")
        values[src.read_masks(1) == 0] = np.nan
        return values * src.scales[0] + src.offsets[0], src.transform


@pytest.mark.timeout(2400)
def test_a_netcdf_cube_of_the_monthly_maximum_opens_with_xarray_equal_to_the_native_apis_tiles(
        stack: LocalStack, tmp_path: Path) -> None:
    connection = connected(stack)
    cube = connection.load_collection("MOD13A1", spatial_extent=BOX, temporal_extent=SPAN,
                                      bands=["500m_16_days_NDVI"])
    job = cube.aggregate_temporal_period("month", "max").save_result(format="netCDF").create_job(title="NDVI cube")
    job.start_and_wait(max_poll_interval=2, print=lambda *_: None)
    assert job.status() == "finished"
    got = job.get_results()
    assets = got.get_metadata()["assets"]
    # every cube the job made: the monthly maximum's, and the NDVI's it reads, each netCDF, served as such
    assert sorted(assets) == ["MOD13A1.500m_16_days_NDVI.nc", "max.nc"], assets
    assert all(a["type"] == "application/netcdf" and httpx.get(a["href"]).headers["content-type"] == a["type"]
               for a in assets.values()), assets
    got.download_files(tmp_path / "openeo")
    manifest = native_job(stack, NATIVE)  # the same request's GeoTIFFs (made already: from the cache)
    tiles = {task["group"]: httpx.get(link).content for task in manifest["tasks"] if task["stage"] == "aggregate"
             for link in task["links"].values()}
    assert len(tiles) == 12
    with xarray.open_dataset(tmp_path / "openeo" / "max.nc", engine="h5netcdf") as opened:
        (name,) = [v for v in opened.data_vars if v != "spatial_ref"]
        variable = opened[name]
        assert variable.dims == ("time", "y", "x") and opened["spatial_ref"].attrs["grid_mapping_name"] == (
            "latitude_longitude")
        assert [str(t)[:7] for t in opened["time"].values] == sorted(tiles)  # a month each, 2022-01 to 2022-12
        for group, data in tiles.items():
            values, transform = decoded(data)
            x, y = opened["x"].values, opened["y"].values
            col = int(np.argmin(np.abs(x - (transform.c + transform.a / 2))))
            top = int(np.argmin(np.abs(y - (transform.f + transform.e / 2))))
            part = variable.sel(time=np.datetime64(f"{group}-01")).values[
                top:top + values.shape[0], col:col + values.shape[1]]
            assert np.array_equal(np.isnan(part), np.isnan(values)), group
            assert np.allclose(part[np.isfinite(part)], values[np.isfinite(values)], rtol=0, atol=1e-6), group
            assert np.isfinite(values).any(), group


FIELDS = {"type": "FeatureCollection", "features": [
    {"type": "Feature", "id": "north", "properties": {}, "geometry": {"type": "Polygon", "coordinates": [
        [[-107.9, 35.3], [-107.6, 35.3], [-107.7, 35.7], [-107.9, 35.3]]]}},
    {"type": "Feature", "id": "south", "properties": {}, "geometry": {"type": "Polygon", "coordinates": [
        [[-107.9, 35.2], [-107.7, 35.2], [-107.7, 35.25], [-107.9, 35.25], [-107.9, 35.2]]]}}]}
NATIVE_ZONES = {"region": {"bbox": [-108.0, 35.2, -107.5, 35.8]}, "start": "2022-07-01", "end": "2022-07-31",
                "products": ["MOD13A1"], "layers": {"MOD13A1": ["500m_16_days_NDVI"]},
                "zones": {"features": FIELDS, "statistics": ["mean"], "weights": "centre"}}


@pytest.mark.timeout(2400)
def test_aggregate_spatial_saves_the_native_apis_zones_table_as_csv_and_parquet(
        stack: LocalStack, tmp_path: Path) -> None:
    """A month's NDVI, its mean over two fields per date, as openEO's aggregate_spatial: the
    job's one asset is the zones' table, equal row for row to the native API's for the same
    request, each mean that of the pixels whose centre is in the field on the date's tile."""
    connection = connected(stack)
    cube = connection.load_collection("MOD13A1", spatial_extent=BOX, temporal_extent=["2022-07-01", "2022-08-01"],
                                      bands=["500m_16_days_NDVI"])
    tables = {}
    for fmt, name in (("CSV", "zones.csv"), ("Parquet", "zones.parquet")):
        job = cube.aggregate_spatial(geometries=FIELDS, reducer="mean").save_result(format=fmt).create_job()
        job.start_and_wait(max_poll_interval=2, print=lambda *_: None)
        assert job.status() == "finished"
        got = job.get_results()
        assets = got.get_metadata()["assets"]
        assert list(assets) == [name], assets
        got.download_files(tmp_path / fmt)
        path = tmp_path / fmt / name
        tables[fmt] = pandas.read_csv(path, parse_dates=False) if fmt == "CSV" else pandas.read_parquet(path)
    mine = tables["CSV"]
    assert sorted(mine["zone"].unique()) == ["north", "south"] and list(mine.columns) == [
        "zone", "input", "key", "start", "end", "unit", "mean"]
    mine = mine.astype({"start": str, "end": str})
    pandas.testing.assert_frame_equal(mine, tables["Parquet"].astype({"start": str, "end": str}), rtol=1e-9)

    manifest = native_job(stack, NATIVE_ZONES)
    theirs = native_table(manifest, "zones").astype({"start": str, "end": str})
    pandas.testing.assert_frame_equal(mine, theirs, rtol=1e-9)

    tiles = {t["date"]: httpx.get(link).content for t in manifest["tasks"] if t["stage"] == "modis"
             for link in t["links"].values()}
    assert len(tiles) == len(mine) // 2 >= 2  # a row per field and date
    for feature in FIELDS["features"]:
        field = shapely.geometry.shape(feature["geometry"])
        for day, data in tiles.items():
            with MemoryFile(data) as memory, memory.open() as src:
                inside = geometry_mask([field], out_shape=src.shape, transform=src.transform, invert=True)
                good = inside & (src.read_masks(1) > 0)
                values = src.read(1)[good].astype("float64") * src.scales[0] + src.offsets[0]
            (row,) = mine[(mine["zone"] == feature["id"]) & (mine["key"] == day)].to_dict("records")
            assert row["mean"] == pytest.approx(float(values.mean()), rel=1e-9), (feature["id"], day)


def centred_values(data: bytes, field: Any) -> np.ndarray:
    """A COG's values (physical, no data left out) at the pixels whose centre is in the field."""
    with MemoryFile(data) as memory, memory.open() as src:
        inside = geometry_mask([field], out_shape=src.shape, transform=src.transform, invert=True)
        good = inside & (src.read_masks(1) > 0)
        return np.asarray(src.read(1)[good].astype("float64") * src.scales[0] + src.offsets[0])


@pytest.mark.timeout(2400)
def test_a_fields_mean_of_monthly_mean_ndvi_is_the_mean_of_the_native_apis_monthly_means(
        stack: LocalStack, tmp_path: Path) -> None:
    """aggregate_temporal_period then aggregate_spatial: per field and month the mean of each
    pixel's monthly mean — the native API's zones over its reduction — equal to the mean of
    the native API's monthly-mean GeoTIFF over the pixels whose centre is in the field."""
    connection = connected(stack)
    cube = connection.load_collection("MOD13A1", spatial_extent=BOX, temporal_extent=["2022-07-01", "2022-09-01"],
                                      bands=["500m_16_days_NDVI"])
    job = cube.aggregate_temporal_period("month", "mean").aggregate_spatial(
        geometries=FIELDS, reducer="mean").save_result(format="CSV").create_job()
    job.start_and_wait(max_poll_interval=2, print=lambda *_: None)
    assert job.status() == "finished"
    job.get_results().download_files(tmp_path / "openeo")
    mine = pandas.read_csv(tmp_path / "openeo" / "zones.csv")
    assert sorted(zip(mine["zone"], mine["key"], strict=True)) == [
        (f, m) for f in ("north", "south") for m in ("2022-07", "2022-08")]
    assert set(mine["input"]) == {"mean.MOD13A1.500m_16_days_NDVI"}

    manifest = native_job(stack, {**NATIVE_ZONES, "end": "2022-08-31", "reduce": {"by": "month", "reducer": "mean"},
                                  "zones": {**NATIVE_ZONES["zones"], "over": "reduction"}})  # type: ignore[dict-item]
    theirs = native_table(manifest, "zones")
    pandas.testing.assert_frame_equal(mine.astype({"start": str, "end": str}),
                                      theirs.astype({"start": str, "end": str}), rtol=1e-9)
    monthly = {t["group"]: httpx.get(link).content for t in manifest["tasks"] if t["stage"] == "aggregate"
               for link in t["links"].values()}
    assert sorted(monthly) == ["2022-07", "2022-08"]
    for feature in FIELDS["features"]:
        field = shapely.geometry.shape(feature["geometry"])
        for month, data in monthly.items():
            (row,) = mine[(mine["zone"] == feature["id"]) & (mine["key"] == month)].to_dict("records")
            values = centred_values(data, field)
            assert row["mean"] == pytest.approx(float(values.mean()), rel=1e-9), (feature["id"], month)


TOWERS = {"type": "FeatureCollection", "features": [
    {"type": "Feature", "id": "tower", "properties": {}, "geometry": {"type": "Point", "coordinates": [-107.8, 35.4]}},
    {"type": "Feature", "id": "mesa", "properties": {}, "geometry": {"type": "Point", "coordinates": [-107.6, 35.7]}}]}
BANDS = ["500m_16_days_NDVI", "500m_16_days_EVI"]


@pytest.mark.timeout(2400)
def test_aggregate_spatial_at_points_is_the_native_apis_sites_as_openeos_time_series(
        stack: LocalStack, tmp_path: Path) -> None:
    """Two sites' NDVI and EVI over a month, as openEO's aggregate_spatial at points: saved as
    JSON, the job's one asset is openEO's time series, which the client reads into a frame
    (timeseries_json_to_pandas) whose every value is the native API's sites table's for the
    same request; saved as CSV, the job's one asset is that table."""
    connection = connected(stack)
    cube = connection.load_collection("MOD13A1", spatial_extent=BOX, temporal_extent=["2022-07-01", "2022-08-01"],
                                      bands=BANDS)
    job = cube.aggregate_spatial(geometries=TOWERS, reducer="mean").save_result(format="JSON").create_job()
    job.start_and_wait(max_poll_interval=2, print=lambda *_: None)
    assert job.status() == "finished"
    assets = job.get_results().get_metadata()["assets"]
    assert list(assets) == ["sites.json"] and assets["sites.json"]["type"] == "application/json", assets
    timeseries = job.get_results().get_asset("sites.json").load_json()
    frame = timeseries_json_to_pandas(timeseries)  # a row per date, (site, band) columns

    towers = [{"id": f["id"], "lon": f["geometry"]["coordinates"][0], "lat": f["geometry"]["coordinates"][1]}
              for f in TOWERS["features"]]
    manifest = native_job(stack, {"sites": {"points": towers}, "start": "2022-07-01", "end": "2022-07-31",
                                  "products": ["MOD13A1"], "layers": {"MOD13A1": BANDS}})
    theirs = native_table(manifest, "sites")
    assert sorted(frame.index) == sorted(f"{d}T00:00:00Z" for d in theirs["date"].astype(str).unique())
    assert len(frame) >= 2 and frame.shape[1] == 2 * 2  # two sites, two bands each
    checked = 0
    for row in theirs.to_dict("records"):
        site = [f["id"] for f in TOWERS["features"]].index(row["site"])
        mine = frame.loc[f"{row['date']}T00:00:00Z", (site, BANDS.index(row["layer"]))]
        if row["value"] is None or np.isnan(row["value"]):
            assert np.isnan(mine), row
        else:
            assert mine == pytest.approx(row["value"], rel=1e-12), row
            checked += 1
    assert checked >= 4

    job = cube.aggregate_spatial(geometries=TOWERS, reducer="first").save_result(format="CSV").create_job()
    job.start_and_wait(max_poll_interval=2, print=lambda *_: None)
    assert list(job.get_results().get_metadata()["assets"]) == ["sites.csv"]
    job.get_results().download_files(tmp_path / "csv")
    table = pandas.read_csv(tmp_path / "csv" / "sites.csv")
    pandas.testing.assert_frame_equal(table.drop(columns=["date"]), theirs.drop(columns=["date", "geometry"]),
                                      check_dtype=False)


@pytest.mark.timeout(2400)
def test_mask_polygon_keeps_the_extent_and_makes_the_pixels_outside_no_data(
        stack: LocalStack, tmp_path: Path) -> None:
    """A fortnight's NDVI masked by a field (mask_polygon): the same GeoTIFFs as the native
    API's for the box (the extent kept), each pixel whose centre is in the field the native
    tile's value and every other no data; with inside true, the other way round within the
    box (what is kept is the box less the field)."""
    connection = connected(stack)
    cube = connection.load_collection("MOD13A1", spatial_extent=BOX, temporal_extent=["2022-07-01", "2022-07-20"],
                                      bands=["500m_16_days_NDVI"])
    field = FIELDS["features"][0]["geometry"]
    made = {}
    for inside in (False, True):
        job = cube.mask_polygon(mask=field, inside=inside).save_result("GTiff").create_job()
        job.start_and_wait(max_poll_interval=2, print=lambda *_: None)
        assert job.status() == "finished"
        job.get_results().download_files(tmp_path / str(inside))
        made[inside] = {p.name: p.read_bytes() for p in (tmp_path / str(inside)).glob("*.tif")}

    manifest = native_job(stack, {"region": {"bbox": [BOX["west"], BOX["south"], BOX["east"], BOX["north"]]},
                                  "start": "2022-07-01", "end": "2022-07-19", "products": ["MOD13A1"],
                                  "layers": {"MOD13A1": ["500m_16_days_NDVI"]}})
    tiles = {blob.rsplit("/", 1)[-1].replace("+", ""): httpx.get(link).content for t in manifest["tasks"]
             if t["stage"] == "modis" for blob, link in t["links"].items()}
    assert tiles and sorted(made[False]) == sorted(tiles) == sorted(made[True])  # the box's tiles: the extent kept
    shaped = shapely.geometry.shape(field)
    for name, data in tiles.items():
        with MemoryFile(data) as memory, memory.open() as src:
            theirs, valid = src.read(1), src.read_masks(1) > 0
            inside = geometry_mask([shaped], out_shape=src.shape, transform=src.transform, invert=True)
            box = geometry_mask([shapely.geometry.box(BOX["west"], BOX["south"], BOX["east"], BOX["north"])],
                                out_shape=src.shape, transform=src.transform, invert=True)
        for kept, keep in ((False, inside), (True, box & ~inside)):
            with MemoryFile(made[kept][name]) as memory, memory.open() as src:
                mine, ok = src.read(1), src.read_masks(1) > 0
            assert not ok[~keep].any(), (name, kept)  # every pixel masked is no data
            assert np.array_equal(ok[keep], valid[keep]) and np.array_equal(mine[keep & ok], theirs[keep & valid])
            assert ok[keep].sum() > 100, (name, kept)


@pytest.mark.timeout(2400)
def test_a_graph_of_more_than_30000_characters_runs(stack: LocalStack) -> None:
    """A field outlined by 2,000 vertices (a graph of some 50,000 characters, past what a
    table property holds) is taken, read back whole and run: the NDVI of the span's composites clipped to it."""
    ring = [[round(-107.75 + 0.2 * np.cos(2 * np.pi * k / 2000), 7), round(35.5 + 0.2 * np.sin(2 * np.pi * k / 2000),
                                                                              7)] for k in range(2000)]
    field = {"type": "Polygon", "coordinates": [[*ring, ring[0]]]}
    connection = connected(stack)
    cube = connection.load_collection("MOD13A1", spatial_extent=BOX, temporal_extent=["2022-07-01", "2022-07-17"],
                                      bands=["500m_16_days_NDVI"]).filter_spatial(field)
    job = cube.save_result("GTiff").create_job(title="a long graph")
    described = job.describe()
    assert len(json.dumps(described["process"])) > 30_000
    (clip,) = [n for n in described["process"]["process_graph"].values() if n["process_id"] == "filter_spatial"]
    assert clip["arguments"]["geometries"]["coordinates"] == field["coordinates"]
    job.start_and_wait(max_poll_interval=2, print=lambda *_: None)
    assert job.status() == "finished"
    assert len(job.get_results().get_metadata()["assets"]) == 2  # the tile of each composite the span meets
