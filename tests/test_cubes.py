"""A region given as a polygon, and cubes, end to end on real workers with granules from the
local Planetary Computer: the tiles the polygon does not touch are not planned, pixels
outside it are nodata in every product; the job's netCDF and Zarr cubes (a layer over the
region and dates, a reduction over its groups) open with xarray and equal the tiles' COGs,
pixel for pixel, with their CRS as a CF grid mapping."""

from __future__ import annotations

import io
import json
from datetime import date
from pathlib import Path

import numpy as np
import pytest
import rasterio
import shapely
import xarray
import zarr
from rasterio.io import MemoryFile

from bagpipe.planetary import Planetary
from pipeline.lifecycle import attempts, jobs, tasks
from pipeline.lifecycle.status import TaskStatus
from pipeline.modis import layout, stacitems
from pipeline.reduction import AGGREGATE_STAGE, CUBE_GATHER
from pipeline.requests import application
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import on_stac, parts, running_control, running_workers, wait_for

NDVI = "500m_16_days_NDVI"
# a triangle over the 1° tiles x-108..x-107 × y35..y36 that touches three of the four
TRIANGLE = {"type": "Polygon", "coordinates": [[[-107.9, 35.1], [-106.2, 35.2], [-107.8, 36.6], [-107.9, 35.1]]]}


def run(settings: Settings, body: dict[str, object]) -> tuple[Clients, list[tasks.TaskRow]]:
    clients = Clients(settings)
    clients.ensure_resources()
    job = application.submit(clients, JobRequest.model_validate(body)).job
    with running_control(settings), running_workers(settings, 1, slots=2):
        wait_for(lambda: jobs.get(clients, job).state.finished, 300, "the job")
    rows = tasks.list_tasks(clients.tasks, parts(clients, job))
    assert jobs.get(clients, job).state.value == "SUCCEEDED", [
        a.error for a in attempts.list_attempts(clients.tasks, parts(clients, job))][:3]
    return clients, rows


def blob(clients: Clients, output: str) -> bytes:
    return clients.tiles.download_blob(output.removeprefix(names.TILE_OUTPUT_PREFIX)).readall()


def cube_of(clients: Clients, rows: list[tasks.TaskRow], name: str) -> tuple[tasks.TaskRow, bytes]:
    (row,) = [r for r in rows if r.stage == CUBE_GATHER and r.parameters()["name"] == name]
    assert row.status is TaskStatus.SUCCEEDED
    (output,) = row.output_names()
    return row, blob(clients, output)


def decoded(data: bytes) -> tuple[np.ndarray, rasterio.Affine]:
    with MemoryFile(data) as memory, memory.open() as src:
        values = src.read(1).astype("float64")
        values[src.read_masks(1) == 0] = np.nan
        return values * src.scales[0] + src.offsets[0], src.transform


def check_cube(clients: Clients, rows: list[tasks.TaskRow], opened: xarray.Dataset, name: str, stage: str) -> None:
    """Every tile of ``stage`` in the cube, decoded, equal to its COG decoded."""
    variable = opened[name]
    assert variable.dims == ("time", "y", "x")
    assert variable.attrs["grid_mapping"] == "spatial_ref" or variable.encoding.get("grid_mapping") == "spatial_ref"
    assert opened["spatial_ref"].attrs["grid_mapping_name"] == "latitude_longitude"
    x, y = opened["x"].values, opened["y"].values
    compared = 0
    for row in rows:
        if row.stage != stage or row.status not in (TaskStatus.SUCCEEDED, TaskStatus.CACHED):
            continue
        found = row.parameters()
        day = np.datetime64(found.get("start") or found["date"])
        for output in row.output_names():
            if stage == "modis" and f".{name}." not in output:
                continue
            values, transform = decoded(blob(clients, output))
            col = int(np.argmin(np.abs(x - (transform.c + transform.a / 2))))
            top = int(np.argmin(np.abs(y - (transform.f + transform.e / 2))))
            part = variable.sel(time=day).values[top:top + values.shape[0], col:col + values.shape[1]]
            assert np.array_equal(np.isnan(part), np.isnan(values))
            assert np.allclose(part[np.isfinite(part)], values[np.isfinite(values)], rtol=0, atol=1e-6)
            compared += 1
    assert compared


def test_a_polygon_region_and_its_cubes_equal_the_tiles(settings: Settings, planetary: Planetary) -> None:
    body = {"region": {"geometry": TRIANGLE}, "grid": {"tile_size": 1.0, "resolution": 0.01},
            "start": "2022-07-01", "end": "2022-07-31", "products": ["MOD13A1"],
            "reduce": {"by": "month", "reducer": "max"}, "output": {"format": "netcdf"}}
    mine = on_stac(settings, planetary)
    clients, rows = run(mine, body)
    tiles = sorted({place["tile"] for r in rows if r.stage == "modis" for place, _, _ in r.places()})
    assert tiles == ["x-0107y+0035", "x-0108y+0035", "x-0108y+0036"], "the tile it does not touch not planned"
    triangle = shapely.Polygon(TRIANGLE["coordinates"][0])
    for row in rows:
        for output in row.output_names() if row.stage == "modis" and row.status is TaskStatus.SUCCEEDED else []:
            values, transform = decoded(blob(clients, output))
            rows_, cols = np.indices(values.shape)
            xs, ys = rasterio.transform.xy(transform, rows_.ravel(), cols.ravel())
            inside = shapely.contains_xy(triangle, np.asarray(xs), np.asarray(ys)).reshape(values.shape)
            assert np.isnan(values[~inside]).all() and np.isfinite(values[inside]).any()
    row, data = cube_of(clients, rows, NDVI)
    with xarray.open_dataset(io.BytesIO(data), engine="h5netcdf") as opened:
        assert opened.attrs["Conventions"] == "CF-1.8"
        assert opened.sizes["x"] == 200 and opened.sizes["y"] == 200
        assert [str(t)[:10] for t in opened["time"].values] == ["2022-06-26", "2022-07-12", "2022-07-28"]
        assert opened[NDVI].attrs["units"] == "NDVI"
        assert opened[NDVI].encoding["chunksizes"] == (1, 100, 100)
        check_cube(clients, rows, opened, NDVI, "modis")
    _, reduced = cube_of(clients, rows, "max")
    with xarray.open_dataset(io.BytesIO(reduced), engine="h5netcdf") as opened:
        (variable,) = [v for v in opened.data_vars if v != "spatial_ref"]
        check_cube(clients, rows, opened, str(variable), AGGREGATE_STAGE)


def test_a_zarr_cube_opens_with_xarray_equal_to_the_tiles(settings: Settings, planetary: Planetary,
                                                           tmp_path: pytest.TempPathFactory) -> None:
    body = {"region": {"bbox": [-108.0, 35.2, -107.5, 35.8]}, "grid": {"tile_size": 1.0, "resolution": 0.01},
            "start": "2022-07-01", "end": "2022-07-31", "products": ["MOD13A1"], "output": {"format": "zarr"}}
    clients, rows = run(on_stac(settings, planetary), body)
    _, data = cube_of(clients, rows, NDVI)
    path = tmp_path / "cube.zarr.zip"  # type: ignore[operator]
    path.write_bytes(data)
    with xarray.open_zarr(zarr.storage.ZipStore(path, mode="r"), consolidated=False) as opened:
        assert str(opened["time"].values[0])[:10] == date(2022, 6, 26).isoformat()
        check_cube(clients, rows, opened, NDVI, "modis")


def test_a_gather_has_a_stac_item_its_tables_or_cube_as_assets_and_a_folder_of_its_own(tmp_path: Path) -> None:
    task = {"task": "0000000009", "stage": "cube", "name": NDVI, "product": "MOD13A1", "start": "2022-07-01",
            "end": "2022-07-31", "bbox": "179.0,65.0,-179.0,66.0", "encoding": json.dumps({"unit": "NDVI"})}
    cube = tmp_path / f"{NDVI}.nc"
    cube.write_bytes(b"")
    item = stacitems.build_item(task, [cube], {})
    assert item is not None and item.id == f"cubes.{NDVI}" and stacitems.DATACUBE_SCHEMA in item.stac_extensions
    assert item.properties["cube:variables"][NDVI] == {"dimensions": ["time", "y", "x"], "type": "data",
                                                       "unit": "NDVI"}
    assert item.assets["nc"].media_type == "application/netcdf" and len(item.geometry["coordinates"]) == 2
    sites = {"task": "0000000004", "stage": "sites", "start": "2022-07-01", "end": "2022-07-31",
             "bbox": "-108.0,35.0,-107.0,36.0"}
    table = stacitems.build_item(sites, [tmp_path / "sites.csv", tmp_path / "sites.parquet"], {})
    assert table is not None and sorted(table.assets) == ["csv", "parquet"]
    assert layout.folder(sites) == "sites" and layout.folder(task) == "cubes"
