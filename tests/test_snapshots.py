"""A look at a job reads its status row (``pipeline.lifecycle.snapshots``): the sum of its
rollups the sweep last wrote, by key, while it is fresh, and the rollups themselves once it
is stale or could not be written; a finished job's final row, written by its finisher, or
again by the first look that finds a late sweep pass's row in its place."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote

import pytest
from azure.core.exceptions import ServiceResponseError
from azure.data.tables import UpdateMode

from bagpipe.mailserver import MailServer
from pipeline.lifecycle import completion, jobs, rollups, snapshots, sweep, tasks, transitions
from pipeline.lifecycle.notify import mailer_for
from pipeline.lifecycle.status import TaskStatus
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web import jobview
from tests.conftest import commit, in_an_hour, parts, with_stage
from tests.harness.hooks import response_hook
from tests.test_finisher import ended_job
from tests.test_status import job_of


@contextmanager
def tables_read(urls: list[str] | None = None) -> Iterator[list[str]]:
    """The tables each read of the block went to (their names, one per request; ``urls``:
    the requests' whole URLs too)."""
    read: list[str] = []

    def hook(response: Any) -> None:
        request = response.http_request
        if request.method == "GET":
            read.append(request.url.split("?")[0].rstrip("/").rsplit("/", 1)[-1].split("(")[0])
            if urls is not None:
                urls.append(unquote(request.url))

    with response_hook(hook):
        yield read


def reads_by(settings: Settings, call: Callable[[Clients], object], urls: list[str] | None = None) -> list[str]:
    with tables_read(urls) as read:
        fresh = Clients(settings)  # built with the hook
        call(fresh)
        fresh.close()
    return read


def shown_counts(status: dict[str, Any]) -> dict[str, int]:
    return {state: n for state, n in status["counts"].items() if n}


def task_counts(clients: Clients, job: str) -> dict[str, int]:
    return dict(Counter(r.status.value for r in tasks.list_tasks(clients.tasks, parts(clients, job))))


def but_when(shown: dict[str, Any]) -> dict[str, Any]:
    """A look's answer less when its figures were summed (and for a view, its failed
    attempts: not from the status row, and their log links signed anew each look)."""
    return {key: value for key, value in shown.items() if key not in ("as_of", "failed_attempts")}


def commit_one(clients: Clients, job: str) -> None:
    """Claim and commit one QUEUED task of the job, by the slot of a worker ``w``."""
    queued = next(r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.status is TaskStatus.QUEUED)
    held = transitions.claim(clients, queued.ref, "w", in_an_hour)
    assert held is not None
    assert commit(clients, rollups.RollupWriter(f"w{names.SLOT_MARK}0"), held, TaskStatus.SUCCEEDED, [])


def stale(clients: Clients, job: str) -> None:
    """Make the job's status row one a look no longer reads: the sweep has not written since."""
    clients.jobs.update_entity({"PartitionKey": job, "RowKey": names.STATUS_ROW,
                                "Until": tasks.now() - timedelta(seconds=1)}, mode=UpdateMode.MERGE)


def test_a_look_reads_the_sweeps_sum_while_it_is_fresh_and_the_rollups_once_it_is_stale(settings: Settings) -> None:
    settings = with_stage(settings, "noop", window=300, partitions=1)
    clients = Clients(settings)
    clients.ensure_resources()
    job = job_of(clients, "2022-01-31", commits=3)
    commit_one(clients, job)  # by a worker's slot: the status names its worker
    tasks_table = clients.tasks.table_name
    assert tasks_table in reads_by(settings, lambda c: jobs.status(c, job))  # no pass yet: the rollups
    before = tasks.now()
    assert sweep.sweep(clients)["summed"] == 1
    written = snapshots.read(clients, job)
    assert written is not None and not written.final
    assert written.until - written.at >= timedelta(seconds=snapshots.FRESH_PASSES * settings.monitor_interval_s)
    read = reads_by(settings, lambda c: jobs.status(c, job))
    assert tasks_table not in read and read.count(clients.jobs.table_name) == 2  # the job row and its status row
    shown = jobs.status(clients, job)
    assert before <= datetime.fromisoformat(shown["as_of"]) <= tasks.now()
    summed = rollups.read(clients.tasks, parts(clients, job), tiles=False)
    assert but_when(shown) == but_when(jobs.status(clients, job, summed))  # what summing shows, workers and all
    assert shown_counts(shown) == task_counts(clients, job) and [w["worker"] for w in shown["workers"]] == ["w"]
    assert shown["failures"] == {"user_code_error": 1, "connection_failure": 1}
    view = jobview.view(clients, job)

    # one more commit: a look shows the pass's figures, as of the pass, until they are stale
    commit_one(clients, job)
    again = jobs.status(clients, job)
    assert (shown_counts(again), again["as_of"]) == (shown_counts(shown), shown["as_of"])
    assert but_when(jobview.view(clients, job)) == but_when(view)
    stale(clients, job)
    later = jobs.status(clients, job)
    assert shown_counts(later) == task_counts(clients, job) != shown_counts(shown)
    assert later["as_of"] > shown["as_of"]
    summed_view = jobview.view(clients, job)
    urls: list[str] = []
    assert reads_by(settings, lambda c: sweep.sweep(c), urls) and sum(  # the next pass reads the rollups once
        names.COUNTER_PREFIX in url for url in urls) == 1  # (one partition), for its fold and its sum
    renewed = snapshots.read(clients, job)
    assert renewed is not None and renewed.until > tasks.now()  # read by key again, the same figures
    assert tasks_table not in reads_by(settings, lambda c: jobs.status(c, job))
    assert but_when(jobview.view(clients, job)) == but_when(summed_view)
    assert {t["tile"]: t["counts"] for t in summed_view["tiles"]} == {
        tile: dict(Counter(r.status.value for r in tasks.list_tasks(clients.tasks, parts(clients, job))
                           if r.parameters()["tile"] == tile)) for tile in ("h09v05", "h10v05")}


def test_a_sum_too_large_for_one_row_is_not_written_and_looks_sum_the_rollups(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = with_stage(settings, "noop", window=300, partitions=1)
    clients = Clients(settings)
    clients.ensure_resources()
    job = job_of(clients, "2022-01-31", commits=3)
    monkeypatch.setattr(snapshots, "PARTS", 0)
    assert sweep.sweep(clients)["summed"] == 0
    assert snapshots.read(clients, job) is None
    assert clients.tasks.table_name in reads_by(settings, lambda c: jobs.status(c, job))
    assert shown_counts(jobs.status(clients, job)) == task_counts(clients, job)


def test_a_finished_jobs_status_is_its_final_row_and_a_late_pass_does_not_stay(
        settings: Settings, mail: MailServer, monkeypatch: pytest.MonkeyPatch) -> None:
    settings, clients, job = ended_job(settings)
    assert completion.complete(clients, mailer_for(settings), job)
    written = snapshots.read(clients, job)
    assert written is not None and written.final
    assert dict(+written.rollup.counts) == task_counts(clients, job) == {"SUCCEEDED": 8}
    status = jobs.status(clients, job)
    assert status["state"] == "SUCCEEDED" and shown_counts(status) == {"SUCCEEDED": 8}
    assert reads_by(settings, lambda c: jobs.status(c, job)).count(clients.tasks.table_name) == 0

    # a pass that read the rollups before the finish, its row written after
    snapshots.write(clients, job, rollups.Rollup(), tasks.now())
    assert shown_counts(jobs.status(clients, job)) == {"SUCCEEDED": 8}  # summed from the rollups ...
    rewritten = snapshots.read(clients, job)
    assert rewritten is not None and rewritten.final and dict(+rewritten.rollup.counts) == {"SUCCEEDED": 8}
    assert clients.tasks.table_name not in reads_by(settings, lambda c: jobs.status(c, job))  # ... once

    clients.jobs.delete_entity(job, names.STATUS_ROW)  # and with the storage failing that write:
    with monkeypatch.context() as failing:
        failing.setattr(type(clients.jobs), "upsert_entity", cut)
        assert shown_counts(jobs.status(clients, job)) == {"SUCCEEDED": 8}  # the look has its figures
    assert snapshots.read(clients, job) is None
    assert shown_counts(jobs.status(clients, job)) == {"SUCCEEDED": 8}  # the next look writes it
    final = snapshots.read(clients, job)
    assert final is not None and final.final


def cut(*_: object, **__: object) -> None:
    raise ServiceResponseError("connection reset by peer")
