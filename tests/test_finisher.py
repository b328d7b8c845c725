"""One completion and one email per job, whatever its finishers meet: a finisher holds the
job by a lease on its row, renewed while it works (a slow mail service does not let another
take it over); a row changed under it is read again; its own write applied with the answer
lost is known as its own, another's at the same microsecond is not; one that dies after
the email went out is taken over with the same Message-ID."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from datetime import timedelta
from email.message import EmailMessage
from typing import Any

import pytest
from azure.core.exceptions import ServiceRequestError
from azure.storage.queue import QueueClient

from bagpipe import control
from bagpipe.mailserver import MailServer
from pipeline.lifecycle import completion, jobs, sweep, tasks
from pipeline.lifecycle.notify import mailer_for
from pipeline.lifecycle.status import JobState
from pipeline.modis import overview
from pipeline.requests import application
from pipeline.settings import Settings
from pipeline.storage import names, packing
from pipeline.storage.clients import Clients
from tests.conftest import job_write_answer_lost, parts, running_control, running_workers, small_request, wait_for
from tests.test_reconcile import emails_for, fast
from tests.test_worker import planned_job


class SlowMail:
    """The mail service answering only after ``seconds`` (then the real SMTP server)."""

    def __init__(self, settings: Settings, seconds: float) -> None:
        self.real, self.seconds, self.sent = mailer_for(settings), seconds, 0

    def send(self, message: EmailMessage) -> None:
        time.sleep(self.seconds)
        self.real.send(message)
        self.sent += 1


def ended_job(settings: Settings) -> tuple[Settings, Clients, str]:
    """A job of 8 tasks, every one ended by the workers, not finished yet (no control loop)."""
    settings, clients = fast(settings)
    job = planned_job(clients)
    with running_workers(settings):
        wait_for(lambda: sum(tasks.terminal_counts(clients.tasks, parts(clients, job)).values()) == 8, 60, "every task")
    return settings, clients, job


def test_a_finisher_slower_than_its_lease_is_not_overtaken(settings: Settings, mail: MailServer) -> None:
    """While one finisher waits three leases for the mail service, the sweep and the done
    handler keep looking at the job: nobody takes it over, one email goes out."""
    settings, clients, job = ended_job(settings)
    slow = SlowMail(settings, 3 * 2 * settings.lease_seconds)
    first = threading.Thread(target=lambda: completion.complete(clients, slow, job))
    first.start()
    others = SlowMail(settings, 0)
    while first.is_alive():
        sweep.sweep(clients)
        for message in clients.done_queue.receive_messages(max_messages=8):
            sweep.handle_done(clients, others, message.content)
            clients.done_queue.delete_message(message)
        completion.complete(clients, others, job)
        time.sleep(0.5)
    first.join()
    assert jobs.get(clients, job).state == "SUCCEEDED"
    assert (slow.sent, others.sent) == (1, 0) and len(emails_for(mail, job)) == 1


def test_a_finisher_whose_row_changed_under_it_looks_again_and_finishes(
        settings: Settings, mail: MailServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job complete, its done message handled while a release (the sweep's) takes its lease
    on the cursor: the finisher's hold, fenced on the row it read, is refused; it reads the
    row again and finishes the job then, with its one email — not a lease later, by the sweep."""
    settings, clients, job = ended_job(settings)
    final_state, changed = completion._final_state, list[bool]()

    def releaser_meanwhile(clients: Clients, row: jobs.JobRow) -> Any:
        if not changed:
            changed.append(True)
            jobs.update(clients, row, releaser_until=tasks.now())  # after the finisher's read of the row
        return final_state(clients, row)

    monkeypatch.setattr(completion, "_final_state", releaser_meanwhile)
    assert completion.complete(clients, mailer_for(settings), job)
    assert changed and jobs.get(clients, job).state == "SUCCEEDED"
    assert len(emails_for(mail, job)) == 1


@pytest.mark.parametrize("write", ["state", "notified_at"], ids=["its hold", "the email's record"])
def test_a_finisher_whose_write_applied_with_its_answer_lost_goes_on(
        settings: Settings, mail: MailServer, monkeypatch: pytest.MonkeyPatch, write: str) -> None:
    """The finisher's hold (or, the email sent, its record) applied, its answer lost and the
    client's retry refused (the row has changed: by that very write): the row read again
    names this finisher and shows the write, so it finishes the job now, with one email —
    not a hold given up, the job left to the sweep a lease later (and, after the email's
    record, the email sent again by the next finisher)."""
    settings, clients, job = ended_job(settings)
    lost = job_write_answer_lost(monkeypatch, clients, lambda fields: write in fields)
    assert completion.complete(clients, mailer_for(settings), job)
    monkeypatch.undo()
    assert lost and jobs.get(clients, job).state == "SUCCEEDED"
    sweep.sweep(clients)
    assert len(emails_for(mail, job)) == 1


def test_a_finisher_refused_by_another_writing_at_the_same_microsecond_leaves_the_job_to_it(
        settings: Settings, mail: MailServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another finisher takes its hold between this finisher's read of the row and its own
    hold, their clocks agreeing to the microsecond: the refused hold is not taken for this
    finisher's own (as a row's time would have it), so it leaves the job to the other — not
    two finishers holding it, each sending the email."""
    settings, clients, job = ended_job(settings)
    final_state, moment, other = completion._final_state, tasks.now(), "another finisher"

    def another_finisher_meanwhile(clients: Clients, row: jobs.JobRow) -> Any:
        outcome = final_state(clients, row)
        if row.state is JobState.RUNNING:  # after this finisher's read of the row
            jobs.update(clients, row, state=JobState.FINISHING, outcome=outcome, finisher=other,
                        finisher_until=tasks.now() + timedelta(minutes=5))
        return outcome

    monkeypatch.setattr(completion, "_final_state", another_finisher_meanwhile)
    monkeypatch.setattr(jobs, "now", lambda: moment)
    assert not completion.complete(clients, mailer_for(settings), job)
    row = jobs.get(clients, job)
    assert (row.state, row.finisher) == (JobState.FINISHING, other)
    assert emails_for(mail, job) == []


def test_a_finisher_that_dies_after_sending_is_taken_over_with_the_same_message_id_once_it_would_have_recorded(
        settings: Settings, mail: MailServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finisher that dies between its send and its record: the next one waits while the
    sender could still be recording (its storage refusing it), then sends with the same
    Message-ID (a process's death there is the one window where the email goes twice)."""
    settings, clients, job = ended_job(settings)
    monkeypatch.setattr(completion, "MAIL_RECORD_LEASES", 0)  # the wait: two leases (6 s)

    class Dies(SlowMail):
        def send(self, message: EmailMessage) -> None:
            self.real.send(message)  # it went out; the process dies before it records so
            raise SystemExit("killed")

    with pytest.raises(SystemExit):
        completion.complete(clients, Dies(settings, 0), job)
    assert jobs.get(clients, job).state == "FINISHING"
    assert not completion.complete(clients, mailer_for(settings), job)  # the sender may still be recording
    wait_for(lambda: completion.complete(clients, mailer_for(settings), job), 20, "the job to be taken over")
    sent = emails_for(mail, job)
    ids = {str(m["Message-ID"]).strip() for m in sent}
    assert len(sent) == 2 and ids == {jobs.get(clients, job).mail_id}


@pytest.mark.parametrize("portal", ["https://bagpipe.example.org/portal", ""], ids=["portal set", "none"])
def test_the_email_links_the_jobs_page_where_the_portal_is(settings: Settings, mail: MailServer, portal: str) -> None:
    """With the portal's public address set, the email names the job's page there (its
    fragment route, a slash put between); without, no page is named."""
    settings, clients, job = ended_job(settings.with_(portal_url=portal))
    assert completion.complete(clients, mailer_for(settings), job)
    (email,) = emails_for(mail, job)
    text = email.get_body(("plain",)).get_content().splitlines()  # type: ignore[union-attr]
    if portal:
        assert f"Its page, with its tiles on the map and its overviews: {portal}/#/jobs/{job}" in text
    else:
        assert not [line for line in text if "#/jobs/" in line or "Its page" in line]


def test_a_refused_record_of_the_email_sends_no_second_email(
        settings: Settings, mail: MailServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The email went out and storage refused its record (every retry the client made):
    the finisher records it again once storage answers, and finishes; no finisher after it
    sends the email again."""
    settings, clients, job = ended_job(settings)
    real, refused = clients.jobs.update_entity, list[int]()

    def record_refused(entity: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        if jobs.JobRow.stored_names()["notified_at"] in entity and len(refused) < 2:
            refused.append(1)
            raise ServiceRequestError("injected: storage unreachable")
        return real(entity, *args, **kwargs)

    monkeypatch.setattr(clients.jobs, "update_entity", record_refused)
    with contextlib.suppress(ServiceRequestError):
        completion.complete(clients, mailer_for(settings), job)
    monkeypatch.undo()
    assert refused == [1, 1]
    completion.complete(clients, mailer_for(settings), job)  # the done message again, or the sweep's
    sweep.sweep(clients)
    row = jobs.get(clients, job)
    assert row.state is JobState.SUCCEEDED and row.notified_at is not None
    assert len(emails_for(mail, job)) == 1


@pytest.mark.parametrize("piece", ["overviews", "packs"])
def test_a_finisher_whose_overviews_or_packs_fail_ends_the_job_without_them_saying_so(
        settings: Settings, mail: MailServer, monkeypatch: pytest.MonkeyPatch, piece: str) -> None:
    """The overviews could not be drawn (a grid whose geotransform cannot be inverted, on
    every try), or the small outputs not packed (made beside them, on a thread of their
    own): the job ends as its tasks say, with its manifest and its one email, which say
    which piece is missing and why — not FINISHING for ever, its done message coming back
    and poisoned again and again."""
    settings, clients, job = ended_job(settings)

    def cannot(*_: Any) -> list[dict[str, Any]]:
        raise ValueError("Cannot invert geotransform")

    monkeypatch.setattr(*((overview, "build") if piece == "overviews" else (packing, "pack")), cannot)
    with running_control(settings):
        wait_for(lambda: jobs.get(clients, job).state.finished, 60, "the job to finish")
    row = jobs.get(clients, job)
    why = {piece: "ValueError: Cannot invert geotransform"}
    assert row.state is JobState.SUCCEEDED and jobs.status(clients, job)["missing"] == why
    manifest = json.loads(clients.products.download_blob(row.manifest).readall())
    assert manifest["missing"] == why and len(manifest["tasks"]) == 8
    assert manifest["overviews"] == [] if piece == "overviews" else manifest["packed"] == {}
    (email,) = emails_for(mail, job)
    assert f"Not made: {piece} (ValueError: Cannot invert geotransform)" in email.get_content()
    assert queued(clients, clients.done_queue) <= 1 and queued(clients, poison(clients, clients.done_queue)) == 0


def test_a_job_whose_finishers_fail_every_time_ends_failed_saying_why(
        settings: Settings, mail: MailServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every finisher fails on the job (its manifest cannot be written): after a few tries
    the next ends it FAILED, saying why, with what it could still make (its email), and the
    loop goes on to other jobs; nothing is retried for ever."""
    settings, clients, job = ended_job(settings)
    tried = list[int]()

    def refused(*_: Any) -> dict[str, Any]:
        tried.append(1)
        raise RuntimeError("the manifest was refused")

    monkeypatch.setattr(completion, "write_manifest", refused)
    with running_control(settings):
        wait_for(lambda: jobs.get(clients, job).state.finished, 120, "the job to end")
    row = jobs.get(clients, job)
    assert row.state is JobState.FAILED and len(tried) == completion.FINISH_TRIES + 1
    assert row.error.startswith(f"its completion failed {completion.FINISH_TRIES} times: RuntimeError: the manifest")
    assert row.manifest == "" and "manifest" in jobs.status(clients, job)["missing"]
    (email,) = emails_for(mail, job)
    text = email.get_content()
    assert "failed" in str(email["Subject"]) and "Why: its completion failed" in text and "Not made: manifest" in text
    assert queued(clients, clients.done_queue) <= 1 and queued(clients, poison(clients, clients.done_queue)) == 0


def test_a_poisoned_done_message_ends_its_job_saying_why(
        settings: Settings, mail: MailServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A done message whose every handling fails before any finisher holds the job (so that
    no try is counted on its row) goes to the poison queue and ends its job there, saying
    why."""
    settings, clients, job = ended_job(settings)

    def broken(*_: Any) -> JobState:
        raise ValueError("a rollup this version cannot read")

    monkeypatch.setattr(completion, "_final_state", broken)
    jobs.announce_done(clients, job)  # (its workers announced it too)
    mailer, names_ = mailer_for(settings), settings.names
    done_poison = poison(clients, clients.done_queue)
    for _ in range(control.MAX_DEQUEUES + 1):
        control.drain(clients.done_queue, done_poison, lambda body: sweep.handle_done(clients, mailer, body), 1,
                      poisoned=lambda body, why: sweep.handle_poisoned(clients, mailer, names.DONE_QUEUE, body, why))
        time.sleep(1.1)
    row = jobs.get(clients, job)
    assert row.state is JobState.FAILED and "its completion failed every time" in row.error
    assert len(emails_for(mail, job)) == 1 and queued(clients, done_poison) >= 1
    assert names_.poison_queue(names_.done_queue) == done_poison.queue_name


def test_a_poisoned_plan_message_ends_its_job_saying_why(settings: Settings, mail: MailServer) -> None:
    settings, clients = fast(settings)
    job = application.submit(clients, small_request()).job
    sweep.handle_poisoned(clients, mailer_for(settings), names.PLAN_QUEUE, json.dumps({"job": job}).encode(),
                          "failed 5 times")
    completion.complete(clients, mailer_for(settings), job)
    row = jobs.get(clients, job)
    assert row.state is JobState.FAILED and row.error.startswith("its planning failed every time (failed 5 times)")
    assert len(emails_for(mail, job)) == 1


def poison(clients: Clients, queue: QueueClient) -> QueueClient:
    return clients.queue(clients.settings.names.poison_queue(queue.queue_name))


def queued(clients: Clients, queue: QueueClient) -> int:
    return int(queue.get_queue_properties().approximate_message_count)
