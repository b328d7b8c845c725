"""A repeat request costs almost nothing: tile tasks whose every output the cache holds are
settled at planning (PENDING → CACHED, ``transitions.settle``), with no message, no claim
and no attempt; the counts, the per-tile rollups and the reductions' dependency counts move
as a worker's commit of a CACHED task moves them, the job succeeds with one email, and its
manifest names the outputs the first run made. Only a task whose every output is surely
there is settled (a tile missing, a maker at work: the ordinary way), and a settle that is
refused, or applied with its answer lost, leaves nothing stuck or counted twice."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from azure.core.exceptions import ServiceResponseError

from bagpipe.mailserver import MailServer
from bagpipe.planetary import Planetary
from pipeline.lifecycle import attempts, jobs, planner, results, rollups, sweep, tasks, transitions
from pipeline.requests import application
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.storage import cache, names
from pipeline.storage.clients import Clients
from tests.conftest import on_stac, parts, running_control, running_workers, small_request, wait_for

SPAN = {"start": "2022-01-25", "end": "2022-02-12"}  # 3 eight-day periods over one 1° tile
BODY = {"region": {"bbox": [-108.0, 35.2, -107.5, 35.8]}, "grid": {"tile_size": 1.0, "resolution": 0.01},
        **SPAN, "products": ["MOD10A2"], "reducer": {"name": "snow_fraction"}, "email": "scientist@example.org"}
TILES = 3


def submit(clients: Clients) -> str:
    return application.submit(clients, JobRequest.model_validate(BODY)).job


def finish(settings: Settings, clients: Clients, job: str) -> None:
    with running_control(settings), running_workers(settings, 1, slots=2):
        wait_for(lambda: jobs.get(clients, job).state in ("SUCCEEDED", "FAILED"), 180, "the job")


def tile_rows(clients: Clients, job: str) -> list[tasks.TaskRow]:
    return [r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.stage == "modis"]


def tile_outputs(clients: Clients, job: str) -> dict[str, list[str]]:
    """The manifest's outputs of each tile task, by its date."""
    found = results.manifest(clients, job)
    assert found is not None
    return {t["date"]: t["outputs"] for t in found["tasks"] if t["stage"] == "modis"}


def ended(status: dict[str, Any]) -> dict[str, int]:
    return {state: count for state, count in status["counts"].items() if count}


def emails(mail: MailServer, job: str) -> int:
    return len([m for _, m in mail.messages() if job in str(m["Subject"])])


def queued_messages(clients: Clients) -> list[tasks.TaskRef]:
    return [tasks.TaskRef.decode(m.content) for q in clients.shard_queues for m in q.peek_messages(max_messages=32)]


@pytest.fixture
def first_run(settings: Settings, planetary: Planetary) -> tuple[Settings, Clients, str]:
    """The deployment after a first run of the request: its tiles are in the cache."""
    mine = on_stac(settings, planetary)
    clients = Clients(mine)
    clients.ensure_resources()
    job = submit(clients)
    finish(mine, clients, job)
    assert jobs.get(clients, job).state == "SUCCEEDED"
    assert {r.status for r in tile_rows(clients, job)} == {"SUCCEEDED"}
    return mine, clients, job


def test_a_repeat_is_settled_at_planning_and_ends_as_the_first(first_run: tuple[Settings, Clients, str],
                                                               mail: MailServer) -> None:
    mine, clients, first = first_run
    job = submit(clients)
    sweep.handle_plan(clients, json.dumps({"job": job}).encode())
    rows = tile_rows(clients, job)
    assert {r.status for r in rows} == {"CACHED"} and all(r.settled_at for r in rows)
    assert attempts.list_attempts(clients.tasks, parts(clients, job)) == []  # nothing claimed, nothing ran
    (reduction,) = [r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.stage == "reduce"]
    assert reduction.status == "QUEUED" and reduction.deps == 0  # released by the settle
    assert {ref.task for ref in queued_messages(clients) if ref.job == job} == {reduction.task}
    rollup = rollups.read(clients.tasks, parts(clients, job))
    assert rollup.counts["CACHED"] == TILES and rollup.stages["modis"]["CACHED"] == TILES
    assert sum(c["CACHED"] for c in rollup.tiles.values()) == TILES
    finish(mine, clients, job)
    status = jobs.status(clients, job)
    assert status["state"] == "SUCCEEDED" and ended(status) == {"CACHED": TILES, "SUCCEEDED": 1}
    assert tile_outputs(clients, job) == tile_outputs(clients, first)
    wait_for(lambda: emails(mail, job) == 1, 30, "the email")
    assert emails(mail, job) == 1
    assert [a.task for a in attempts.list_attempts(clients.tasks, parts(clients, job))] == [reduction.task]


def test_only_tasks_whose_every_output_is_surely_there_are_settled(first_run: tuple[Settings, Clients, str],
                                                                   mail: MailServer) -> None:
    mine, clients, first = first_run
    made = tile_outputs(clients, first)
    dates = sorted(made)
    gone, making = (made[d][0].removeprefix(names.TILE_OUTPUT_PREFIX) for d in dates[:2])
    clients.tiles.delete_blob(gone)  # its tile missing: made again
    clients.tiles.upload_blob(names.marker_blob(making), b"")  # a maker at work on it: the ordinary way
    job = submit(clients)
    sweep.handle_plan(clients, json.dumps({"job": job}).encode())
    by_date = {r.parameters()["date"]: r for r in tile_rows(clients, job)}
    assert by_date[dates[2]].status == "CACHED" and by_date[dates[2]].settled_at
    assert by_date[dates[0]].status == by_date[dates[1]].status == "QUEUED"
    sent = {ref.task for ref in queued_messages(clients) if ref.job == job}
    assert sent == {by_date[dates[0]].task, by_date[dates[1]].task}
    clients.tiles.delete_blob(names.marker_blob(making))  # its maker gone: the worker finds the tile made
    finish(mine, clients, job)
    rows = {r.parameters()["date"]: r for r in tile_rows(clients, job)}
    assert [rows[d].status for d in dates] == ["SUCCEEDED", "CACHED", "CACHED"]
    assert jobs.get(clients, job).state == "SUCCEEDED"
    assert tile_outputs(clients, job) == made
    wait_for(lambda: emails(mail, job) == 1, 30, "the email")


def test_a_tile_whose_read_fails_is_left_to_the_ordinary_way(first_run: tuple[Settings, Clients, str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _, clients, first = first_run
    made = tile_outputs(clients, first)
    dates = sorted(made)
    unreadable = made[dates[0]][0].removeprefix(names.TILE_OUTPUT_PREFIX)
    real = cache._apeek

    async def peek(blobs: Any, name: str) -> bytes:
        if name == unreadable:
            raise ServiceResponseError("connection cut")
        return await real(blobs, name)

    monkeypatch.setattr(cache, "_apeek", peek)
    job = submit(clients)
    sweep.handle_plan(clients, json.dumps({"job": job}).encode())
    by_date = {r.parameters()["date"]: r.status for r in tile_rows(clients, job)}
    assert [by_date[d] for d in dates] == ["QUEUED", "CACHED", "CACHED"]


def lost_settle(monkeypatch: pytest.MonkeyPatch, applied: bool) -> None:
    """The settle's write refused, or applied with its answer lost (a connection cut)."""
    real: Callable[..., Any] = rollups.MOVER.write

    def write(table: Any, job: str, changes: list[Any], moves: Any) -> Any:
        if any(op[1].get("SettledAt") for op in changes):
            if applied:
                real(table, job, changes, moves)
            raise ServiceResponseError("connection cut")
        return real(table, job, changes, moves)

    monkeypatch.setattr(rollups.MOVER, "write", write)


@pytest.mark.parametrize("applied", [False, True], ids=["refused", "answer-lost"])
def test_a_settle_refused_or_its_answer_lost_leaves_nothing_stuck_or_counted_twice(
        first_run: tuple[Settings, Clients, str], mail: MailServer, monkeypatch: pytest.MonkeyPatch,
        applied: bool) -> None:
    mine, clients, first = first_run
    lost_settle(monkeypatch, applied)
    job = submit(clients)
    sweep.handle_plan(clients, json.dumps({"job": job}).encode())
    statuses = {r.status for r in tile_rows(clients, job)}
    assert statuses == ({"CACHED"} if applied else {"QUEUED"})  # settled, or left to the workers
    sweep.handle_plan(clients, json.dumps({"job": job}).encode())  # the plan message handled again
    monkeypatch.undo()
    finish(mine, clients, job)
    status = jobs.status(clients, job)
    assert status["state"] == "SUCCEEDED" and ended(status) == {"CACHED": TILES, "SUCCEEDED": 1}
    ran = {a.task for a in attempts.list_attempts(clients.tasks, parts(clients, job))}
    assert len(ran) == (1 if applied else TILES + 1)
    assert tile_outputs(clients, job) == tile_outputs(clients, first)
    wait_for(lambda: emails(mail, job) == 1, 30, "the email")
    assert emails(mail, job) == 1


def test_tasks_settled_ahead_of_the_cursor_take_no_place_in_the_window(
        settings: Settings, mail: MailServer) -> None:
    narrow = settings.with_(window=2)
    clients = Clients(narrow)
    clients.ensure_resources()
    job = application.submit(clients, small_request()).job
    sweep.handle_plan(clients, json.dumps({"job": job}).encode())  # tasks 0 and 1 released
    ahead = tasks.list_tasks(clients.tasks, parts(clients, job), 4, 4)
    assert transitions.settle(clients, ahead, {r.task: [f"tiles:made/{r.task}"] for r in ahead}) == 4
    planner.release(clients, job)  # the window is full: two QUEUED, whatever ended ahead of the cursor
    assert sorted(ref.task for ref in queued_messages(clients)) == [names.task_key(0), names.task_key(1)]
    with running_control(narrow), running_workers(narrow, 1, slots=1):
        wait_for(lambda: jobs.get(clients, job).state == "SUCCEEDED", 60, "the job")
    # The cursor passes the four settled tasks only if a top-up comes while one of the last two
    # is in flight; a job whose every task has ended is left as it is (planner.release).
    assert jobs.get(clients, job).released >= 4
    assert ended(jobs.status(clients, job)) == {"SUCCEEDED": 4, "CACHED": 4}
    wait_for(lambda: emails(mail, job) == 1, 30, "the email")
