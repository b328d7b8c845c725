"""Job completion: once every task is terminal, write the manifest and send one email.

Exactly once, even when several processes notice completion together: the move to
FINISHING is a conditional update only one of them wins; the email is sent by that winner
and recorded on the job row before the job takes its final state. A finisher that dies in
FINISHING is taken over by the sweep after a lease's time.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from email.message import EmailMessage
from email.utils import make_msgid
from typing import Any

from pipeline import jobs, names, packing, results, tasks
from pipeline.clients import Clients
from pipeline.notify import Mailer
from pipeline.status import JobState, TaskStatus

log = logging.getLogger(__name__)


def all_terminal(clients: Clients, row: dict[str, Any], done: int | None = None) -> bool:
    """Whether every task of the job is terminal (``done``: its terminal count, if known)."""
    if done is None:
        done = sum(tasks.terminal_counts(clients.tasks, row["PartitionKey"]).values())
    return done >= int(row["Total"])


def _final_state(clients: Clients, row: dict[str, Any]) -> JobState:
    if row["State"] == JobState.CANCELLING.value:
        return JobState.CANCELLED
    counts = tasks.terminal_counts(clients.tasks, row["PartitionKey"])
    return JobState.FAILED if counts[TaskStatus.DEAD.value] else JobState.SUCCEEDED


def complete(clients: Clients, mailer: Mailer, job: str) -> bool:
    """Finish the job if it is complete; True if this call finished it."""
    row = jobs.get(clients, job)
    state = JobState(row["State"])
    if state.finished:
        jobs.deactivate(clients, job)
        return False
    if state is JobState.ACCEPTED or (state is JobState.RUNNING and not all_terminal(clients, row)):
        return False
    if state is JobState.FINISHING:
        stale = tasks.now() - row["UpdatedAt"] > timedelta(seconds=2 * clients.settings.lease_seconds)
        if not stale:
            return False  # another process is finishing it
        changes: dict[str, Any] = {}
    else:
        changes = {"State": JobState.FINISHING.value, "Outcome": _final_state(clients, row).value}
    try:
        row = jobs.update(clients, row, **changes)
    except Exception as exc:
        if tasks.is_conflict(exc):
            return False  # another process won the race
        raise
    final = JobState(row["Outcome"])
    found = write_manifest(clients, row, final)
    if not row.get("NotifiedAt"):
        recipient = jobs.request_of(row).email
        if recipient:
            mailer.send(completion_email(clients, row, final, found, recipient))
        row = jobs.update(clients, row, NotifiedAt=tasks.now())
    jobs.update(clients, row, State=final.value, FinishedAt=tasks.now(),
                Manifest=names.manifest_blob(job))
    jobs.deactivate(clients, job)
    log.info("job %s finished: %s", job, final.value)
    return True


def write_manifest(clients: Clients, row: dict[str, Any], final: JobState) -> dict[str, Any]:
    """The manifest blob: every task's state and the outputs its committed attempt made, and
    where the small ones are packed."""
    job = row["PartitionKey"]
    entries = []
    counts: dict[str, int] = {}
    for task in tasks.list_tasks(clients.tasks, job):
        counts[task["Status"]] = counts.get(task["Status"], 0) + 1
        entries.append(
            {
                "task": task["RowKey"],
                "stage": task["Stage"],
                **json.loads(task["Params"]),
                "status": task["Status"],
                "attempt": task["Attempt"],
                "outputs": json.loads(task.get("Outputs") or "[]")
                if task["Status"] in (TaskStatus.SUCCEEDED.value, TaskStatus.CACHED.value) else [],
                "failure": task.get("LastFailure") or None,
            }
        )
    found = {
        "job": job,
        "state": final.value,
        "label": row.get("Label", ""),
        "request": json.loads(row["Request"]),
        "created": row["CreatedAt"].isoformat(),
        "total": int(row["Total"]),
        "counts": counts,
        "tasks": entries,
        "packed": packing.as_manifest(packing.pack(clients, job, (
            packing.Output(output, *results.locate(clients, output)) for entry in entries for output in entry["outputs"]
        ))),
    }
    clients.transfers.upload(clients.products, names.manifest_blob(job), json.dumps(found, indent=1).encode(),
                             "application/json")
    return found


def completion_email(clients: Clients, row: dict[str, Any], final: JobState,
                     found: dict[str, Any], recipient: str) -> EmailMessage:
    job = row["PartitionKey"]
    label = f" ({row['Label']})" if row.get("Label") else ""
    counts = ", ".join(f"{n} {s.lower()}" for s, n in sorted(found["counts"].items()))
    link = results.sas_url(clients, clients.products.container_name, names.manifest_blob(job))
    message = EmailMessage()
    message["From"] = clients.settings.mail_sender
    message["To"] = recipient
    message["Subject"] = f"bagpipe job {job}{label}: {final.value.lower()}"
    message["Message-ID"] = make_msgid(idstring=job, domain="bagpipe")
    message.set_content(
        f"Your bagpipe job {job}{label} has finished: {final.value}.\n\n"
        f"Tasks: {found['total']} ({counts}).\n\n"
        f"Manifest with every product (link valid for {clients.settings.sas_minutes} minutes):\n"
        f"{link}\n\n"
        f"Fresh download links at any time: bagpipe results {job} --out DIR\n"
    )
    return message
