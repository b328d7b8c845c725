"""Tile tasks sized to their work: a tile task warps a batch of target tiles for one date
and product (``pipeline.modis.batches``), each target keeping its own content-addressed
output. The planner makes a task per batch, never more feeds than a transaction counts
off; the stage makes each target's pixels exactly as a task of that target alone makes
them, under the same name (so the cache serves either way, and a repeat request is settled
at planning); a reduction fed by batches is released only once every one of them has
ended, and a batch whose first attempt died commits once; the manifest, the reductions
and the counts per place see one target tile at a time."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from datetime import date

import numpy as np
import pytest
from rasterio.io import MemoryFile

from pipeline import planning, stages
from pipeline.failures import FailureClass
from pipeline.lifecycle import jobs, planner, rollups, tasks, transitions
from pipeline.lifecycle.status import TaskStatus
from pipeline.modis import batches, cachedtiles, reprojection
from pipeline.modis.targets import GridSpec
from pipeline.planning import TaskPlan
from pipeline.requests import search
from pipeline.requests.expansion import TaskSpec, expand, plan_of
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.stages import StageContext
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import PlanOnly, commit, fail, in_an_hour, on_stac, registered

SEAM_BOX = [-112.0, 34.0, -108.0, 37.0]  # 12 target tiles of 1° over h08v05 | h09v05


def request(**fields: object) -> JobRequest:
    return JobRequest.model_validate({"region": {"bbox": SEAM_BOX}, "start": "2022-01-01", "end": "2022-03-02",
                                      "products": ["MOD13A1"], "email": "b@example.org"} | fields)


# --- planning ---------------------------------------------------------------------------

def test_targets_over_one_modis_tile_make_a_tile_task_per_batch_and_date() -> None:
    # 0.1° tiles over 1° × 0.5° inside h09v05: 50 target tiles, whose centres all lie in h09v05
    asked = request(region={"bbox": [-108.0, 35.0, -107.0, 35.5]}, grid={"tile_size": 0.1, "resolution": 0.005},
                    start="2022-01-01", end="2022-01-01")
    specs = [s for s in expand(asked, 50_000, batch=batches.MAX_TARGETS) if isinstance(s, TaskSpec)]
    targets = [t for s in specs for t in s.targets]
    assert len(targets) == 50 and len(set(targets)) == 50, "every target tile once"
    assert len(specs) == math.ceil(50 / batches.MAX_TARGETS) == 2
    assert [len(s.targets) for s in specs] == [32, 18]
    one = specs[0].params()
    places = planning.places(one)
    assert [p["tile"] for p in places] == [t.name for t in specs[0].targets]
    assert places[0]["bounds"] == ",".join(map(repr, specs[0].targets[0].bounds()))
    assert planning.READS not in places[0] and places[0]["sources"] == "h09v05"


def reduced_specs() -> list[TaskSpec]:
    """The seam box's tasks with its maximum over the span, batched as the modis stage is."""
    asked = request(reduce={"by": "span", "reducer": "max"})
    return [s for s in expand(asked, 50_000, batch=batches.MAX_TARGETS) if isinstance(s, TaskSpec)]


def test_a_batch_feeds_the_reductions_of_its_targets_in_its_partition_within_a_transaction(
        monkeypatch: pytest.MonkeyPatch) -> None:
    specs = reduced_specs()
    tiles = [s for s in specs if s.stage == "modis"]
    assert len(tiles) == 4 and all(len(s.targets) == 12 for s in tiles), "one batch of the 12 targets a date"
    reductions = [s for s in specs if s.stage == "aggregate"]
    assert len(reductions) == 12 and all(s.deps == ((0, 4),) for s in reductions)
    assert all(s.feeds == tuple(range(4, 16)) for s in tiles)
    assert {s.partition for s in specs} == {0}, "a batch and what waits for it share a partition"

    monkeypatch.setattr(batches, "MAX_FEEDS", 5)  # a transaction that could count off 5 waiting tasks
    specs = reduced_specs()
    tiles = [s for s in specs if s.stage == "modis"]
    assert max(len(s.feeds) for s in tiles) <= 5 and sum(len(s.targets) for s in tiles) == 4 * 12
    for reduction in (s for s in specs if s.stage == "aggregate"):
        fed_by = [specs[seq] for first, count in reduction.deps for seq in range(first, first + count)]
        assert len(fed_by) == 4 and all(reduction.target in s.targets for s in fed_by)
        assert {s.partition for s in fed_by} == {reduction.partition}


def test_a_task_of_several_places_is_seen_one_place_at_a_time() -> None:
    granules = {"h08v05": {"id": "A.h08v05", "files": {}}, "h09v05": {"id": "A.h09v05", "files": {}}}
    params = {"product": "MOD13A1", "tile": "a,b,c", "date": "2022-01-01", "bounds": "0,0,1,1;1,0,2,1;2,0,3,1",
              "sources": "h08v05;h08v05,h09v05;h10v05", planning.READS: "h08v05;h08v05,h09v05;",
              "granules": json.dumps(granules)}
    a, b, c = planning.places(params)
    assert (a["tile"], a["bounds"], a["sources"]) == ("a", "0,0,1,1", "h08v05")
    assert json.loads(a["granules"]) == {"h08v05": granules["h08v05"]} and json.loads(b["granules"]) == granules
    assert c["granules"] == "{}" and planning.READS not in c
    outputs = [f"tiles:k/MOD13A1.NDVI.2022-01-01.{t}.tif" for t in "abc"]
    row = tasks.TaskRow(part="p", task="000000001", seq=1, shard=0, stage="modis", status=TaskStatus.SUCCEEDED,
                        params=json.dumps(params), outputs=json.dumps(outputs[:2]))
    assert [(p["tile"], s, o) for p, s, o in row.places()] == [
        ("a", TaskStatus.SUCCEEDED, outputs[:1]), ("b", TaskStatus.SUCCEEDED, outputs[1:2]),
        ("c", TaskStatus.NO_DATA, [])]  # the catalog had no granule of the tile c covers
    single = dict(params, tile="a", bounds="0,0,1,1", sources="h08v05")
    assert planning.places(single) == [single]
    # the map counts a task of several places in each
    row_of = rollups.plan_row("j", [TaskPlan("modis", params)])
    moves = rollups.Moves().move("modis", "a,b,c", TaskStatus.PENDING, TaskStatus.QUEUED)
    assert set(moves.tiles) == {"a", "b", "c"} and moves.counts[TaskStatus.QUEUED.value] == 1
    assert all(f'"{t}"' in row_of["Part00"] for t in "abc") and '"a,b,c"' not in row_of["Part00"]


# --- the stage ----------------------------------------------------------------------------

def batch_params(settings: Settings, day: date, *wests: float) -> tuple[list[dict[str, str]], dict[str, str]]:
    """Each 1° target tile (at 0.01°) at 34°N west of ``wests`` as a task alone, and all of
    them as one batch, their granules found as the planner finds them."""
    grid = GridSpec(resolution=0.01)
    targets = [grid.tile_at(west, 34.0) for west in wests]
    alone = search.resolve(settings, [TaskSpec("modis", "MOD10A2", t, day) for t in targets], "modis")
    (batch,) = search.resolve(settings, [TaskSpec("modis", "MOD10A2", targets[0], day, batch=tuple(targets))],
                              "modis")
    return [s.params() for s in alone if isinstance(s, TaskSpec)], batch.params()  # type: ignore[union-attr]


def run(settings: Settings, params: dict[str, str], job: str = "j1", attempt: int = 1) -> StageContext:
    ctx = StageContext(job=job, part=job, task="000000000", attempt=attempt, params=params, clients=Clients(settings),
                       output_prefix=names.output_prefix(job, "000000000", attempt))
    stages.STAGES["modis"](ctx)
    return ctx


def pixels(clients: Clients, output: str) -> np.ndarray:
    data = clients.tiles.download_blob(output.removeprefix(names.TILE_OUTPUT_PREFIX)).readall()
    with MemoryFile(data) as memory, memory.open() as tile:
        return np.asarray(tile.read(1))


def test_each_target_of_a_batch_is_warped_as_a_task_of_it_alone_would_warp_it(
        clients: Clients, settings: Settings, planetary: object) -> None:
    mine = on_stac(settings, planetary)  # type: ignore[arg-type]
    alone, batch = batch_params(mine, date(2022, 3, 6), -111.0, -110.0, -109.0)  # across h08v05 | h09v05
    assert batch["tile"] == ",".join(p["tile"] for p in alone)
    singles = [run(mine, params, job=f"alone{i}") for i, params in enumerate(alone)]
    expected = {output: pixels(clients, output) for ctx in singles for output in ctx.outputs}
    assert len(expected) == 3 and all(not ctx.cached for ctx in singles)
    for output in expected:  # made again by the batch, not found in the cache
        clients.tiles.delete_blob(output.removeprefix(names.TILE_OUTPUT_PREFIX))
    made = run(mine, batch, job="batch")
    assert not made.cached and made.outputs == list(expected), "the same names: the same content addresses"
    for output, values in expected.items():
        assert np.array_equal(pixels(clients, output), values), output
    assert len(list(clients.sources.list_blobs())) == 2, "each granule fetched once for the whole batch"
    # a repeat request, batched or not, is settled at planning: every output there
    rows = [tasks.TaskRow(part="p", task=f"00000000{i}", seq=i, shard=0, stage="modis", status=TaskStatus.PENDING,
                          params=json.dumps(params)) for i, params in enumerate([batch, *alone])]
    settled = cachedtiles.made_already(clients, rows)
    assert settled["000000000"] == made.outputs
    assert [settled[f"00000000{i}"] for i in (1, 2, 3)] == [ctx.outputs for ctx in singles]


def test_a_batch_whose_attempt_died_midway_is_made_whole_by_the_next(
        clients: Clients, settings: Settings, planetary: object, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = on_stac(settings, planetary)  # type: ignore[arg-type]
    _, batch = batch_params(mine, date(2022, 3, 6), -111.0, -110.0, -109.0)
    warp, calls, counting = reprojection.warp, [], threading.Lock()

    def dies_on_the_third(*args: object, **kwargs: object) -> bytes:
        with counting:
            calls.append(1)
            third = len(calls) == 3
        if third:
            raise RuntimeError("the worker died")
        return warp(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(reprojection, "warp", dies_on_the_third)
    with pytest.raises(RuntimeError, match="died"):
        run(mine, batch)
    made_first = {b.name for b in clients.tiles.list_blobs() if not b.name.startswith(names.MARKER_PREFIX)}
    assert len(made_first) == 2
    again = run(mine, batch, attempt=2)
    assert len(again.outputs) == 3 and not again.cached
    assert {o.removeprefix(names.TILE_OUTPUT_PREFIX) for o in again.outputs} > made_first
    assert not [b for b in clients.tiles.list_blobs(name_starts_with=names.MARKER_PREFIX)], "no marker left"
    assert len(calls) == 4, "the second attempt warps only the target the first did not make"


# --- the lifecycle ------------------------------------------------------------------------

class Batched(PlanOnly):
    """The application whose plan is the seam box's reduction, batched: four tile tasks
    (one per date, each of the 12 targets) feeding 12 reductions."""

    def plan(self, settings: Settings, request: str, resolved: str, *, search: bool, limit: int) -> list[TaskPlan]:
        return plan_of(expand(JobRequest.model_validate_json(request), limit, batch=batches.MAX_TARGETS))


@pytest.fixture
def batched() -> Iterator[Batched]:
    application = Batched()
    with registered(application):
        yield application


def planned(clients: Clients, application: Batched) -> jobs.JobRow:
    body = request(reduce={"by": "span", "reducer": "max"}).model_dump_json()
    row = jobs.submit(clients, body, application.plan(clients.settings, body, "", search=False, limit=1000))
    planner.plan(clients, row.job)
    return jobs.get(clients, row.job)


def claim(clients: Clients, row: jobs.JobRow, seq: int) -> transitions.Claim:
    (task,) = tasks.list_tasks(clients.tasks, row.parts, seq, 1)
    if task.status is TaskStatus.PENDING:
        transitions.queue(clients, [task])
    held = transitions.claim(clients, tasks.list_tasks(clients.tasks, row.parts, seq, 1)[0].ref, "w", in_an_hour)
    assert held is not None
    return held


def test_a_reduction_fed_by_batches_starts_once_all_have_ended_and_a_retried_batch_counts_once(
        clients: Clients, batched: Batched) -> None:
    row = planned(clients, batched)
    assert row.total == 16
    writer = rollups.RollupWriter("w")

    def waiting() -> list[tuple[TaskStatus, int | None]]:
        return [(r.status, r.deps) for r in tasks.list_tasks(clients.tasks, row.parts, 4, 12)]

    assert waiting() == [(TaskStatus.PENDING, 4)] * 12
    for seq in (0, 1):
        assert commit(clients, writer, claim(clients, row, seq))
    assert waiting() == [(TaskStatus.PENDING, 2)] * 12, "each batch counted off every reduction it feeds"

    died = claim(clients, row, 2)  # its worker dies: the monitor ends the attempt, and the batch runs again
    assert fail(clients, writer, died, FailureClass.HEARTBEAT_LOST, "no heartbeat") is TaskStatus.QUEUED
    assert waiting() == [(TaskStatus.PENDING, 2)] * 12, "a failed attempt counts nothing off"
    assert commit(clients, writer, claim(clients, row, 2))
    assert not commit(clients, writer, died), "the dead attempt's late commit is refused"
    assert waiting() == [(TaskStatus.PENDING, 1)] * 12, "the batch counted off once"

    assert commit(clients, writer, claim(clients, row, 3))
    assert [s for s, _ in waiting()] == [TaskStatus.QUEUED] * 12, "released once all four batches ended"
    queued = [tasks.TaskRef.decode(m.content).task for q in clients.shard_queues for m in q.peek_messages(32)]
    assert sorted(t for t in queued if t in {r.task for r in tasks.list_tasks(clients.tasks, row.parts, 4, 12)}) \
        == sorted(r.task for r in tasks.list_tasks(clients.tasks, row.parts, 4, 12)), "each sent once"
