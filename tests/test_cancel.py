"""Cancel: no task starts after it, the job ends CANCELLED, and an email says so."""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest
from azure.data.tables import TableTransactionError

from bagpipe.mailserver import MailServer
from pipeline.lifecycle import attempts, jobs, planner, sweep, tasks, transitions
from pipeline.lifecycle.rollups import RollupWriter
from pipeline.lifecycle.status import JobState, TaskStatus
from pipeline.requests import application
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from tests.conftest import parts, running_control, running_workers, small_request, wait_for, with_stage


def test_cancel_stops_new_tasks_and_ends_cancelled(settings: Settings, mail: MailServer) -> None:
    settings = with_stage(settings, "slow")
    clients = Clients(settings)
    clients.ensure_resources()
    with running_control(settings), running_workers(settings):
        job = application.submit(clients, small_request(start="2022-01-01", end="2022-12-31")).job
        wait_for(lambda: sum(tasks.terminal_counts(clients.tasks, parts(clients, job)).values()) >= 5, 60,
                 "some progress")
        jobs.cancel(clients, job, owner="test-cancel")
        cancelled_at = tasks.now()
        wait_for(lambda: jobs.get(clients, job).state.finished, 60, "the job to end")
    assert jobs.get(clients, job).state == "CANCELLED"
    rows = tasks.list_tasks(clients.tasks, parts(clients, job))
    counts = Counter(r.status for r in rows)
    assert set(counts) <= {"SUCCEEDED", "CANCELLED"} and counts["CANCELLED"] > 50
    assert sum(counts.values()) == 92
    started = [a.started_at for a in attempts.list_attempts(clients.tasks, parts(clients, job))]
    assert started and max(started) < cancelled_at, "no attempt started after the cancel returned"
    # a task cancelled while it ran did not publish its output
    for row in rows:
        if row.status == "CANCELLED":
            assert "Outputs" not in clients.tasks.get_entity(row.part, row.task)  # as stored: nothing named
    (message,) = [m for _, m in mail.messages() if job in str(m["Subject"])]
    assert "cancelled" in str(message["Subject"])
    status = jobs.status(clients, job)
    assert status["counts"]["CANCELLED"] == counts["CANCELLED"]


def test_cancel_before_planning_plans_nothing_runnable(
    clients: Clients, control_loop: object, mail: MailServer
) -> None:
    job = application.submit(clients, small_request()).job
    jobs.cancel(clients, job, owner="test-cancel")
    wait_for(lambda: jobs.get(clients, job).state.finished, 60, "the job to end")
    assert jobs.get(clients, job).state == "CANCELLED"
    assert all(r.status == "CANCELLED" for r in tasks.list_tasks(clients.tasks, parts(clients, job)))
    assert sum(q.get_queue_properties().approximate_message_count for q in clients.shard_queues) == 0
    # the tasks it never planned are cancelled too, in its status and its manifest: it ended, all of it
    row = jobs.get(clients, job)
    status = jobs.status(clients, job)
    assert status["counts"]["CANCELLED"] == status["total"] == row.total and status["progress"] == 1.0, status
    manifest = json.loads(clients.products.download_blob(row.manifest).readall())
    assert manifest["counts"] == {"CANCELLED": row.total}, manifest["counts"]


def test_a_cancel_refused_again_and_again_gives_up_and_the_sweep_goes_on_with_it(
        clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    job = application.submit(clients, small_request()).job
    planner.plan(clients, job)
    writer = RollupWriter("test-cancel")
    refused: list[int] = []

    def always_refused(*_: object, **__: object) -> None:
        refused.append(1)
        raise TableTransactionError(message="UpdateConditionNotSatisfied")

    monkeypatch.setattr(writer, "write", always_refused)
    ended: list[bool] = []
    cancelling = threading.Thread(target=lambda: ended.append(transitions.cancel(clients, parts(clients, job), writer)),
                                  daemon=True)
    cancelling.start()
    cancelling.join(30)
    assert not cancelling.is_alive(), "the cancel still loops on a refusal that keeps coming back"
    assert ended == [False] and len(refused) <= transitions.CANCEL_TRIES * (len(parts(clients, job)) + 8)
    monkeypatch.undo()
    row = jobs.get(clients, job)
    jobs.update(clients, row, state=JobState.CANCELLING)
    sweep.sweep(clients)  # the sweep's pass goes on with the cancellation
    assert {r.status for r in tasks.list_tasks(clients.tasks, parts(clients, job))} == {TaskStatus.CANCELLED}
