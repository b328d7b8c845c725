"""What follows for a job when one of its tasks ends (``pipeline.lifecycle.progress``), against
a real Azurite: the window is topped up as tasks end, the last task's end announces the job
once, a worker looks at a job's window at most every JOB_CHECK_S while it still releases or
many of its tasks are unended but sees its last task at once, and the sweep goes on with a
cancellation and announces it."""

from __future__ import annotations

import dataclasses
import time

import pytest

from pipeline.lifecycle import jobs, progress, rollups, sweep, tasks, transitions
from pipeline.lifecycle.status import JobState, TaskStatus
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from tests.conftest import commit, in_an_hour, parts, running_workers, wait_for
from tests.test_worker import planned_job, receive_one

# it times workers, attempts or links: `make test` runs it alone, not beside other tests
pytestmark = pytest.mark.alone

WINDOW = 2  # the job's 8 tasks go out two at a time


@pytest.fixture
def narrow(settings: Settings) -> Clients:
    found = Clients(dataclasses.replace(settings, window=WINDOW, lease_seconds=1))
    found.ensure_resources()
    return found


def _end_one(clients: Clients, counter: rollups.RollupWriter, job: str) -> None:
    """Take one of the job's released tasks, run nothing, and commit it (as a worker would);
    messages of other jobs' cancelled tasks are settled on the way, as a worker settles them."""
    while True:
        queue, message = receive_one(clients)
        ref = tasks.TaskRef.decode(message.content)
        held = transitions.claim(clients, ref, "test", in_an_hour) if ref.job == job else None
        if held is None:
            queue.delete_message(message)
            continue
        assert commit(clients, counter, held, TaskStatus.SUCCEEDED, [])
        queue.delete_message(message)
        return


def _announced(clients: Clients, job: str) -> int:
    return sum(sweep.job_of_message(m.content) == job for m in clients.done_queue.peek_messages(max_messages=32))


def _released(clients: Clients, job: str) -> int:
    return jobs.get(clients, job).released


def test_each_end_tops_up_the_window_and_only_the_last_announces(narrow: Clients) -> None:
    job = planned_job(narrow)
    total = jobs.get(narrow, job).total
    assert total == 8 and _released(narrow, job) == WINDOW
    counter = rollups.RollupWriter("test")
    for ended in range(1, total + 1):
        _end_one(narrow, counter, job)
        announced = progress.task_ended(narrow, job)
        assert announced == (ended == total)
        assert _released(narrow, job) == min(total, ended + WINDOW)  # the window is full again
        assert _announced(narrow, job) == (ended == total)
    assert sum(tasks.terminal_counts(narrow.tasks, parts(narrow, job)).values()) == total


def test_a_worker_looks_at_a_releasing_job_now_and_then_and_at_its_last_task_at_once(
    narrow: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(progress, "JOB_CHECK_S", 0.5)
    job = planned_job(narrow)
    watch = progress.Watch(narrow)
    counter = rollups.RollupWriter("test")
    _end_one(narrow, counter, job)
    watch.task_ended(job)  # the first look: one task ended, one more released
    assert _released(narrow, job) == 3
    _end_one(narrow, counter, job)
    watch.task_ended(job)  # within JOB_CHECK_S of the last look: no look
    assert _released(narrow, job) == 3
    time.sleep(0.5)
    watch.task_ended(job)  # the next look sees both ends
    assert _released(narrow, job) == 4
    ended = 2
    while _released(narrow, job) < 8:  # the look that releases the last tile task knows it
        time.sleep(0.5)
        _end_one(narrow, counter, job)
        ended += 1
        watch.task_ended(job)
    while ended < 8:  # from then on every end is looked at, however soon after the last
        assert _announced(narrow, job) == 0
        _end_one(narrow, counter, job)
        ended += 1
        watch.task_ended(job)
    assert _announced(narrow, job) == 1


def test_a_released_job_is_looked_at_now_and_then_until_few_of_its_tasks_are_left(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All released, a job's ends are looked at every JOB_CHECK_S while more than NEAR_END of
    its tasks were unended at the last look; each end once that look saw no more."""
    monkeypatch.setattr(progress, "NEAR_END", 2)
    clients = Clients(settings)  # its window holds the job's 8 tasks: all released at planning
    clients.ensure_resources()
    job = planned_job(clients)
    watch, counter = progress.Watch(clients), rollups.RollupWriter("test")
    looks: list[int] = []
    real = progress._follow
    monkeypatch.setattr(progress, "_follow", lambda *a, **k: looks.append(1) or real(*a, **k))
    _end_one(clients, counter, job)
    watch.task_ended(job)  # the first look: 7 unended
    for _ in range(4):
        _end_one(clients, counter, job)
        watch.task_ended(job)  # within JOB_CHECK_S of that look, and the end was not near: no look
    assert len(looks) == 1
    monkeypatch.setattr(progress, "JOB_CHECK_S", 0.0)
    _end_one(clients, counter, job)
    watch.task_ended(job)  # a look, now and then: 2 unended, near the end
    monkeypatch.setattr(progress, "JOB_CHECK_S", 60.0)
    _end_one(clients, counter, job)
    watch.task_ended(job)  # looked at, however soon
    assert len(looks) == 3 and _announced(clients, job) == 0
    _end_one(clients, counter, job)
    watch.task_ended(job)
    assert len(looks) == 4 and _announced(clients, job) == 1


def test_the_sweep_goes_on_with_a_cancellation_and_announces_it(narrow: Clients) -> None:
    job = planned_job(narrow)
    row = jobs.get(narrow, job)
    row = jobs.update(narrow, row, state=JobState.CANCELLING)
    swept = rollups.RollupWriter("sweep-test")
    # the first pass cancels every task; the job, just changed, may still be someone's to finish
    assert not progress.follow_up(narrow, swept, job, row)
    statuses = {r.status for r in tasks.list_tasks(narrow.tasks, parts(narrow, job))}
    assert statuses == {TaskStatus.CANCELLED.value} and _announced(narrow, job) == 0
    time.sleep(narrow.settings.lease_seconds + 0.5)  # nobody announced it: the next pass does
    assert progress.follow_up(narrow, swept, job, jobs.get(narrow, job))
    assert _announced(narrow, job) == 1
    # a running job with room in its window is topped up, and not announced
    other = planned_job(narrow)
    _end_one(narrow, rollups.RollupWriter("test"), other)
    assert not progress.follow_up(narrow, swept, other, jobs.get(narrow, other))
    assert _released(narrow, other) == WINDOW + 1 and _announced(narrow, other) == 0


def test_an_end_looked_at_too_soon_is_looked_at_later_and_may_announce(
    narrow: Clients, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's last look saw tasks still to release; others released and ended them;
    its own end of the job's last task came too soon after that look to be looked at: its
    next pass looks, and announces the job, without another end and without the sweep."""
    monkeypatch.setattr(progress, "JOB_CHECK_S", 2.0)
    job = planned_job(narrow)
    watch = progress.Watch(narrow)
    counter = rollups.RollupWriter("test")
    _end_one(narrow, counter, job)
    watch.task_ended(job)  # its look: 3 of 8 released
    for _ in range(6):  # the others' ends, each looked at by its own worker
        _end_one(narrow, counter, job)
        assert not progress.task_ended(narrow, job)
    _end_one(narrow, counter, job)  # the last, ended here within JOB_CHECK_S of the look
    watch.task_ended(job)
    watch.catch_up()
    assert sum(tasks.terminal_counts(narrow.tasks, parts(narrow, job)).values()) == 8 and _announced(narrow, job) == 0
    time.sleep(2.0)
    watch.catch_up()
    assert _announced(narrow, job) == 1
    watch.catch_up()  # once
    assert _announced(narrow, job) == 1


def test_a_worker_alone_runs_a_narrow_job_to_its_announcement(narrow: Clients) -> None:
    """No sweep: each end a worker does not look at (too soon after its last look) is
    looked at on its loop's next pass once that time has passed, so the window is topped
    up and the last end announced by the worker alone."""
    job = planned_job(narrow)
    with running_workers(narrow.settings, slots=1):
        wait_for(lambda: _announced(narrow, job) == 1, 60, "the job announced by its worker")
    assert sum(tasks.terminal_counts(narrow.tasks, parts(narrow, job)).values()) == 8
