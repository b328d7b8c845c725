"""Typed rows (``pipeline.storage.rows``) against a real Azurite: a row written and read back is
the same row, with its ETag; fields are stored under the names the stored data has always
used (rows written before this code must read, and its writes must read in older code); a
row an older version wrote reads with what it lacks filled in; an unknown field is refused."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from azure.data.tables import UpdateMode

from pipeline.lifecycle import attempts, jobs, tasks
from pipeline.lifecycle.status import JobState, TaskStatus
from pipeline.storage import names
from pipeline.storage.clients import Clients

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_a_job_row_written_and_read_back_is_the_same_row(clients: Clients) -> None:
    row = jobs.JobRow(job="j20260102-030405-abcdef", request="{}", state=JobState.RUNNING, total=9, tiles=8, places=40,
                      created_at=AT, updated_at=AT, planned=9, released=4, owner="alice", compute_s=1.5,
                      cost_usd=0.25, outcome=JobState.SUCCEEDED)
    clients.jobs.create_entity(row.to_entity())
    back = jobs.get(clients, row.job)
    assert back == row and back.etag  # equal in every field; the ETag is the storage's
    assert isinstance(back.state, JobState) and isinstance(back.outcome, JobState)
    stored = clients.jobs.get_entity(row.job, names.JOB_ROW)
    assert stored["State"] == "RUNNING" and stored["CostUSD"] == 0.25 and stored["ComputeS"] == 1.5
    assert "FinishedAt" not in stored, "a field with no value is not written"
    # a change by field name writes that field, fenced on the ETag, and returns the new row
    moved = jobs.update(clients, back, released=8)
    assert moved.released == 8 and moved.etag != back.etag and jobs.get(clients, row.job) == moved
    with pytest.raises(Exception) as stale:
        jobs.update(clients, back, released=9)  # the old ETag
    assert tasks.is_conflict(stale.value)


def test_stored_names_are_the_names_stored_data_has_always_used() -> None:
    job, task, attempt = (jobs.JobRow.stored_names(), tasks.TaskRow.stored_names(),
                          attempts.AttemptRow.stored_names())
    assert (job["job"], job["key"], job["cost_usd"], job["compute_s"], job["releaser_until"], job["mail_id"]) == (
        "PartitionKey", "RowKey", "CostUSD", "ComputeS", "ReleaserUntil", "MailId")
    assert (task["task"], task["runtime_s"], task["last_write"], task["queued_at"], task["last_failure"]) == (
        "RowKey", "RuntimeS", "LastWrite", "QueuedAt", "LastFailure")
    assert (attempt["failure_class"], attempt["revoked_by"], attempt["heartbeat"]) == (
        "FailureClass", "RevokedBy", "Heartbeat")
    assert attempts.Deadline.stored_names()["heartbeat_until"] == "HeartbeatUntil"


def test_rows_an_older_version_wrote_read_with_what_they_lack(clients: Clients) -> None:
    # a job row from before Tiles and Places were kept: its tile tasks are all its tasks, a place each
    clients.jobs.create_entity({"PartitionKey": "j20200101-000000-000000", "RowKey": names.JOB_ROW, "Request": "{}",
                                "State": "RUNNING", "Total": 5, "Planned": 5, "Released": 5,
                                "CreatedAt": AT, "UpdatedAt": AT})
    old = jobs.get(clients, "j20200101-000000-000000")
    assert old.tiles == 5 and old.places == 5 and old.all_released and old.owner == "" and old.outcome is None
    # a task row as the planner writes it, then a merge of a few fields by name
    entity = tasks.TaskRow(part="j1", task=names.task_key(3), seq=3, shard=1, stage="modis",
                           params='{"tile": "h09v05"}').to_entity()
    assert set(entity) == {"PartitionKey", "RowKey", "Seq", "Shard", "Stage", "Params", "Status", "Attempt"}, \
        "a new row holds what the planner says of it, and no field at its default it did not say"
    clients.tasks.create_entity(entity)
    row = tasks.get_task(clients.tasks, "j1", names.task_key(3))
    assert row.status is TaskStatus.PENDING and row.deps is None and row.parameters() == {"tile": "h09v05"}
    clients.tasks.update_entity(row.stored_changes(status=TaskStatus.QUEUED, resends=2), mode=UpdateMode.MERGE,
                                **tasks.if_match(row.etag))
    stored = clients.tasks.get_entity("j1", names.task_key(3))
    assert stored["Status"] == "QUEUED" and stored["Resends"] == 2 and stored["Stage"] == "modis"
    assert tasks.get_task(clients.tasks, "j1", names.task_key(3)) == dataclasses.replace(
        row, status=TaskStatus.QUEUED, resends=2)


def test_an_unknown_field_is_refused() -> None:
    with pytest.raises(KeyError):
        tasks.TaskRow.as_stored(Status="QUEUED")  # a stored name is not a field name
    with pytest.raises(TypeError):
        jobs.JobRow(job="j", request="{}", state=JobState.RUNNING, total=1, tiles=1, places=1, created_at=AT,
                    updated_at=AT, colour="red")  # type: ignore[call-arg]  # the refusal is the point
