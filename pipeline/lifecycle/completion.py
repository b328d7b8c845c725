"""Job completion: once every task is terminal, write the manifest and send one email.

Exactly once, under any delay. The move to FINISHING is a conditional update only one
process wins, and the winner holds the job by a lease on its row (``FinisherUntil``) that it
renews while it works — packing a large job's outputs or waiting for the mail service takes
as long as it takes. Only when a finisher stops renewing (it died) may another take over.
The sweep never finishes a job itself: it announces one that nobody finished (a ``done``
message), so a long completion never holds up the monitor's revocations.

The email: just before sending it a finisher records the message's Message-ID and the time
(``MailAt``: a conditional write, which a finisher that lost its hold cannot make), and once
it is sent, that it was (``NotifiedAt``), that write made again and again while storage
refuses it (up to ``MAIL_RECORD_LEASES`` leases), keeping the hold. So a refused record
leads to no second email: nobody takes the job over while the sender is still recording,
and a finisher that finds a send with no record waits that long before it believes the
sender dead and sends again, with the same Message-ID.

One bad job never wedges the loop. What its application adds to the manifest and the
email (``planning.Application.finished``: overviews, provenance) and the packs of small
outputs are optional: one that cannot be made is left out, the job ends as its tasks say, and its
status, manifest and email say which piece is missing and why. Any other failure counts a
try on the job row and holds the job off a lease; after ``FINISH_TRIES`` the next finisher
ends it FAILED (or CANCELLED, as it was), saying why, making what it still can — as does
one handling a ``done`` message that the queue gave up on (poisoned).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from email.message import EmailMessage
from email.utils import make_msgid
from typing import Any, TypeVar

from azure.core.exceptions import HttpResponseError

from pipeline import planning
from pipeline.lifecycle import attempts, costs, jobs, results, rollups, snapshots, tasks
from pipeline.lifecycle.jobs import JobRow
from pipeline.lifecycle.notify import Mailer
from pipeline.lifecycle.status import JobState, TaskStatus
from pipeline.redact import redact
from pipeline.storage import names, packing
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)
LOOKS = 5  # times a finisher reads the job row again when it changed under its hold
FAILURES_MAILED = 5  # the newest failed attempts an email names, with their errors
FINISH_TRIES = 3  # finishers failed on a job before the next ends it, saying why
ERROR_CHARS = 2000  # an error kept on the job row is cut to this
T = TypeVar("T")
MAIL_RECORD_LEASES = 10  # how long (in leases) a finisher goes on recording its sent email while storage refuses


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
    """Whether another finisher holds the job, or may still be recording the email it sent."""
    until = row.finisher_until
    if until is None:  # a row written before finishers held leases
        return bool(tasks.now() - row.updated_at <= _lease(clients))
    return bool(until > tasks.now()) or _recording(clients, row)


def _mail_record_s(clients: Clients) -> float:
    return MAIL_RECORD_LEASES * clients.settings.lease_seconds


def _recording(clients: Clients, row: JobRow) -> bool:
    """Whether the finisher that was about to send the job's email (``mail_at``) may still be
    recording that it did: a send with no record is believed lost only once that finisher
    would have given up recording."""
    return row.mail_at is not None and row.notified_at is None and tasks.now() - row.mail_at < timedelta(
        seconds=_mail_record_s(clients)) + _lease(clients)


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
        """Give the lease up at once (this finisher was stopped: the next may start now)."""
        self._give_up(finisher_until=jobs.NO_FINISHER)

    def failed(self, exc: Exception) -> bool:
        """This finisher failed: count the try on the job row, with its error, and hold the
        job off a lease (the sweep announces it again then; after ``FINISH_TRIES`` tries the
        next finisher ends it). Whether it was counted."""
        log.warning("job %s: finisher failed (%d before): %s", self.row.job, self.row.finish_tries,
                    redact(str(exc)))
        return self._give_up(finisher_until=tasks.now() + _lease(self.clients), finish_tries=self.row.finish_tries + 1,
                             finish_error=f"{type(exc).__name__}: {redact(str(exc))}"[:ERROR_CHARS])

    def _give_up(self, **changes: Any) -> bool:
        try:
            with self._lock:
                if not self.lost:
                    self.row = jobs.update(self.clients, self.row, **changes)
                    return True
        except Exception as exc:
            log.info("lease of %s not given up (it runs out): %s", self.row.job, exc)
        return False

    def _renew(self) -> None:
        while not self._stop.wait(self.clients.settings.lease_seconds / 3):
            try:
                self.update()
            except LeaseLost:
                log.warning("job %s: another finisher took over", self.row.job)
                return
            except Exception as exc:  # storage briefly unreachable: the lease is long enough for a retry
                log.warning("job %s: finisher lease not renewed: %s", self.row.job, exc)


def complete(clients: Clients, mailer: Mailer, job: str, give_up: str = "") -> bool:
    """Finish the job if it is complete and nobody else is finishing it; True if this call
    finished it. ``give_up``: why the job is to be ended now whatever its finishers meet
    (its ``done`` message poisoned), as it is after ``FINISH_TRIES`` failed finishers.

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
        why = give_up or (f"its completion failed {row.finish_tries} times: {row.finish_error}"
                          if row.finish_tries >= FINISH_TRIES else "")
        changes: dict[str, Any] = {"finisher": uuid.uuid4().hex, "finisher_until": tasks.now() + _lease(clients)}
        if state is not JobState.FINISHING:
            changes |= {"state": JobState.FINISHING}
        if why:  # what it still can, without what failed
            cancelled = JobState.CANCELLED in (row.outcome, row.state) or row.state is JobState.CANCELLING
            changes |= {"outcome": JobState.CANCELLED if cancelled else JobState.FAILED,
                        "error": redact(why)[:ERROR_CHARS]}
        elif state is not JobState.FINISHING:
            changes |= {"outcome": _final_state(clients, row)}
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
            _finish(clients, mailer, hold, lenient=bool(why))
        except LeaseLost:
            return False
        except Exception as exc:
            if not hold.failed(exc):
                raise  # not even counted: its message comes back, or the sweep announces the job again
            return False  # counted, and the job held off a lease: the sweep announces it again then
        except BaseException:
            hold.release()
            raise
    jobs.deactivate(clients, job)
    log.info("job %s finished: %s", job, hold.row.outcome)
    return True


def _finish(clients: Clients, mailer: Mailer, hold: Finishing, lenient: bool) -> None:
    """Make the job's outputs, send its email, and end it. ``lenient``: the job is being
    ended after its finishers failed: each piece is made if it can be, and one that cannot
    is named in ``missing`` instead."""
    row = hold.row
    final = row.outcome
    if final is None:
        raise ValueError(f"job {row.job} is finishing with no outcome")
    missing: dict[str, str] = {}
    found, lines = _piece(missing, "manifest", lambda: write_manifest(clients, row, final), optional=lenient) or (
        summary(row, final), [])
    recipient = row.email
    if missing:
        found["missing"] = {**found.get("missing", {}), **missing}
    if recipient and not row.notified_at:
        _piece(missing, "email", lambda: _mail(clients, mailer, hold, lambda message_id: completion_email(
            clients, hold.row, final, found, lines, recipient, message_id)), optional=lenient)
    _piece(missing, "index", lambda: attempts.clear_indexes(clients, row.parts), optional=lenient)
    _piece(missing, "status", lambda: snapshots.final(clients, row.job, row.parts), optional=lenient)  # from now on
    gone = {**(found.get("missing") or {}), **missing}
    hold.update(state=final, finished_at=tasks.now(), compute_s=found["cost"]["compute_s"],
                cost_usd=found["cost"]["usd"], manifest="" if "manifest" in gone else names.manifest_blob(row.job),
                warning=found.get("warning") or "", notes=json.dumps(found["notes"]) if found.get("notes") else "",
                **({"missing": json.dumps(gone)} if gone else {}))


def _piece(missing: dict[str, str], name: str, make: Callable[[], T], optional: bool) -> T | None:
    """``make()``; if ``optional`` and it fails, None, its error kept in ``missing`` under
    ``name``."""
    if not optional:
        return make()
    try:
        return make()
    except LeaseLost:
        raise  # another finisher holds the job: this one stops
    except Exception as exc:
        log.warning("%s not made: %s", name, redact(str(exc)))
        missing[name] = f"{type(exc).__name__}: {redact(str(exc))}"[:ERROR_CHARS]
        return None


def _mail(clients: Clients, mailer: Mailer, hold: Finishing, message: Callable[[str], EmailMessage]) -> None:
    """Send the job's email once: its Message-ID (the one recorded before, if a finisher got
    that far) and the time recorded on the row, then the message, then its record — made
    again while storage refuses it, for as long as a finisher taking over would wait
    (``_recording``) — so that a refused record never leads to a second email."""
    row = hold.row
    message_id = row.mail_id or make_msgid(idstring=row.job, domain="bagpipe")
    hold.update(mail_id=message_id, mail_at=tasks.now())
    mailer.send(message(message_id))
    give_up_at, wait = time.monotonic() + _mail_record_s(clients), 0.25
    while True:
        try:
            hold.update(notified_at=tasks.now())
            return
        except LeaseLost:
            raise
        except Exception as exc:
            if time.monotonic() + wait > give_up_at:
                raise
            log.warning("job %s: its email went out, its record was refused (recorded again in %.1f s): %s",
                        row.job, wait, redact(str(exc)))
            time.sleep(wait)
            wait = min(2 * wait, clients.settings.lease_seconds / 3)


def summary(row: JobRow, final: JobState) -> dict[str, Any]:
    """What the email says of a job whose manifest could not be written: its state, counts
    of nothing, no cost."""
    return {"job": row.job, "state": final.value, "total": row.total, "counts": {},
            "cost": {"compute_s": None, "usd": None, "attempts": 0}, "warning": None, "notes": []}


def write_manifest(clients: Clients, row: JobRow, final: JobState) -> tuple[dict[str, Any], list[str]]:
    """The manifest blob: every task's state, its parameters as the application types them
    (``planning.Application.entry``), the outputs its committed attempt made (a task of
    several places: an entry per place, as ``TaskRow.places`` gives it),
    where the small ones are packed, and what the job's application adds of its products
    (``planning.Application.finished``); with the paragraphs that adds to the email. What
    the application adds and the packs are optional: one that cannot be made is left out,
    and named with its error under ``missing`` (as the application names a piece of its own
    it left out: its overviews)."""
    job = row.job
    missing: dict[str, str] = {}
    entries: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    application = planning.application()
    listed = 0
    for task in tasks.list_tasks(clients.tasks, row.parts):
        counts[task.status.value] = counts.get(task.status.value, 0) + 1
        listed += 1
        entries += [  # a task of several places (a batch of target tiles): an entry per place
            {
                "task": task.task,
                "stage": task.stage,
                **application.entry(params),
                "status": status.value,
                "attempt": task.attempt,
                "outputs": outputs,
                "failure": task.last_failure or None,
            }
            for params, status, outputs in task.places()
        ]
    if final is JobState.CANCELLED and row.total > listed:  # cancelled while it was being planned
        counts[TaskStatus.CANCELLED.value] = counts.get(TaskStatus.CANCELLED.value, 0) + row.total - listed
    unpacked: dict[str, str] = {}
    with ThreadPoolExecutor(1, thread_name_prefix="pack") as pool:  # packed while the products are made
        packing_done = pool.submit(_piece, unpacked, "packs", lambda: packing.as_manifest(packing.pack(
            clients, job, (packing.Output(output, *results.locate(clients, output))
                           for entry in entries for output in entry["outputs"]))), optional=True)
        added = _piece(missing, "products", lambda: application.finished(clients, row, entries),
                       optional=True) or planning.Finished({}, [])
        packed = packing_done.result() or {}  # without, each output is fetched where its task wrote it
    missing |= added.manifest.pop("missing", {}) | unpacked
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
        "cost": costs.measured(_attempt_seconds(clients, row.parts), listed),
        "tasks": entries,
        "packed": packed,
    }
    if missing:
        found["missing"] = missing
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
    """The job's one email: how it ended (and why, if it failed as a whole), its tasks, the
    pieces its finisher could not make, its cost, the link to its manifest and what its
    application adds (``lines``)."""
    job = row.job
    # the label is the submitter's text: kept out of the headers (a subject of their choosing would be
    # theirs to phish with), quoted in the body, to the addresses they may mail (pipeline.web.addresses)
    label = f"\nIts label: \"{one_line(row.label)}\"" if row.label else ""
    counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(found["counts"].items())) or "none"
    gone = found.get("missing") or {}
    link = "" if "manifest" in gone else results.sas_url(clients, clients.products.container_name,
                                                         names.manifest_blob(job))
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
    cost = found["cost"]
    compute = "" if cost["compute_s"] is None else (
        f"Compute: {cost['compute_s'] / 3600:.2f} slot-hours over {cost['attempts']} attempts, "
        f"about {costs.dollars(cost['usd'])} at Azure's pay-as-you-go prices.\n\n")
    manifest = (f"Manifest with every product (link valid for {clients.settings.sas_minutes} minutes):\n{link}\n\n"
                if link else "")
    not_made = "".join(f"Not made: {piece} ({error})\n" for piece, error in sorted(gone.items()))
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
        f"{not_made}{compute}{seen}{manifest}"
        f"{''.join(lines)}"
        f"Fresh download links at any time: bagpipe results {job} --out DIR\n"
    )
    return message
