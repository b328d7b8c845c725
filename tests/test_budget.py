"""A job's budget, against real workers and the sweep on Azurite: past it, the job stops,
keeps what it made and says why; within it, nothing changes."""

from __future__ import annotations

from collections import Counter

import pytest

from pipeline.lifecycle import costs, jobs, results, rollups, tasks
from pipeline.lifecycle.status import JobState, TaskStatus
from pipeline.requests import application
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from tests.conftest import parts, running_control, running_workers, small_request, wait_for, with_stage


def test_spent_is_the_committed_seconds_of_the_histograms_and_the_ended_tasks_calls() -> None:
    rollup = rollups.Rollup(counts=Counter({"SUCCEEDED": 3, "RUNNING": 2, "DEAD": 1}),
                            runtimes={"modis": Counter({rollups.runtime_bin(2.0): 3})})
    seconds = 3 * rollups.bin_seconds(rollups.runtime_bin(2.0))
    assert seconds == pytest.approx(6.0, rel=0.15)
    assert jobs.spent(rollup) == pytest.approx(costs.usd(seconds, 4))  # 4 tasks ended (3 and the dead one)
    assert jobs.spent(rollups.Rollup()) == 0


def test_a_job_past_its_budget_stops_keeping_what_it_made_and_says_why(settings: Settings) -> None:
    slow = with_stage(settings, "slow")  # 0.2 s a task, one slot: the sweep (every 0.5 s) catches it running
    clients = Clients(slow)
    clients.ensure_resources()
    request = small_request(region={"tiles": ["h09v05", "h10v05", "h11v05", "h12v05"]}, end="2022-02-28")
    budget = 2.5 * costs.usd(0.2, 1)  # two tasks' worth, about
    row = application.submit(clients, request, budget_usd=budget)
    assert row.total == 32
    with running_control(slow), running_workers(slow, 1, slots=1):
        wait_for(lambda: jobs.get(clients, row.job).state.finished, 120, "the job to end")
    ended = jobs.get(clients, row.job)
    assert ended.state is JobState.CANCELLED and ended.outcome is JobState.CANCELLED
    assert "budget" in ended.error and costs.dollars(budget) in ended.error
    found = Counter(t.status for t in tasks.list_tasks(clients.tasks, parts(clients, row.job)))
    assert 1 <= found[TaskStatus.SUCCEEDED] < 32 and found[TaskStatus.CANCELLED] >= 1, found  # stopped midway
    manifest = results.manifest(clients, row.job)
    assert manifest is not None and manifest["error"] == ended.error
    kept = [e for e in manifest["tasks"] if e["status"] == "SUCCEEDED"]
    assert len(kept) == found[TaskStatus.SUCCEEDED] and all(e["outputs"] for e in kept)  # what it made is named
    status = jobs.status(clients, row.job)
    assert status["error"] == ended.error and status["budget_usd"] == budget and status["started"]


def test_a_job_within_its_budget_runs_to_its_end(settings: Settings, clients: Clients) -> None:
    row = application.submit(clients, small_request(), budget_usd=10.0)
    with running_control(settings), running_workers(settings, 1):
        wait_for(lambda: jobs.get(clients, row.job).state.finished, 120, "the job to end")
    ended = jobs.get(clients, row.job)
    assert ended.state is JobState.SUCCEEDED and not ended.error and ended.budget_usd == 10.0
    assert ended.started_at is not None and ended.created_at <= ended.started_at <= ended.finished_at  # type: ignore[operator]
