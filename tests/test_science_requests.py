"""Reductions as a request asks for them, checked at the door: groups, inputs, built-ins,
expressions and baselines a request gets wrong are a 4xx naming the field, decided before
anything is stored or run (a hostile expression runs nothing); an estimate counts the tasks
a grouped reduction makes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from pipeline.reduction import AGGREGATE_STAGE, CLIMATOLOGY_STAGE
from pipeline.requests.expansion import expand
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from pipeline.web.api import create_app
from tests.conftest import signed

NDVI = "MOD13A1.500m_16_days_NDVI"
BASE: dict[str, Any] = {"region": {"bbox": [-108.0, 35.2, -107.5, 35.8]}, "grid": {"resolution": 0.01},
                        "start": "2022-01-01", "end": "2022-12-31", "products": ["MOD13A1"]}


def asking(reduce: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {**BASE, "reduce": reduce, **more}


@pytest.fixture
def api(settings: Settings, clients: Clients, admin_token: str) -> Iterator[TestClient]:
    with TestClient(create_app(settings), headers=signed(admin_token)) as client:
        yield client


HOSTILE = ["__import__('os').system('touch /tmp/pwned')", "().__class__.__bases__", "ndvi.__class__", "open('x')",
           "eval('1')", "lambda: 1", "[ndvi]", "ndvi[0]", "'text'", "10**10**10", "ndvi ** 1e308",
           "(" * 10_000 + "ndvi" + ")" * 10_000, "ndvi + " * 700 + "1", "x" * 5000, "unknown_name", "sqrt()",
           "where(ndvi, 1, 2)", "clip(ndvi, 1)", "min(ndvi)", "system(ndvi)", "ndvi.vci"]


@pytest.mark.parametrize("expression", HOSTILE)
def test_a_hostile_or_wrong_expression_is_a_400_naming_the_field_and_runs_nothing(
        api: TestClient, clients: Clients, expression: str) -> None:
    started = time.monotonic()
    answer = api.post("/api/jobs", json=asking({"by": "month", "inputs": {"ndvi": NDVI}, "expression": expression}))
    assert time.monotonic() - started < 5.0  # decided in milliseconds, whatever the text (a loaded machine's seconds)
    assert answer.status_code in (400, 422), answer.text
    assert answer.json()["field"].startswith("reduce.expression"), answer.json()
    assert not list(clients.jobs.list_entities())  # nothing stored, nothing planned


def test_the_baselines_names_ask_for_a_baseline(api: TestClient) -> None:
    answer = api.post("/api/estimate", json=asking({"inputs": {"ndvi": NDVI}, "expression": "ndvi.vci"}))
    assert answer.status_code == 400 and answer.json()["field"] == "reduce.expression"
    assert "reduce.baseline" in answer.json()["detail"]


WRONG = [
    ({"by": "fortnight", "reducer": "max"}, "reduce.by"),
    ({"reducer": "maximum"}, "reduce.reducer"),
    ({"reducer": "percentile"}, "reduce.reducer"),  # p missing
    ({"reducer": "percentile", "percentile": 150}, "reduce.percentile"),
    ({"reducer": "anomaly"}, "reduce.baseline"),
    ({"reducer": "mean", "inputs": ["MOD13A1.NDVI"]}, "reduce.inputs"),  # not a layer this request makes
    ({"reducer": "mean", "inputs": ["MOD11A1.LST_Day_1km"]}, "reduce.inputs"),  # not a product of the request
    ({"reducer": "mean", "inputs": {"Bad Name": NDVI}}, "reduce.inputs"),
    ({"reducer": "mean", "expression": "1"}, "reduce"),
    ({}, "reduce"),
    ({"reducer": "mean", "baseline": {"start": "2021-01-01", "end": "2019-01-01"}}, "reduce.baseline"),
    ({"reducer": "mean", "inputs": ["MOD13A1.500m_16_days_pixel_reliability"]}, "reduce.reducer"),  # class codes
    ({"reducer": "max", "program": {"name": "snow_fraction"}}, "reduce"),
]


@pytest.mark.parametrize(("reduce", "field"), WRONG, ids=[f for _, f in WRONG])
def test_a_reduction_asked_wrong_is_refused_naming_its_field(api: TestClient, reduce: dict[str, Any],
                                                             field: str) -> None:
    more = {"layers": {"MOD13A1": ["500m_16_days_NDVI", "500m_16_days_pixel_reliability"]}}
    answer = api.post("/api/estimate", json=asking(reduce, **more))
    assert answer.status_code in (400, 422), answer.text
    assert answer.json()["field"].startswith(field), answer.json()


def test_reduce_and_the_old_reducer_are_not_both_taken(api: TestClient) -> None:
    answer = api.post("/api/estimate", json=asking({"reducer": "max"}, reducer={"name": "snow_fraction"}))
    assert answer.status_code == 422 and "not both" in answer.json()["detail"]


def test_a_derived_layer_reads_its_own_products_layers_only(api: TestClient) -> None:
    body = {**BASE, "derive": {"MOD13A1": {"ratio": "MOD13A1.500m_16_days_NDVI / MOD11A1.LST_Day_1km"}}}
    answer = api.post("/api/estimate", json=body)
    assert answer.status_code == 400 and answer.json()["field"] == "derive.MOD13A1.ratio"
    clash = {**BASE, "derive": {"MOD13A1": {"500m_16_days_EVI": "MOD13A1.500m_16_days_NDVI"}}}
    assert api.post("/api/estimate", json=clash).status_code == 422  # not a derived layer's name


def test_an_estimate_counts_the_grouped_reductions_climatologies_and_baseline_tiles(api: TestClient,
                                                                                   settings: Settings) -> None:
    monthly = api.post("/api/estimate", json=asking({"by": "month", "reducer": "max"})).json()
    assert monthly["tasks"] == 23 + 12 and monthly["stages"][AGGREGATE_STAGE]["tasks"] == 12
    against = asking({"by": "month", "inputs": {"ndvi": NDVI}, "expression": "ndvi.zscore",
                      "baseline": {"start": "2019-01-01", "end": "2021-12-31"}})
    found = api.post("/api/estimate", json=against).json()
    assert found["stages"][CLIMATOLOGY_STAGE]["tasks"] == 12 and found["stages"][AGGREGATE_STAGE]["tasks"] == 12
    assert found["stages"][settings.tile_stage]["tasks"] == 23 + 3 * 23  # the span's dates and the baseline's


def test_every_group_kind_plans_its_reductions_and_their_dependencies() -> None:
    def planned(by: str) -> list[str]:
        specs = expand(JobRequest.model_validate(asking({"by": by, "reducer": "mean"})), 10_000)
        waiting = [s for s in specs if s.reduction is not None]
        for spec in waiting:  # every dependency is a tile task of a date in the group, listed before
            assert spec.group is not None
            for first, count in spec.deps:
                for seq in range(first, first + count):
                    assert specs[seq].reduction is None and spec.group.holds(specs[seq].date)
        return [s.group.key for s in waiting if s.group is not None]

    assert planned("span") == ["2022-01-01_2022-12-31"]
    assert planned("month") == [f"2022-{m:02d}" for m in range(1, 13)]
    assert planned("season") == ["2022-DJF", "2022-MAM", "2022-JJA", "2022-SON", "2023-DJF"]
    assert planned("year") == ["2022"]
    assert planned("days:64")[0] == "2022-01-01_2022-03-05" and len(planned("days:64")) == 6
    assert planned("month-of-year") == [f"month-{m:02d}" for m in range(1, 13)]
    assert len(planned("day-of-year")) == 23


def test_a_program_is_refused_inputs_its_manifest_does_not_take(api: TestClient) -> None:
    """snow_fraction reads MOD10A2's snow extent: on NDVI it would "succeed" with every pixel -1."""
    legacy = api.post("/api/estimate", json={**BASE, "reducer": {"name": "snow_fraction"}})
    assert legacy.status_code == 400 and legacy.json()["field"] == "reducer.name"
    assert "MOD10A2.Maximum_Snow_Extent" in legacy.json()["detail"]
    grouped = api.post("/api/estimate", json=asking({"by": "month", "program": {"name": "snow_fraction"}}))
    assert grouped.status_code == 400 and grouped.json()["field"] == "reduce.program.name"
    snow = {**BASE, "products": ["MOD10A2"], "start": "2022-01-01", "end": "2022-02-28"}
    assert api.post("/api/estimate", json={**snow, "reducer": {"name": "snow_fraction"}}).status_code == 200
    assert api.post("/api/estimate", json={**snow, "reduce": {"by": "month", "program": {"name": "snow_fraction"}}}
                    ).status_code == 200


def test_the_command_line_asks_for_a_grouped_reduction_a_baseline_and_a_derived_layer(
        settings: Settings, clients: Clients, admin_token: str) -> None:
    """``bagpipe submit`` says with flags what a request body says: the job it submits holds
    the reduction, its inputs, its baseline and a derived layer as the API took them."""
    from typer.testing import CliRunner

    from bagpipe.cli import app
    from bagpipe.serving import Served
    from pipeline.lifecycle import jobs

    served = Served(create_app(settings)).start()
    try:
        flags = ["--api", served.url, "--key", admin_token, "--bbox", "-108,35.2,-107.5,35.8", "--start", "2022-01-01",
                 "--end", "2022-12-31", "--product", "MOD13A1", "--layer", "MOD13A1.500m_16_days_NDVI",
                 "--derive", "MOD13A1.half=MOD13A1.500m_16_days_NDVI / 2",
                 "--by", "month", "--input", f"ndvi={NDVI}", "--input", "half=MOD13A1.half",
                 "--expression", "ndvi.zscore + half", "--aggregate", "max", "--baseline", "2019-01-01,2021-12-31",
                 "--name", "odd"]
        done = CliRunner().invoke(app, ["submit", *flags])
        assert done.exit_code == 0, done.output
        job = done.output.strip().splitlines()[-1]
        asked = json.loads(jobs.get(clients, job).request)
        assert asked["reduce"] == {"by": "month", "inputs": {"ndvi": NDVI, "half": "MOD13A1.half"},
                                   "expression": "ndvi.zscore + half", "aggregate": "max", "name": "odd",
                                   "baseline": {"start": "2019-01-01", "end": "2021-12-31"}} | {
            k: asked["reduce"][k] for k in ("reducer", "percentile", "program", "unit", "on_dependency_failure")}
        assert asked["derive"] == {"MOD13A1": {"half": "MOD13A1.500m_16_days_NDVI / 2"}}
        wrong = CliRunner().invoke(app, ["submit", *flags[:-4], "--reduce", "percentile:ninety"])
        assert wrong.exit_code != 0 and "percentile:P" in wrong.output
        refused = CliRunner().invoke(app, ["submit", *flags[:4], "--bbox", "-108,35.2,-107.5,35.8", "--start",
                                           "2022-01-01", "--end", "2022-01-31", "--product", "MOD13A1",
                                           "--reduce", "anomaly"])
        assert refused.exit_code != 0 and "reduce.baseline" in refused.output
    finally:
        served.stop()


def test_the_readmes_requests_are_taken_as_written(settings: Settings, clients: Clients, admin_token: str) -> None:
    """Every ``bagpipe submit`` of the README's "What you can ask for" is a request the API
    takes, with the reduction the text says it asks for."""
    import shlex
    from dataclasses import fields, replace
    from pathlib import Path

    from typer.testing import CliRunner

    from bagpipe.cli import app
    from bagpipe.serving import Served
    from pipeline.lifecycle import jobs

    readme = Path(__file__).parent.parent / "README.md"
    section = readme.read_text().split("## What you can ask for", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands = [shlex.split(line) for line in block.splitlines() if line.startswith("bagpipe submit")]
    assert len(commands) == 4
    deployed = next(f.default for f in fields(Settings) if f.name == "max_tasks")
    served = Served(create_app(replace(settings, max_tasks=deployed))).start()  # the deployment's limit
    try:
        asked = []
        for command in commands:
            # --yes: some are ten times the one before, which the command line asks about
            done = CliRunner().invoke(app, [*command[1:], "--yes", "--api", served.url, "--key", admin_token])
            assert done.exit_code == 0, (command, done.output)
            asked.append(json.loads(jobs.get(clients, done.output.strip().splitlines()[-1]).request)["reduce"])
    finally:
        served.stop()
    assert [(r["by"], r["reducer"] or r["expression"]) for r in asked] == [
        ("month", "mean"), ("season", "max"), ("month", "0.5 * ndvi.vci + 0.5 * lst.tci"), ("days:8", "mean")]
    assert asked[2]["baseline"] == {"start": "2003-01-01", "end": "2021-12-31"}
