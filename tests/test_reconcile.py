"""No task depends on a message surviving, and no job on one process finishing its step:
each window of the task lifecycle where a message could be lost, poisoned or held, or a
process could stop between two writes, ends with every task terminal and the job finished
once (the reconciler in the sweep, the finisher's lease, the per-job guard of the sweep)."""

from __future__ import annotations

import json
import time
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ServiceRequestError

from bagpipe.mailserver import MailServer
from pipeline.failures import FailureClass
from pipeline.lifecycle import dispatch, jobs, sweep, tasks, transitions
from pipeline.lifecycle.status import TaskStatus
from pipeline.modis.products import CATALOG
from pipeline.reduction import reducers
from pipeline.reduction.stage import MAX_OUTPUTS, run_program
from pipeline.requests import application
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web import jobview
from tests.conftest import (
    PIDS,
    parts,
    queue_depth,
    running_control,
    running_workers,
    small_request,
    wait_for,
    with_stage,
)
from tests.test_monitor import alive
from tests.test_worker import planned_job, receive_one


def fast(settings: Settings, **changes: Any) -> tuple[Settings, Clients]:
    """The deployment with the shortest lease, so that stale dispatches fall due in seconds."""
    settings = settings.with_(lease_seconds=3, monitor_interval_s=0.5, **changes)
    clients = Clients(settings)
    clients.ensure_resources()
    return settings, clients


def finished(clients: Clients, job: str) -> bool:
    return jobs.get(clients, job).state.finished


def emails_for(mail: MailServer, job: str) -> list[EmailMessage]:
    return [m for _, m in mail.messages() if job in str(m["Subject"])]


def index_left(clients: Clients, job: str) -> list[str]:
    rows = clients.tasks.query_entities("PartitionKey eq @pk and RowKey ge '~' and RowKey lt '~~'",
                                        parameters={"pk": job}, select=["RowKey"])
    return [r["RowKey"] for r in rows if r["RowKey"].startswith((names.DEADLINE_PREFIX, names.DISPATCH_PREFIX))]


def test_a_reduction_whose_message_is_lost_is_sent_again(settings: Settings, mail: MailServer,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The reduction's release is one conditional write with its dispatch entry; its message
    lost after it (a send that failed, a releaser that died) is resent by the reconciler."""
    settings, clients = fast(settings, stage_modules="tests.harness.fault_stage", tile_stage="fault_tile")
    real_send = dispatch.send
    dropped: list[str] = []

    def lose_the_first_reduction(clients: Clients, messages: Any, delay_s: int = 0, per_message: int = 1) -> int:
        kept = []
        for shard, ref in messages:
            if int(ref.task) >= 8 and not dropped:
                dropped.append(ref.task)
            else:
                kept.append((shard, ref))
        return real_send(clients, kept, delay_s, per_message)

    monkeypatch.setattr(dispatch, "send", lose_the_first_reduction)
    with running_control(settings), running_workers(settings):
        job = planned_job(clients, region={"bbox": [-110.9, 35.1, -109.1, 35.9]}, grid={"resolution": 0.0625},
                          reducer={"name": "max_composite"})
        wait_for(lambda: finished(clients, job), 90, "the job to finish")
    ended = jobs.get(clients, job)
    assert ended.state == "SUCCEEDED", (ended, [(r.task, r.stage, r.status, r.last_failure, r.last_error)
                                                for r in tasks.list_tasks(clients.tasks, parts(clients, job))])
    assert dropped, "a reduction's message was lost"
    (row,) = [r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.task == dropped[0]]
    why = (row.last_failure, row.last_error)
    assert row.stage == "reduce" and row.status == "SUCCEEDED" and row.resends >= 1, why
    assert len(emails_for(mail, job)) == 1 and index_left(clients, job) == []


def test_a_message_delivered_many_times_is_settled_by_its_row_not_poisoned(
        settings: Settings, clients: Clients) -> None:
    """Hand-backs and retries raise a message's dequeue count; the row decides, not the count."""
    job = planned_job(clients)
    queue, message = receive_one(clients)
    for _ in range(25):
        queue.update_message(message.id, pop_receipt=message.pop_receipt, visibility_timeout=0)
        message = next(m for m in queue.receive_messages(max_messages=32, visibility_timeout=30)
                       if m.id == message.id)
    assert message.dequeue_count > 20
    queue.update_message(message.id, pop_receipt=message.pop_receipt, visibility_timeout=0)
    with running_control(settings), running_workers(settings):
        wait_for(lambda: finished(clients, job), 90, "the job to finish")
    assert jobs.get(clients, job).state == "SUCCEEDED"
    poison = clients.queue(settings.names.poison_queue(queue.queue_name))
    assert list(poison.peek_messages()) == []


def test_a_revocation_whose_message_is_lost_is_sent_again(settings: Settings, mail: MailServer,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    settings, clients = fast(settings)
    job = planned_job(clients)
    queue, message = receive_one(clients)
    held = transitions.claim(clients, tasks.TaskRef.decode(message.content), "w-gone", lambda *_: tasks.now())
    assert held is not None
    queue.delete_message(message)
    monkeypatch.setattr(dispatch, "send", lambda *a, **k: 0)  # the requeue's message never goes out
    assert sweep.sweep(clients)["revoked"] == 1
    row = tasks.get_task(clients.tasks, held.ref.partition, held.ref.task)
    assert row.status == "QUEUED" and row.attempt == 2 and row.dispatch
    monkeypatch.undo()
    with running_control(settings), running_workers(settings):
        wait_for(lambda: finished(clients, job), 90, "the job to finish")
    row = tasks.get_task(clients.tasks, held.ref.partition, held.ref.task)
    assert row.status == "SUCCEEDED" and row.attempt == 2 and row.resends >= 1
    assert len(emails_for(mail, job)) == 1 and index_left(clients, job) == []


def test_messages_waiting_behind_older_ones_are_not_sent_again_and_lost_ones_are(settings: Settings) -> None:
    # no worker runs: the job's messages wait in their queues past their entries' due time
    settings, clients = fast(settings)
    job = planned_job(clients)
    queued = [r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.status is TaskStatus.QUEUED]
    depth = queue_depth(clients)
    assert len(queued) >= 4 and depth == len(queued)
    time.sleep(2 * settings.lease_seconds + 1)  # their entries fall due
    assert dispatch.redispatch_due(clients, parts(clients, job)) == 0
    assert queue_depth(clients) == depth  # no duplicate
    assert {tasks.get_task(clients.tasks, r.part, r.task).resends for r in queued} == {1}  # their entries moved on
    for queue in clients.shard_queues:  # every message lost
        for message in queue.receive_messages(max_messages=32):
            queue.delete_message(message)
    later = planned_job(clients)  # and newer messages at the front of the queues
    depth = queue_depth(clients)
    time.sleep(2 * 2 * settings.lease_seconds + 1)  # the moved entries fall due
    assert dispatch.redispatch_due(clients, parts(clients, job)) == len(queued)
    assert queue_depth(clients) == depth + len(queued)
    with running_workers(settings):
        keys = {r.task for r in queued}
        wait_for(lambda: all(r.status is TaskStatus.SUCCEEDED for j in (job, later)
                             for r in tasks.list_tasks(clients.tasks, parts(clients, j)) if r.task in keys),
                 60, "both jobs' tile tasks")


def test_a_job_whose_plan_message_was_not_sent_is_planned_by_the_sweep(
        settings: Settings, mail: MailServer, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, clients = fast(settings)

    def refused(*_: object, **__: object) -> None:
        raise ServiceRequestError("queue service unreachable")

    monkeypatch.setattr(clients.plan_queue, "send_message", refused)
    job = application.submit(clients, small_request()).job  # accepted all the same
    assert jobs.get(clients, job).state == "ACCEPTED"
    monkeypatch.undo()
    with running_control(settings), running_workers(settings):
        wait_for(lambda: finished(clients, job), 90, "the job to finish")
    row = jobs.get(clients, job)
    assert row.state == "SUCCEEDED" and row.plan_tries >= 1
    assert len(emails_for(mail, job)) == 1


def test_the_cache_marker_of_a_maker_that_died_with_its_task_cancelled_is_swept(
        settings: Settings, clients: Clients) -> None:
    """A worker killed while making a tile leaves the tile's marker; when its task is then
    cancelled no retry comes back to tidy it, and no other task need ever want that tile."""
    job = planned_job(clients)
    task = tasks.list_tasks(clients.tasks, parts(clients, job))[0].task
    marker = clients.tiles.get_blob_client(names.marker_blob(f"00/{job}/MOD10A2.x.tif"))
    marker.upload_blob(b"", metadata={"owner": f"{job}/{task}"})
    sweep.sweep(clients)
    assert marker.exists(), "its task is still queued: a retry of it takes the marker over"
    jobs.cancel(clients, job, owner="test-cancel")
    # well within STALE_S (30 s), after which any marker goes: it is the cancelled owner that counts
    wait_for(lambda: sweep.sweep(clients)["markers"] == 1 or not marker.exists(), 10, "the sweep to remove it")
    assert not marker.exists()


def test_a_job_that_no_longer_fits_the_deployment_fails_saying_why(
        settings: Settings, mail: MailServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between its submit and its planning the deployment stopped serving its product (a new
    version of the catalog): the plan cannot be made, so the job ends FAILED, with the reason
    in its status, its manifest and its one email (not a plan message poisoned and the job
    ACCEPTED for ever)."""
    settings, clients = fast(settings)
    job = application.submit(clients, small_request()).job
    monkeypatch.delitem(CATALOG, "MOD10A2")
    with running_control(settings):
        wait_for(lambda: finished(clients, job), 60, "the job to end")
    status = jobs.status(clients, job)
    assert status["state"] == "FAILED" and "products" in status["error"] and "MOD10A2" in status["error"]
    (email,) = emails_for(mail, job)
    assert "failed" in str(email["Subject"]) and "MOD10A2" in email.get_content()


def test_one_broken_job_does_not_stop_the_sweep_for_the_others(settings: Settings, clients: Clients) -> None:
    broken = planned_job(clients)
    clients.jobs.update_entity({"PartitionKey": broken, "RowKey": names.JOB_ROW, "State": "BOGUS"})
    job = planned_job(clients)
    ref = tasks.TaskRef(job, names.task_key(0), 1)
    assert transitions.claim(clients, ref, "w-gone", lambda *_: tasks.now()) is not None  # overdue at once
    report = sweep.sweep(clients)
    assert report["errors"] == 1 and report["revoked"] == 1
    assert clients.tasks.get_entity(ref.partition, ref.task)["Attempt"] == 2


def test_a_label_from_before_labels_were_one_line_does_not_stop_completion(
        settings: Settings, clients: Clients, mail: MailServer) -> None:
    job = planned_job(clients)
    clients.jobs.update_entity({"PartitionKey": job, "RowKey": names.JOB_ROW,
                                "Label": "winter\r\nBcc: everyone@example.org"})
    with running_control(settings), running_workers(settings):
        wait_for(lambda: finished(clients, job), 90, "the job to finish")
    (email,) = emails_for(mail, job)
    assert email["Bcc"] is None and str(email["Subject"]) == f"bagpipe job {job}: succeeded"
    assert 'Its label: "winter Bcc: everyone@example.org"' in email.get_body(("plain",)).get_content()


def test_a_lost_message_receipt_does_not_hide_a_revocation(settings: Settings) -> None:
    """The worker's renewal of its message fails from then on (the message is gone); the job
    is cancelled meanwhile: the stage is killed within a beat, not after its minute."""
    settings, clients = fast(with_stage(settings, "sleepy"))
    with running_control(settings), running_workers(settings):
        job = planned_job(clients)
        pid_file = PIDS / f"{job}-sleepy.pid"
        wait_for(pid_file.exists, 60, "the long stage to start")
        for queue in clients.shard_queues:
            queue.clear_messages()
        jobs.cancel(clients, job, owner="test")
        pid = int(pid_file.read_text())
        wait_for(lambda: not alive(pid), 3 * settings.lease_seconds, "the stage to be killed")
        wait_for(lambda: finished(clients, job), 30, "the job to end")
    assert jobs.get(clients, job).state == "CANCELLED"


def test_credentials_in_an_error_never_reach_a_row_a_view_or_a_log(
        settings: Settings, clients: Clients, caplog: pytest.LogCaptureFixture) -> None:
    settings = with_stage(settings, "leaky", max_attempts=2)
    clients = Clients(settings)
    clients.ensure_resources()
    with running_control(settings), running_workers(settings):
        job = planned_job(clients)
        wait_for(lambda: finished(clients, job), 90, "the job to finish")
    kept = json.dumps([dict(r) for r in clients.tasks.query_entities("PartitionKey eq @pk",
                                                                     parameters={"pk": job})], default=str)
    kept += json.dumps(jobview.view(clients, job), default=str) + caplog.text
    kept += clients.products.download_blob(names.manifest_blob(job)).readall().decode()
    assert "modiseuwest.blob.core.windows.net" in kept, "the error is kept, saying where it failed"
    for secret in ("TOPSECRETSIGNATURE", "hunter2secret", "TOPSECRETACCOUNTKEY"):
        assert secret not in kept


def test_a_reduction_that_leaves_too_many_files_fails_naming_the_limit(tmp_path: Path) -> None:
    (tmp_path / "many.py").write_text(
        "import json, os, sys\nout = json.load(open(sys.argv[1]))['outputs_dir']\n"
        "for i in range(150):\n    open(os.path.join(out, f'part-{i:04d}.txt'), 'w').write('x')\n")
    (tmp_path / "reducer.json").write_text(json.dumps(
        {"name": "many", "argv": ["{python}", "{here}/many.py", "{task}"], "outputs": ["*.txt"]}))
    program = reducers.load(tmp_path / "reducer.json")
    run = run_program(program, [], tmp_path / "run", {"args": {}, "missing_dates": []})
    failure = run.failure(program)
    assert failure is not None and failure.failure is FailureClass.USER_CODE
    assert "150 output files" in str(failure) and f"at most {MAX_OUTPUTS}" in str(failure)


def test_a_stage_whose_outputs_a_row_cannot_name_fails_as_its_own_error(settings: Settings) -> None:
    """Whatever the stage: names past what a task row holds are the stage's error (the task
    dies, classified), not a commit that fails until the budget is spent."""
    settings = with_stage(settings, "many_outputs", max_attempts=2)
    clients = Clients(settings)
    clients.ensure_resources()
    with running_control(settings), running_workers(settings):
        job = planned_job(clients, region={"tiles": ["h10v05"]}, end="2022-01-10")
        wait_for(lambda: finished(clients, job), 90, "the job to finish")
    (dead,) = [t for t in tasks.list_tasks(clients.tasks, parts(clients, job)) if t.status == "DEAD"]
    assert dead.last_failure == "user_code_error" and "characters a task row can name" in dead.last_error
    assert dead.attempt == 2  # the same error twice on the same input: dead at once
