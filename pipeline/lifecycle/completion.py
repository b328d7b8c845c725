"""Job completion: once every task is terminal, write the manifest and send one email.

Exactly once, under any delay. The move to FINISHING is a conditional update only one
process wins, and the winner holds the job by a lease on its row (``FinisherUntil``) that it
renews while it works — packing a large job's outputs or waiting for the mail service takes
as long as it takes. Only when a finisher stops renewing (it died) may another take over.
Before it sends the email a finisher records the message's Message-ID on the row (a
conditional write: a finisher that lost its lease cannot make it), and after it records
that it sent it; one taking over from a finisher that died in between resends with the same
Message-ID, so the mail system sees one message. The sweep never finishes a job itself: it
announces one that nobody finished (a ``done`` message), so a long completion never holds
up the monitor's revocations.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from datetime import UTC, datetime, timedelta
from email.message import EmailMessage
from email.utils import make_msgid
from typing import Any

from azure.core.exceptions import HttpResponseError

from pipeline import planning
from pipeline.lifecycle import attempts, costs, jobs, results, rollups, snapshots, tasks
from pipeline.lifecycle.jobs import JobRow
from pipeline.lifecycle.notify import Mailer
from pipeline.lifecycle.status import JobState, TaskStatus
from pipeline.storage import names, packing
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)
RELEASED = datetime(1970, 1, 1, tzinfo=UTC)  # a finisher lease that has long expired
LOOKS = 5  # times a finisher reads the job row again when it changed under its hold
FAILURES_MAILED = 5  # the newest failed attempts an email names, with their errors


def all_terminal(clients: Clients, row: JobRow, done: int | None = None) -> bool:
    """Whether every task of the job is terminal (``done``: its terminal count, if known).
    A job cancelled while it was being planned has only the tasks planned so far (its
    planner cancels any it makes after)."""
    if done is None:
        done = sum(tasks.terminal_counts(clients.tasks, row.parts).values())
    cancelled = row.state is JobState.CANCELLING
    return done >= (row.planned if cancelled else row.total)


def _final_state(clients: Clients, row: JobRow) -> JobState:
    if row.state is JobState.CANCELLING:
        return JobState.CANCELLED
    counts = tasks.terminal_counts(clients.tasks, row.parts)
    return JobState.FAILED if counts[TaskStatus.DEAD.value] else JobState.SUCCEEDED


def _lease(clients: Clients) -> timedelta:
    return timedelta(seconds=2 * clients.settings.lease_seconds)


def _held_by_another(clients: Clients, row: JobRow) -> bool:
    until = row.finisher_until
    if until is None:  # a row written before finishers held leases
        return bool(tasks.now() - row.updated_at <= _lease(clients))
    return bool(until > tasks.now())


def due(clients: Clients, row: JobRow) -> bool:
    """The sweep's test: whether nobody is finishing a job that is complete (its last task's
    announcement lost, its finisher dead), so it must be announced again."""
    state = row.state
    if state is JobState.FINISHING:
        return not _held_by_another(clients, row)
    if state in (JobState.RUNNING, JobState.CANCELLING):
        idle = tasks.now() - row.updated_at > timedelta(seconds=clients.settings.lease_seconds)
        return idle and all_terminal(clients, row)
    return False


class LeaseLost(RuntimeError):
    """Another finisher took the job over: this one must stop before it writes or sends."""


class Finishing:
    """A finisher's hold on a job: its row, renewed in the background every third of the
    lease; every change the finisher makes goes through :meth:`update`, fenced on the row."""

    def __init__(self, clients: Clients, row: JobRow) -> None:
        self.clients, self.row = clients, row
        self.lost = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"finishing-{row.job}", daemon=True)

    def __enter__(self) -> Finishing:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def update(self, **changes: Any) -> JobRow:
        """Change the job row, renewing the lease; LeaseLost if another finisher has it."""
        with self._lock:
            if self.lost:
                raise LeaseLost(self.row.job)
            try:
                self.row = jobs.update(self.clients, self.row, finisher_until=tasks.now() + _lease(self.clients),
                                       **changes)
            except HttpResponseError as exc:
                if tasks.is_conflict(exc):
                    self.lost = True
                    raise LeaseLost(self.row.job) from None
                raise
            return self.row

    def release(self) -> None:
        """Give the lease up at once (this finisher failed: the next may start now)."""
        try:
            with self._lock:
                if not self.lost:
                    self.row = jobs.update(self.clients, self.row, finisher_until=RELEASED)
        except Exception as exc:
            log.info("lease of %s not given up (it runs out): %s", self.row.job, exc)

    def _renew(self) -> None:
        while not self._stop.wait(self.clients.settings.lease_seconds / 3):
            try:
                self.update()
            except LeaseLost:
                log.warning("job %s: another finisher took over", self.row.job)
                return
            except Exception as exc:  # storage briefly unreachable: the lease is long enough for a retry
                log.warning("job %s: finisher lease not renewed: %s", self.row.job, exc)


def complete(clients: Clients, mailer: Mailer, job: str) -> bool:
    """Finish the job if it is complete and nobody else is finishing it; True if this call
    finished it.

    Its hold on the job is fenced on the row it read. A row changed meanwhile is read and
    looked at again (up to :data:`LOOKS` times): the change may be another finisher's, but
    also one that finishes nothing — a release's lease on the cursor, a cancellation.
    Giving up there left the job to the sweep, a lease later. (Its own hold
    applied with the answer lost, ``jobs.update`` knows it and returns it.)"""
    for _ in range(LOOKS):
        row = jobs.get(clients, job)
        state = row.state
        if state.finished:
            jobs.deactivate(clients, job)
            return False
        if state is JobState.ACCEPTED or (state is not JobState.FINISHING and not all_terminal(clients, row)):
            return False
        if state is JobState.FINISHING and _held_by_another(clients, row):
            return False
        changes: dict[str, Any] = {"finisher": uuid.uuid4().hex, "finisher_until": tasks.now() + _lease(clients)}
        if state is not JobState.FINISHING:
            changes |= {"state": JobState.FINISHING, "outcome": _final_state(clients, row)}
        try:
            row = jobs.update(clients, row, **changes)
            break
        except HttpResponseError as exc:
            if not tasks.is_conflict(exc):
                raise
    else:
        return False  # the row kept changing: the sweep announces the job again
    with Finishing(clients, row) as hold:
        try:
            _finish(clients, mailer, hold)
        except LeaseLost:
            return False
        except BaseException:
            hold.release()
            raise
    jobs.deactivate(clients, job)
    log.info("job %s finished: %s", job, hold.row.outcome)
    return True


def _finish(clients: Clients, mailer: Mailer, hold: Finishing) -> None:
    row = hold.row
    final = row.outcome
    if final is None:
        raise ValueError(f"job {row.job} is finishing with no outcome")
    found, lines = write_manifest(clients, row, final)
    recipient = row.email
    if recipient and not row.notified_at:
        message_id = row.mail_id or hold.update(mail_id=make_msgid(idstring=row.job, domain="bagpipe")).mail_id
        mailer.send(completion_email(clients, hold.row, final, found, lines, recipient, message_id))
        hold.update(notified_at=tasks.now())
    attempts.clear_indexes(clients, row.parts)
    snapshots.final(clients, row.job, row.parts)  # its status from now on
    hold.update(state=final, finished_at=tasks.now(), manifest=names.manifest_blob(row.job),
                compute_s=found["cost"]["compute_s"], cost_usd=found["cost"]["usd"], warning=found["warning"] or "",
                notes=json.dumps(found["notes"]) if found["notes"] else "")


def write_manifest(clients: Clients, row: JobRow, final: JobState) -> tuple[dict[str, Any], list[str]]:
    """The manifest blob: every task's state and the outputs its committed attempt made,
    where the small ones are packed, and what the job's application adds of its products
    (``planning.Application.finished``); with the paragraphs that adds to the email."""
    job = row.job
    entries: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    for task in tasks.list_tasks(clients.tasks, row.parts):
        counts[task.status.value] = counts.get(task.status.value, 0) + 1
        entries.append(
            {
                "task": task.task,
                "stage": task.stage,
                **task.parameters(),
                "status": task.status.value,
                "attempt": task.attempt,
                "outputs": task.output_names()
                if task.status in (TaskStatus.SUCCEEDED, TaskStatus.CACHED) else [],
                "failure": task.last_failure or None,
            }
        )
    if final is JobState.CANCELLED and row.total > len(entries):  # cancelled while it was being planned
        counts[TaskStatus.CANCELLED.value] = counts.get(TaskStatus.CANCELLED.value, 0) + row.total - len(entries)
    added = planning.application().finished(clients, row, entries)
    made = sum(len(entry["outputs"]) for entry in entries)
    found = {
        "job": job,
        "state": final.value,
        "label": row.label,
        "error": row.error or None,
        "warning": made_nothing(counts) if not made and final is JobState.SUCCEEDED else None,
        "notes": added.notes,
        "request": json.loads(row.request),
        "created": row.created_at.isoformat(),
        "total": row.total,
        "counts": counts,
        **added.manifest,
        "cost": costs.measured(_attempt_seconds(clients, row.parts), len(entries)),
        "tasks": entries,
        "packed": packing.as_manifest(packing.pack(clients, job, (
            packing.Output(output, *results.locate(clients, output)) for entry in entries for output in entry["outputs"]
        ))),
    }
    clients.transfers.upload(clients.products, names.manifest_blob(job), json.dumps(found, indent=1).encode(),
                             "application/json")
    return found, added.lines


def made_nothing(counts: dict[str, int]) -> str:
    """What a job that ended well but made no product must say (its ``counts`` by state):
    a green SUCCEEDED alone hides a region or span the catalog has nothing of, or a
    collection that does not exist."""
    no_data = counts.get(TaskStatus.NO_DATA.value, 0)
    return (f"the job made no product: {no_data} of its {sum(counts.values())} tasks found no data in the catalog "
            "(a span in the future or before the product began, a region of ocean, an outage)")


def _attempt_seconds(clients: Clients, parts: list[str]) -> list[float]:
    """How long each attempt of a job (its partitions ``parts``) ran (one revoked or lost:
    until it ended)."""
    ran = (a.seconds() for a in attempts.list_attempts(clients.tasks, parts, "runtime_s", "started_at", "ended_at"))
    return [seconds for seconds in ran if seconds is not None]


def one_line(text: str) -> str:
    """``text`` fit for a header: its whitespace runs (line breaks too) made one space, other
    control characters dropped."""
    return "".join(c for c in " ".join(text.split()) if c.isprintable())


def job_page(portal: str, job: str) -> str:
    """The address of the job's page in the portal at ``portal`` (its public address,
    ``BAGPIPE_PORTAL_URL``; the page routes by its fragment), or "" with no portal set."""
    if not portal:
        return ""
    return f"{portal if portal.endswith('/') else portal + '/'}#/jobs/{job}"


def completion_email(clients: Clients, row: JobRow, final: JobState, found: dict[str, Any], lines: list[str],
                     recipient: str, message_id: str) -> EmailMessage:
    job = row.job
    # the label is the submitter's text: kept out of the headers (a subject of their choosing would be
    # theirs to phish with), quoted in the body, to the addresses they may mail (pipeline.web.addresses)
    label = f"\nIts label: \"{one_line(row.label)}\"" if row.label else ""
    counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(found["counts"].items())) or "none"
    link = results.sas_url(clients, clients.products.container_name, names.manifest_blob(job))
    why = f"Why: {row.error}\n\n" if row.error else ""
    if found.get("warning"):
        why += f"Warning: {found['warning']}.\n\n"
    why += "".join(f"Note: {note}.\n\n" for note in found.get("notes", []))
    failed = rollups.newest_failures(clients.tasks, row.parts, FAILURES_MAILED) if found["counts"].get(
        TaskStatus.DEAD.value) else []
    if failed:  # the counts say how many; these say why, and where a program's output is
        why += "Failures, the newest:\n" + "".join(
            f"- task {int(a.task)} ({a.stage}) attempt {a.attempt}: {a.failure_class}: {one_line(a.error)[:400]}\n"
            for a in failed) + f"What a program wrote to stdout and stderr: bagpipe logs {job} TASK\n\n"
    page = job_page(clients.settings.portal_url, job)
    seen = f"Its page, with its tiles on the map and its overviews: {page}\n\n" if page else ""
    message = EmailMessage()
    message["From"] = clients.settings.mail_sender
    message["To"] = recipient
    message["Subject"] = f"bagpipe job {job}: {final.value.lower()}" + (", no product" if found.get("warning") else "")
    message["Message-ID"] = message_id
    message.set_content(
        f"Your bagpipe job {job} has finished: {final.value}.{label}\n\n{why}"
        f"Tasks: {found['total']} ({counts}).\n"
        f"Compute: {found['cost']['compute_s'] / 3600:.2f} slot-hours over {found['cost']['attempts']} attempts, "
        f"about {costs.dollars(found['cost']['usd'])} at Azure's pay-as-you-go prices.\n\n"
        f"{seen}"
        f"Manifest with every product (link valid for {clients.settings.sas_minutes} minutes):\n"
        f"{link}\n\n"
        f"{''.join(lines)}"
        f"Fresh download links at any time: bagpipe results {job} --out DIR\n"
    )
    return message
