"""Reductions end to end on real workers: released when their tile tasks have ended, the
scientist's program (Python on rasterio, or compiled C) run in the sandbox on the span's
tiles, its outputs published and its logs kept; a failed dependency fails the reduction or
not, as the request says; a crashing program is a classified failure."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import numpy as np
import pytest
from rasterio.io import MemoryFile

from bagpipe.feedserver import FeedServer, granule, real_granule
from pipeline import jobs, names, reducers, tasks
from pipeline.clients import Clients
from pipeline.feeds import granule_name
from pipeline.request import JobRequest
from pipeline.settings import Settings
from tests.conftest import running_control, running_workers, wait_for

SPAN = {"start": "2022-01-25", "end": "2022-02-12"}  # 3 eight-day periods, 2 February the real one
REGION = {"bbox": [-108.0, 35.2, -107.5, 35.8]}  # one 1° tile, x-108 y35, inside h09v05
GRID = {"tile_size": 1.0, "resolution": 0.01}


@pytest.fixture
def feed() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


def run_job(settings: Settings, body: dict, timeout: float = 180) -> tuple[Clients, str, dict]:
    clients = Clients(settings)
    clients.ensure_resources()
    job = jobs.submit(clients, JobRequest.model_validate(body))["PartitionKey"]
    with running_control(settings), running_workers(settings, 1, slots=2):
        wait_for(lambda: jobs.get(clients, job)["State"] in ("SUCCEEDED", "FAILED"), timeout, "the job")
    return clients, job, jobs.status(clients, job)


def reduction_row(clients: Clients, job: str) -> dict:
    (row,) = [r for r in tasks.list_tasks(clients.tasks, job) if r["Stage"] == "reduce"]
    return row


def outputs_of(clients: Clients, row: dict) -> dict[str, bytes]:
    return {o.rsplit("/", 1)[-1]: clients.products.download_blob(o).readall() for o in json.loads(row["Outputs"])}


def tiles_of(clients: Clients, job: str) -> list[np.ndarray]:
    found = []
    for row in tasks.list_tasks(clients.tasks, job):
        if row["Stage"] == "modis":
            (ref,) = json.loads(row["Outputs"])
            data = clients.tiles.download_blob(ref.removeprefix(names.TILE_OUTPUT_PREFIX)).readall()
            with MemoryFile(data) as memory, memory.open() as tile:
                found.append(tile.read(1))
    return found


@pytest.mark.filterwarnings("ignore::rasterio.errors.NotGeoreferencedWarning")  # a PNG read alone
def test_python_reduction_over_the_span(settings: Settings, feed: FeedServer) -> None:
    mine = settings.with_(tile_stage="modis", feed_url=feed.template)
    body = {"region": REGION, "grid": GRID, **SPAN, "products": ["MOD10A2"],
            "reducer": {"name": "snow_fraction", "args": {"note": "test"}}}
    clients, job, status = run_job(mine, body)
    assert status["state"] == "SUCCEEDED", status
    assert status["counts"]["SUCCEEDED"] == 3 + 1
    row = reduction_row(clients, job)
    made = outputs_of(clients, row)
    assert set(made) == {"snow_fraction.tif", "snow_fraction.png"}
    with MemoryFile(made["snow_fraction.tif"]) as memory, memory.open() as result:
        fraction = result.read(1)
        assert result.crs.to_epsg() == 4326 and result.shape == (100, 100)
    stack = np.stack(tiles_of(clients, job))
    seen = ((stack == 200) | (stack == 25)).sum(axis=0)
    expected = np.where(seen > 0, (stack == 200).sum(axis=0) / np.maximum(seen, 1), -1)
    assert np.allclose(fraction, expected)
    with MemoryFile(made["snow_fraction.png"]) as memory, memory.open() as png:
        assert png.driver == "PNG" and png.count == 3
    log = clients.logs.download_blob(names.log_prefix(job, row["RowKey"], 1) + "stdout.txt").readall()
    assert b"3 periods" in log


def test_compiled_c_reduction(settings: Settings, feed: FeedServer) -> None:
    program = reducers.catalog()["max_composite"]
    assert Path(program.command(Path(), Path(), Path())[0]).exists(), "build it: make setup"
    mine = settings.with_(tile_stage="modis", feed_url=feed.template)
    body = {"region": REGION, "grid": GRID, **SPAN, "products": ["MOD10A2"], "reducer": {"name": "max_composite"}}
    clients, job, status = run_job(mine, body)
    assert status["state"] == "SUCCEEDED", status
    made = outputs_of(clients, reduction_row(clients, job))
    assert set(made) == {"max_composite.bin", "max_composite.hdr", "snow_days.csv"}
    stack = np.stack(tiles_of(clients, job))
    expected = np.where((stack == 255).all(axis=0), 255, np.where(stack == 255, 0, stack).max(axis=0))
    assert np.array_equal(np.frombuffer(made["max_composite.bin"], np.uint8).reshape(100, 100), expected)
    rows = made["snow_days.csv"].decode().splitlines()
    assert rows[0] == "input,snow_pixels,clear_pixels" and len(rows) == 1 + 3


@pytest.mark.parametrize("rule", ["fail", "run"])
def test_a_dead_dependency_fails_the_reduction_or_not_as_the_request_says(
    settings: Settings, tmp_path: Path, rule: str
) -> None:
    folder = tmp_path / "feed"
    folder.mkdir()
    for day in (date(2022, 1, 25), date(2022, 2, 2)):  # 10 February is missing from this feed
        name = granule_name("MOD10A2", "h09v05", day)
        real = real_granule("MOD10A2", "h09v05", day)
        if real:
            shutil.copy(real, folder / name)
        else:
            (folder / name).write_bytes(granule("MOD10A2", "h09v05", day) or b"")
    mine = settings.with_(tile_stage="modis", feeds=json.dumps({"MOD10A2": folder.as_uri() + "/{name}"}),
                          max_attempts=2)
    body = {"region": REGION, "grid": GRID, **SPAN, "products": ["MOD10A2"],
            "reducer": {"name": "snow_fraction", "on_dependency_failure": rule}}
    clients, job, status = run_job(mine, body)
    assert status["state"] == "FAILED" and status["counts"]["DEAD"] >= 1
    assert status["failures"]["source_download_failed"] >= 1
    row = reduction_row(clients, job)
    if rule == "fail":
        assert row["Status"] == "DEAD" and row["LastFailure"] == "dependency_failed"
    else:
        assert row["Status"] == "SUCCEEDED"
        with MemoryFile(outputs_of(clients, row)["snow_fraction.tif"]) as memory, memory.open() as result:
            assert result.tags()["MISSING"] == "2022-02-10"


def test_a_crashing_program_is_a_user_code_failure(settings: Settings, feed: FeedServer, tmp_path: Path) -> None:
    folder = tmp_path / "crash"
    folder.mkdir()
    (folder / "reducer.json").write_text(json.dumps({
        "name": "crash", "argv": ["{python}", "-c", "import sys; print('bad pixel', file=sys.stderr); sys.exit(4)"],
        "outputs": ["*.tif"]}))
    mine = settings.with_(tile_stage="modis", feed_url=feed.template, reducers_path=str(tmp_path), max_attempts=2)
    body = {"region": REGION, "grid": GRID, **SPAN, "products": ["MOD10A2"], "reducer": {"name": "crash"}}
    clients, job, status = run_job(mine, body)
    row = reduction_row(clients, job)
    assert row["Status"] == "DEAD" and row["LastFailure"] == "user_code_error"
    assert "exited with code 4" in row["LastError"] and "bad pixel" in row["LastError"]
    assert status["counts"]["SUCCEEDED"] == 3  # the tiles are there all the same
