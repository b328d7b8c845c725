"""What a request would store is measured at submission (and at estimate): a request whose
job row or task rows would exceed what a table holds is refused with a 413 naming the field,
and nothing is written; one whose rows fit is stored and planned, on the real Azurite, right
up to the limits."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError
from fastapi.testclient import TestClient

from pipeline.lifecycle import jobs, planner, tasks
from pipeline.planning import RequestError
from pipeline.requests import application
from pipeline.requests.request import JobRequest, installed
from pipeline.settings import Settings
from pipeline.storage import limits
from pipeline.storage.clients import Clients
from pipeline.web.api import create_app
from tests.conftest import signed
from tests.test_api import changed, nothing_written


@pytest.fixture
def api(settings: Settings, clients: Clients, admin_token: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings), headers=signed(admin_token)) as client:
        yield client


def with_args(args: dict[str, Any], bbox: list[float] | None = None) -> dict[str, Any]:
    """A request of one 1° tile (or ``bbox``'s) over January 2022, reduced by snow_fraction with ``args``."""
    return changed(region={"bbox": bbox or [-107.0, 35.0, -106.0, 36.0]},
                   reducer={"name": "snow_fraction", "args": args})


def spread(text: str, count: int = 32) -> dict[str, str]:
    """``count`` arguments of ``text`` each (the API takes 32 of up to 1,000 characters)."""
    return {f"a{i:02d}": text for i in range(count)}


TOO_LARGE = [
    # (what, args, bbox, the row the message names)
    ("the job row: 17 arguments of 1,000 quotes (2 characters each)", spread('"' * 1000, 17), None, "job's row"),
    ("a task row: each é is 6 characters once JSON-escaped", spread("é" * 1000, 28), None, "reduce task's row"),
    ("a task row: each quote is 4 (escaped twice)", spread('"' * 1000, 10), None, "reduce task's row"),
    ("a task row: an emoji is 14", spread("😀" * 1000, 3), None, "reduce task's row"),
    ("a transaction: 100 reductions of 28 K each", spread('"' * 1000, 7), [-110.0, 30.0, -100.0, 40.0],
     "table transaction"),
]


@pytest.mark.parametrize("path", ["/api/jobs", "/api/estimate"])
@pytest.mark.parametrize("what,args,bbox,row", TOO_LARGE, ids=[t[0] for t in TOO_LARGE])
def test_arguments_too_large_to_store_are_refused_naming_reducer_args(
        api: TestClient, clients: Clients, path: str, what: str, args: dict[str, str], bbox: list[float] | None,
        row: str) -> None:
    response = api.post(path, json=with_args(args, bbox))
    assert response.status_code == 413, response.text
    answer = response.json()
    assert answer["field"] == "reducer.args" and row in answer["detail"], answer
    assert answer["size"] > answer["limit"]
    assert nothing_written(clients)


def fits(clients: Clients, request: JobRequest) -> bool:
    plan = application.plan(clients.settings, request)
    try:
        application.check_storable(clients, request, plan, "admin", installed("snow_fraction"))
    except RequestError as refused:
        assert refused.field == "reducer.args"
        return False
    return True


@pytest.mark.parametrize("char", ["é", '"', "😀", "\x01"], ids=["é", "quote", "emoji", "control"])
def test_the_largest_arguments_that_fit_are_stored_and_planned(clients: Clients, char: str) -> None:
    """The check's limit is the table's: the longest arguments it accepts are written by the
    planner into the reduction's row, and the row of one character more is refused by the
    table itself."""
    def request(n: int) -> JobRequest:
        return JobRequest.model_validate(with_args(spread(char * 1000, n // 1000) | {"last": char * (n % 1000)}))

    low, high = 0, 31_999
    assert not fits(clients, request(high))
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(clients, request(middle)) else (low, middle)
    job = application.submit(clients, request(low), owner="admin").job
    planner.plan(clients, job)
    (reduction,) = [t for t in tasks.list_tasks(clients.tasks, jobs.get(clients, job).parts) if t.stage == "reduce"]
    assert json.loads(reduction.parameters()["args"]) == request(low).reducer.args  # type: ignore[union-attr]
    over = request(high)  # one character more: the table refuses the row the check refused
    plan = application.plan(clients.settings, over)
    row = jobs.new_row(clients, over.model_dump_json(), plan, "admin", installed("snow_fraction").to_json())
    entity = (row.to_entity() if limits.oversized(row.to_entity())
              else tasks.task_entity(row.parts[-1], len(plan) - 1, plan[-1], clients.settings.shards))
    table = clients.jobs if entity is not None and "Request" in entity else clients.tasks
    with pytest.raises(HttpResponseError, match="PropertyValueTooLarge"):
        table.create_entity(entity)


SNOW = "MOD10A2.Maximum_Snow_Extent"
NEW_FIELDS = [
    # (what, the request's fields, the field named, the row the message names)
    ("a program's arguments under reduce: 17 of 1,000 quotes in the job's row",
     {"reduce": {"program": {"name": "snow_fraction", "args": spread('"' * 1000, 17)}}}, "reduce.program.args",
     "job's row"),
    ("a program's arguments under reduce: each quote is 4 in its row",
     {"reduce": {"program": {"name": "snow_fraction", "args": spread('"' * 1000, 10)}}}, "reduce.program.args",
     "reduce task's row"),
    ("derived layers whose text the job's row cannot hold: 8 of 4,090 characters",
     {"derive": {"MOD10A2": {f"d{i}": SNOW + " " * 4060 + "+ 1" for i in range(8)}}}, "derive", "job's row"),
    ("derived layers a tile task's row cannot hold: a tab is 2 characters in the job's row, 3 in the task's",
     {"derive": {"MOD10A2": {f"d{i}": SNOW + "\t" * 1800 + "+ 1" for i in range(8)}}}, "derive", "task's row"),
]


@pytest.mark.parametrize("path", ["/api/jobs", "/api/estimate"])
@pytest.mark.parametrize("what,fields,field,row", NEW_FIELDS, ids=[t[0] for t in NEW_FIELDS])
def test_the_other_fields_too_large_to_store_are_refused_by_name(
        api: TestClient, clients: Clients, path: str, what: str, fields: dict[str, Any], field: str,
        row: str) -> None:
    """Every field of a request is measured as it is stored: a reduction's program, derived
    layers (kept in the job's row and in each tile task's)."""
    response = api.post(path, json=changed(**fields))
    assert response.status_code == 413, response.text
    answer = response.json()
    assert answer["field"] == field and row in answer["detail"], answer
    assert answer["size"] > answer["limit"]
    assert nothing_written(clients)
