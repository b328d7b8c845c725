"""A gather (``planning.TaskPlan.after_all``) waits for every other task of its job, whatever
their partitions: released once the job's counters say all the others have ended — by the
worker that ends the last, by the sweep if that worker died first, by the planner of a job
settled whole — queued once however many see it, and the job completes once, after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipeline import planning
from pipeline.lifecycle import jobs, planner, progress, rollups, sweep, tasks, transitions
from pipeline.lifecycle.status import TaskStatus
from pipeline.planning import TaskPlan
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from tests.conftest import PlanOnly, commit, in_an_hour, registered

BUCKETS = 3


class Plans(PlanOnly):
    """An application whose plan is given: six tasks spread over three partitions, a
    reduction-like task waiting for two of them, and two gathers."""

    def plan(self, settings: Settings, request: str, resolved: str, *, search: bool, limit: int) -> list[TaskPlan]:
        tiles = [TaskPlan("noop", {"tile": f"t{i}"}, feeds=(6,) if i < 2 else (), group=0 if i < 2 else None)
                 for i in range(6)]
        return [*tiles, TaskPlan("noop", {"tile": "t0"}, waits_for=2, group=0),
                TaskPlan("noop", {}, after_all=True), TaskPlan("noop", {}, after_all=True)]


@pytest.fixture
def application() -> Iterator[Plans]:
    plans = Plans()
    with registered(plans):
        yield plans


def spread(settings: Settings) -> Clients:
    clients = Clients(settings.with_(partitions=BUCKETS, shards=BUCKETS))
    clients.ensure_resources()
    return clients


def submitted(clients: Clients, plans: Plans) -> jobs.JobRow:
    row = jobs.submit(clients, "{}", plans.plan(clients.settings, "{}", "", search=False, limit=100))
    planner.plan(clients, row.job)
    return jobs.get(clients, row.job)


def end(clients: Clients, row: jobs.JobRow, seq: int, follow: bool = True) -> None:
    (task,) = tasks.list_tasks(clients.tasks, row.parts, seq, 1)
    if task.status is TaskStatus.PENDING:
        transitions.queue(clients, [task])
    held = transitions.claim(clients, task.ref, "w", in_an_hour)
    assert held is not None
    assert commit(clients, rollups.RollupWriter("w"), held, TaskStatus.SUCCEEDED, [])
    if follow:
        progress.task_ended(clients, row.job)


def states(clients: Clients, row: jobs.JobRow) -> list[TaskStatus]:
    return [r.status for r in tasks.list_tasks(clients.tasks, row.parts)]


def test_a_plan_lists_its_gathers_last_and_they_wait_for_no_counter() -> None:
    plain = TaskPlan("noop", {})
    assert planning.gathers([plain, TaskPlan("noop", {}, after_all=True)]) == 1
    with pytest.raises(ValueError, match="after all others"):
        planning.gathers([TaskPlan("noop", {}, after_all=True), plain])
    with pytest.raises(ValueError, match="no counter"):
        planning.gathers([plain, TaskPlan("noop", {}, after_all=True, group=0)])
    with pytest.raises(ValueError, match="waits for 0 tasks, 1 feed"):
        planning.releasable([TaskPlan("noop", {}, feeds=(1,)), TaskPlan("noop", {}, after_all=True)])


def test_gathers_are_released_once_every_other_task_of_every_partition_has_ended(
        settings: Settings, application: Plans) -> None:
    clients = spread(settings)
    row = submitted(clients, application)
    assert (row.total, row.tiles, row.gathers, row.buckets) == (9, 6, 2, BUCKETS)
    assert {r.part for r in tasks.list_tasks(clients.tasks, row.parts)} == set(row.parts)
    for seq in range(6):
        end(clients, row, seq)
    found = states(clients, row)
    assert found[6] is TaskStatus.QUEUED, "the waiting task released by its counter"
    assert found[7:] == [TaskStatus.PENDING] * 2, "the gathers wait while a task of the job has not ended"
    end(clients, row, 6)
    assert states(clients, row)[7:] == [TaskStatus.QUEUED] * 2
    messages = [tasks.TaskRef.decode(m.content) for q in clients.shard_queues for m in q.peek_messages(32)]
    gathers = {r.task for r in tasks.list_tasks(clients.tasks, row.parts, 7, 2)}
    assert sorted(m.task for m in messages if m.task in gathers) == sorted(gathers), "each sent once"
    assert planner.release_gathers(clients, jobs.get(clients, row.job), 7) == 0, "queued once, whoever asks"
    end(clients, row, 7)
    assert jobs.get(clients, row.job).state.value == "RUNNING"
    end(clients, row, 8)
    assert clients.done_queue.peek_messages(), "the job announced done after its last gather"


def test_the_sweep_releases_the_gathers_of_a_job_whose_last_ender_died(
        settings: Settings, application: Plans) -> None:
    clients = spread(settings)
    row = submitted(clients, application)
    for seq in range(7):
        end(clients, row, seq, follow=False)  # no follow-up: as if each worker died after its commit
    assert states(clients, row)[7:] == [TaskStatus.PENDING] * 2
    sweep.sweep(clients)
    assert states(clients, row)[7:] == [TaskStatus.QUEUED] * 2


def test_a_cancelled_job_never_releases_its_gathers(settings: Settings, application: Plans) -> None:
    clients = spread(settings)
    row = submitted(clients, application)
    for seq in range(3):
        end(clients, row, seq)
    jobs.cancel(clients, row.job, "test")
    assert states(clients, row)[7:] == [TaskStatus.CANCELLED] * 2
    assert planner.release_gathers(clients, jobs.get(clients, row.job), 9) == 0
