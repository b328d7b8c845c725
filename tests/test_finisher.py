"""One completion and one email per job, whatever its finishers meet: a finisher holds the
job by a lease on its row, renewed while it works (a slow mail service does not let another
take it over); a row changed under it is read again; its own write applied with the answer
lost is known as its own, another's at the same microsecond is not; one that dies after
the email went out is taken over with the same Message-ID."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from email.message import EmailMessage
from typing import Any

import pytest

from bagpipe.mailserver import MailServer
from pipeline.lifecycle import completion, jobs, sweep, tasks
from pipeline.lifecycle.notify import mailer_for
from pipeline.lifecycle.status import JobState
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from tests.conftest import job_write_answer_lost, parts, running_workers, wait_for
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


def test_a_finisher_that_dies_after_recording_its_message_is_taken_over_with_the_same_message_id(
        settings: Settings, mail: MailServer) -> None:
    settings, clients, job = ended_job(settings)

    class Dies(SlowMail):
        def send(self, message: EmailMessage) -> None:
            self.real.send(message)  # it went out; the process dies before it records so
            raise SystemExit("killed")

    with pytest.raises(SystemExit):
        completion.complete(clients, Dies(settings, 0), job)
    assert jobs.get(clients, job).state == "FINISHING"
    assert completion.complete(clients, mailer_for(settings), job)  # its lease was given up: at once
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
