"""A job's status, its portal view and ``watch`` read a bounded number of rows whatever the
job's size, and what they show is exactly what its task rows say."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from pipeline.failures import FailureClass
from pipeline.lifecycle import jobs, planner, rollups, tasks, transitions
from pipeline.lifecycle.status import TaskStatus
from pipeline.requests import application
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web import jobview
from tests.conftest import commit, fail, in_an_hour, parts, small_request, with_stage
from tests.harness.hooks import counting_reads, request_hook


def run_some(clients: Clients, job: str, commits: int) -> None:
    """Claim and commit ``commits`` of the job's queued tasks (by three writers), fail one
    attempt for good and one to be retried, leave one running."""
    queued = [r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.status is TaskStatus.QUEUED]
    counters = [rollups.RollupWriter(f"slot-{i}") for i in range(3)]

    def claim(row: dict) -> transitions.Claim:
        held = transitions.claim(clients, row.ref, "w", in_an_hour,
                                 counters[row.seq % 3])
        assert held is not None
        return held

    for row in queued[:commits]:
        status = TaskStatus.CACHED if row.seq % 5 == 0 else TaskStatus.SUCCEEDED
        assert commit(clients, counters[row.seq % 3], claim(row), status, [])
    counter = counters[0]
    assert fail(clients, counter, claim(queued[commits]), FailureClass.USER_CODE, "bad", again=True) \
        is TaskStatus.DEAD
    assert fail(clients, counter, claim(queued[commits + 1]), FailureClass.CONNECTION, "cut") is TaskStatus.QUEUED
    claim(queued[commits + 2])


def job_of(clients: Clients, end: str, commits: int) -> str:
    job = application.submit(clients, small_request(start="2022-01-01", end=end)).job
    planner.plan(clients, job)
    run_some(clients, job, commits)
    return job


def reads_of(settings: Settings, call: Callable[[Clients], object]) -> int:
    with counting_reads() as reads:
        fresh = Clients(settings)  # built with the hook
        call(fresh)
        fresh.close()
    return sum(reads)


def test_status_and_view_read_the_same_rows_at_any_size_and_show_the_rows(settings: Settings) -> None:
    settings = with_stage(settings, "noop", window=300, partitions=1)  # the cost of partitions: test_partitions.py
    clients = Clients(settings)
    clients.ensure_resources()
    small = job_of(clients, "2022-01-31", commits=3)  # 2 tiles × 4 periods
    large = job_of(clients, "2023-12-31", commits=150)  # 2 tiles × 92 periods

    for job in (small, large):  # what they show is what the task rows say
        rows = tasks.list_tasks(clients.tasks, parts(clients, job))
        shown = jobs.status(clients, job)
        assert {s: n for s, n in shown["counts"].items() if n} == dict(Counter(r.status for r in rows))
        assert shown["failures"] == {"user_code_error": 1, "connection_failure": 1}
        view = jobview.view(clients, job)
        for tile in view["tiles"]:
            mine = Counter(r.status for r in rows if r.parameters()["tile"] == tile["tile"])
            assert tile["counts"] == dict(mine) and tile["state"] == jobview.tile_state(mine)
        assert sorted(t["tile"] for t in view["tiles"]) == ["h09v05", "h10v05"] and all(
            t["bounds"] for t in view["tiles"])
        runs = sum(1 for r in rows if r.status in ("SUCCEEDED", "CACHED"))
        assert view["stages"]["noop"]["histogram"]["count"] == runs
        assert view["stages"]["noop"]["left"] == sum(1 for r in rows if not r.status.terminal)
        assert [(f["class"], f["attempt"]) for f in view["failed_attempts"]] == [
            ("connection_failure", 1), ("user_code_error", 1)]  # newest first

    status_small = reads_of(settings, lambda c: jobs.status(c, small))
    status_large = reads_of(settings, lambda c: jobs.status(c, large))
    view_small = reads_of(settings, lambda c: jobview.view(c, small))
    view_large = reads_of(settings, lambda c: jobview.view(c, large))
    assert status_large == status_small <= 1 + 1 + 3  # the job row, the releaser's rollup, three slots'
    assert view_large == view_small <= status_small + 1 + 2 + 1  # the plan row, two failures, a runtime
    # what reading every row would have cost
    assert reads_of(settings, lambda c: tasks.list_tasks(c.tasks, parts(c, large))) > 10 * view_large


def test_the_rollups_of_a_move_add_up_and_drop_what_nets_to_zero() -> None:
    props: dict[str, Any] = {}
    for moves in (rollups.Moves().move("noop", "h09v05", "PENDING", "QUEUED"),
                  rollups.Moves().move("noop", "h09v05", "QUEUED", "RUNNING"),
                  rollups.Moves().move("noop", "h09v05", "RUNNING", "SUCCEEDED").ran("noop", 2.0),
                  rollups.Moves().move("noop", "h10v05", "RUNNING", "DEAD").failed("user_code_error", True)):
        props |= rollups.apply(props, moves)
    assert props["SUCCEEDED"] == props["DEAD"] == 1 and props["QUEUED"] == 0 and props["RUNNING"] == -1
    tiles = {tile: counts for shard in range(rollups.TILE_SHARDS)
             for tile, counts in json.loads(props.get(f"Tiles{shard:02d}", "{}")).items()}
    assert tiles == {"h09v05": {"SUCCEEDED": 1}, "h10v05": {"DEAD": 1, "RUNNING": -1}}
    detail = json.loads(props[rollups.DETAIL])
    assert detail["failures"] == {"user_code_error": 1} and props[rollups.KILLS] == 1
    (bin_,) = detail["runtimes"]["noop"]
    assert 2.0 / 1.3 < rollups.bin_seconds(int(bin_)) < 2.0 * 1.3  # within a bin's width


def test_a_status_without_its_workers_table_reads_no_health_row(settings: Settings) -> None:
    """openEO's look at a job shows no workers (``workers=False``): it reads none of their
    health rows, which the native status reads for its table of the job's workers."""
    settings = with_stage(settings, "noop", window=300, partitions=1)
    clients = Clients(settings)
    clients.ensure_resources()
    job = application.submit(clients, small_request()).job
    planner.plan(clients, job)
    queued = next(r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.status is TaskStatus.QUEUED)
    writer = rollups.RollupWriter(f"w{names.SLOT_MARK}0")  # worker w's slot 0: the job has a worker
    held = transitions.claim(clients, queued.ref, "w", in_an_hour, writer)
    assert held is not None and commit(clients, writer, held)
    health = f"/{settings.names.table(names.WORKERS_TABLE)}()"
    shown, queried = {}, {}
    for workers in (True, False):
        seen: list[str] = []
        with request_hook(lambda request: seen.append(request.http_request.url)):  # noqa: B023  # used at once
            fresh = Clients(settings)  # built with the hook
            shown[workers] = jobs.status(fresh, job, workers=workers)
            fresh.close()
        queried[workers] = any(health in url for url in seen)
    assert queried == {True: True, False: False}
    assert [w["worker"] for w in shown[True]["workers"]] == ["w"] and shown[False]["workers"] == []
    assert shown[True]["counts"] == shown[False]["counts"] and shown[False]["counts"]["SUCCEEDED"] == 1
