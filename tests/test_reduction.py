"""Reductions end to end on real workers, granules from the local Planetary Computer:
released when their tile tasks have ended, the scientist's program (Python on rasterio, or
compiled C) run in the sandbox on the span's tiles, its outputs published and its logs kept;
a granule the catalog listed but the archive does not serve fails the reduction or not, as
the request says; a coastal request with ocean tiles and a missing date succeeds, with
no-data tiles and the reduction's ``missing_dates``; a crashing program is a classified
failure."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from rasterio.io import MemoryFile
from rio_cogeo.cogeo import cog_validate

from bagpipe.azurite import Azurite
from bagpipe.mailserver import MailServer
from bagpipe.planetary import Planetary
from pipeline.lifecycle import jobs, results, tasks
from pipeline.lifecycle.status import TaskStatus
from pipeline.modis import stacitems
from pipeline.reduction import reducers
from pipeline.requests import application
from pipeline.requests.request import JobRequest
from pipeline.science import ramps, rasters
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import on_stac, parts, running_control, running_workers, wait_for

SPAN = {"start": "2022-01-25", "end": "2022-02-12"}  # 3 eight-day periods, 2 February the real one
REGION = {"bbox": [-108.0, 35.2, -107.5, 35.8]}  # one 1° tile, x-108 y35, inside h09v05
GRID = {"tile_size": 1.0, "resolution": 0.01}


def run_job(settings: Settings, body: dict, timeout: float = 180) -> tuple[Clients, str, dict]:
    clients = Clients(settings)
    clients.ensure_resources()
    job = application.submit(clients, JobRequest.model_validate(body)).job
    with running_control(settings), running_workers(settings, 1, slots=2):
        wait_for(lambda: jobs.get(clients, job).state in ("SUCCEEDED", "FAILED"), timeout, "the job")
    return clients, job, jobs.status(clients, job)


def reduction_row(clients: Clients, job: str) -> tasks.TaskRow:
    (row,) = [r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.stage == "reduce"]
    return row


def outputs_of(clients: Clients, row: dict) -> dict[str, bytes]:
    return {o.rsplit("/", 1)[-1]: clients.products.download_blob(o).readall() for o in json.loads(row.outputs)}


def tiles_of(clients: Clients, job: str) -> list[np.ndarray]:
    found = []
    for row in tasks.list_tasks(clients.tasks, parts(clients, job)):
        if row.stage == "modis" and row.status in ("SUCCEEDED", "CACHED"):
            (ref,) = json.loads(row.outputs)
            data = clients.tiles.download_blob(ref.removeprefix(names.TILE_OUTPUT_PREFIX)).readall()
            with MemoryFile(data) as memory, memory.open() as tile:
                found.append(tile.read(1))
    return found


@pytest.mark.filterwarnings("ignore::rasterio.errors.NotGeoreferencedWarning")  # a PNG read alone
@pytest.mark.parametrize("sandbox", ["auto", "no-namespaces"])
def test_python_reduction_over_the_span(settings: Settings, planetary: Planetary, sandbox: str,
                                        tmp_path: Path) -> None:
    """In either sandbox mode: Python, numpy, rasterio (GDAL and PROJ and their data) read
    what they need and nothing more."""
    mine = on_stac(settings.with_(sandbox=sandbox), planetary)
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
        assert result.nodata == -1 and result.tags()["PERIODS"] == "2022-01-25,2022-02-02,2022-02-10"
    # published as a Cloud-Optimized GeoTIFF, as every product is (the program wrote its IFD after its data)
    cog = tmp_path / "snow_fraction.tif"
    cog.write_bytes(made["snow_fraction.tif"])
    assert cog_validate(str(cog), strict=True, quiet=True)[:2] == (True, [])
    # carrying the unit and colour ramp its reducer.json declares: its STAC item's unit, its overview's ramp
    with MemoryFile(made["snow_fraction.tif"]) as memory, memory.open() as result:
        assert result.units == ("1",) and result.tags()[rasters.COLORMAP_TAG] == "Blues"
    manifest = results.manifest(clients, job)
    assert manifest is not None
    (shown,) = [o for o in manifest["overviews"] if o["layer"] == "snow_fraction"]
    blues = ["#{:02x}{:02x}{:02x}".format(*c) for c in ramps.stops("Blues")]
    assert shown["unit"] == "1" and [e["colour"] for e in shown["legend"]] == blues
    (entry,) = [t for t in manifest["tasks"] if t["stage"] == "reduce"]
    item = stacitems.build_item(entry, [cog], manifest["catalog"])
    assert item is not None and item.assets["snow_fraction"].extra_fields["raster:bands"][0]["unit"] == "1"
    stack = np.stack(tiles_of(clients, job))
    seen = ((stack == 200) | (stack == 25)).sum(axis=0)
    expected = np.where(seen > 0, (stack == 200).sum(axis=0) / np.maximum(seen, 1), -1)
    assert np.allclose(fraction, expected)
    with MemoryFile(made["snow_fraction.png"]) as memory, memory.open() as png:
        assert png.driver == "PNG" and png.count == 3
    log = clients.logs.download_blob(names.log_prefix(job, row.task, 1) + "stdout.txt").readall()
    assert b"3 periods" in log
    # what a successful program wrote, listed and linked for bagpipe logs
    listed = results.logs(clients, job)
    assert [(e["task"], e["attempt"], e["name"]) for e in listed] == [(row.task, 1, "stderr.txt"),
                                                                     (row.task, 1, "stdout.txt")], listed
    assert "3 periods" in httpx.get(listed[1]["link"]).text
    assert [e["name"] for e in results.logs(clients, job, row.task)] == ["stderr.txt", "stdout.txt"]
    assert results.logs(clients, job, names.task_key(int(row.task) + 1)) == []


@pytest.mark.parametrize("sandbox", ["auto", "no-namespaces"])
def test_compiled_c_reduction(settings: Settings, planetary: Planetary, sandbox: str) -> None:
    program = reducers.catalog()["max_composite"]
    assert Path(program.command(Path(), Path(), Path())[0]).exists(), "build it: make setup"
    mine = on_stac(settings.with_(sandbox=sandbox), planetary)
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
def test_a_granule_the_archive_does_not_serve_fails_the_reduction_or_not_as_the_request_says(
    settings: Settings, azurite: Azurite, rule: str
) -> None:
    class Lossy(Planetary):
        """Lists the granule of 10 February but never stored it: a listed file the archive fails to serve."""

        def materialize(self, container: str, blob: str) -> bool:
            return ".A2022041." not in blob and super().materialize(container, blob)

    with Lossy(azurite.connection_string, prefix=f"{settings.namespace}{rule}") as lossy:
        mine = on_stac(settings, lossy, max_attempts=2)
        body = {"region": REGION, "grid": GRID, **SPAN, "products": ["MOD10A2"],
                "reducer": {"name": "snow_fraction", "on_dependency_failure": rule}}
        clients, job, status = run_job(mine, body)
    assert status["state"] == "FAILED" and status["counts"]["DEAD"] >= 1
    assert status["failures"]["source_download_failed"] >= 1
    row = reduction_row(clients, job)
    if rule == "fail":
        assert row.status == "DEAD" and row.last_failure == "dependency_failed"
    else:
        assert row.status == "SUCCEEDED"
        with MemoryFile(outputs_of(clients, row)["snow_fraction.tif"]) as memory, memory.open() as result:
            assert result.tags().get("MISSING", "") == ""  # failed, not missing: the catalog has it


def test_a_coastal_request_with_a_missing_date_succeeds_with_no_data_tiles(
    settings: Settings, azurite: Azurite
) -> None:
    """Off California in February 2016: two target tiles over the Pacific alone (MODIS h07v05
    has no land), and Terra's safe mode from 18 February; tokens that live 6 s."""
    with Planetary(azurite.connection_string, token_minutes=0.1, prefix=f"{settings.namespace}c") as planetary:
        mine = on_stac(settings, planetary)
        body = {"region": {"bbox": [-132.0, 36.2, -122.0, 36.8]}, "grid": {"tile_size": 2.0, "resolution": 0.04},
                "start": "2016-02-10", "end": "2016-02-20", "products": ["MOD10A2"],
                "reducer": {"name": "snow_fraction", "on_dependency_failure": "fail"}}
        clients, job, status = run_job(mine, body)
    assert status["state"] == "SUCCEEDED", status
    rows = tasks.list_tasks(clients.tasks, parts(clients, job))
    tiles = {(place["tile"], place["date"]): status  # each target tile of a batch, as a task of its own
             for r in rows if r.stage == "modis" for place, status, _ in r.places()}
    ocean = {"x-0066y+0018", "x-0065y+0018"}
    assert {t for (t, _), s in tiles.items() if s == "NO_DATA" and t in ocean} == ocean
    assert all(s == "NO_DATA" for (_, day), s in tiles.items() if day == "2016-02-18")  # the outage
    assert all(s == "SUCCEEDED" for (t, day), s in tiles.items() if day == "2016-02-10" and t not in ocean)
    for row in (r for r in rows if r.stage == "reduce"):
        tile = row.parameters()["tile"]
        if tile in ocean:
            assert row.status == "NO_DATA"
            continue
        assert row.status == "SUCCEEDED", row
        log = clients.logs.download_blob(names.log_prefix(job, row.task, 1) + "stdout.txt").readall()
        assert b"1 periods" in log
        with MemoryFile(outputs_of(clients, row)["snow_fraction.tif"]) as memory, memory.open() as result:
            assert result.tags()["MISSING"] == "2016-02-18"
    assert sum(s is TaskStatus.NO_DATA for r in rows for _, s, _ in r.places()) >= 4 + 3 + 2
    assert status["counts"]["NO_DATA"] >= 1 + 2 and not status["failures"]  # the outage's batch, the ocean's two


def test_a_crashing_program_is_a_user_code_failure(settings: Settings, planetary: Planetary, mail: MailServer,
                                                   tmp_path: Path) -> None:
    folder = tmp_path / "crash"
    folder.mkdir()
    (folder / "reducer.json").write_text(json.dumps({
        "name": "crash", "argv": ["{python}", "-c", "import sys; print('bad pixel', file=sys.stderr); sys.exit(4)"],
        "outputs": ["*.tif"]}))
    mine = on_stac(settings, planetary, reducers_path=str(tmp_path), max_attempts=2)
    body = {"region": REGION, "grid": GRID, **SPAN, "products": ["MOD10A2"], "reducer": {"name": "crash"},
            "email": "me@example.org"}
    clients, job, status = run_job(mine, body)
    row = reduction_row(clients, job)
    assert row.status == "DEAD" and row.last_failure == "user_code_error"
    assert "exited with code 4" in row.last_error and "bad pixel" in row.last_error
    assert status["counts"]["SUCCEEDED"] == 3  # the tiles are there all the same
    # the email says why, not only "1 dead", and where the program's output is
    (email,) = wait_for(lambda: [m for _, m in mail.messages() if job in str(m["Subject"])], 30, "the email")
    text = email.get_content()
    assert f"task {int(row.task)} (reduce) attempt 2: user_code_error: " in text and "bad pixel" in text, text
    assert f"bagpipe logs {job} TASK" in text, text
    assert "Asked: MOD10A2, 2022-01-25 to 2022-02-12, over the box -108, 35.2, -107.5, 35.8 " in text, text
