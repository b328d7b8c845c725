"""A job's tasks spread over table partitions (job id + bucket): sized for the job's peak,
each move still one transaction in one partition, a reduction in its tile tasks' partition,
and every read of the whole job (counts, failures, due entries, the manifest) over all of
them."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from pipeline.failures import FailureClass
from pipeline.lifecycle import attempts, jobs, partitions, planner, rollups, sweep, tasks, transitions
from pipeline.lifecycle.status import JobState, TaskStatus
from pipeline.requests import application
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import (
    commit,
    fail,
    in_an_hour,
    running_control,
    running_workers,
    small_request,
    wait_for,
    with_stage,
)
from tests.harness.hooks import counting_reads

BUCKETS = 3


def spread(settings: Settings, **changes: object) -> Clients:
    clients = Clients(settings.with_(partitions=BUCKETS, shards=BUCKETS, **changes))
    clients.ensure_resources()
    return clients


def rows_by_part(clients: Clients, job: str) -> dict[str, list[tasks.TaskRow]]:
    found: dict[str, list[tasks.TaskRow]] = {}
    for row in tasks.list_tasks(clients.tasks, jobs.get(clients, job).parts):
        found.setdefault(row.part, []).append(row)
    return found


@pytest.mark.parametrize("window,count,shards", [(256, 10_000, 4), (256, 40, 4), (64, 100, 4), (1024, 10**6, 4),
                                                 (1024, 10**6, 8), (256, 10**6, 3), (2048, 10**6, 12)])
def test_a_job_gets_the_fewest_partitions_that_keep_each_under_its_share_at_the_peak(
        settings: Settings, window: int, count: int, shards: int) -> None:
    settings = settings.with_(window=window, shards=shards, partitions=0)
    got = partitions.buckets_for(settings, count)
    peak = min(window, count) * partitions.ENTITIES_PER_TASK / partitions.SHORTEST_TASK_S
    room = partitions.PARTITION_SHARE * partitions.PARTITION_TARGET
    fitting = [b for b in range(1, shards + 1) if shards % b == 0]  # a shard's tasks in one partition
    within = [b for b in fitting if peak / b <= room]
    assert got == (within[0] if within else shards), "the fewest that keep each within its share, at most shards"
    # an operator's number, rounded the same way
    assert partitions.buckets_for(settings.with_(partitions=shards), count) == shards
    assert partitions.buckets_for(settings.with_(partitions=shards + 1), count) == shards
    assert partitions.buckets_for(settings.with_(partitions=1), count) == 1


def test_a_message_names_its_partition_and_a_forged_one_is_refused() -> None:
    job = "j20261124-000000-abcdef"
    ref = tasks.TaskRef.of(names.partition(job, 2), names.task_key(7), 3, backup=True)
    assert (ref.job, ref.part, ref.partition) == (job, f"{job}.2", f"{job}.2")
    assert tasks.TaskRef.decode(ref.encode()) == ref
    first = tasks.TaskRef.of(job, names.task_key(7), 1)
    assert first.part == "" and b"part" not in first.encode() and tasks.TaskRef.decode(first.encode()) == first
    for forged in (f"{job}.x", f"{job}.02", f"{job}.", "j20261124-000000-ffffff.2", job, f"{job}.2.1"):
        body = json.dumps({"job": job, "task": names.task_key(7), "attempt": 1, "part": forged})
        with pytest.raises(ValueError, match="partition"):
            tasks.TaskRef.decode(body.encode())


def test_plan_spreads_the_tasks_and_keeps_each_reduction_with_its_tile_tasks(settings: Settings) -> None:
    clients = spread(settings)
    body = small_request(start="2022-01-01", end="2022-02-28", reducer={"name": "snow_fraction"})
    job = application.submit(clients, body).job  # 2 tiles × 8 periods + 2 reductions
    planner.plan(clients, job)
    row = jobs.get(clients, job)
    assert row.buckets == BUCKETS and row.parts == [job, f"{job}.1", f"{job}.2"]
    found = rows_by_part(clients, job)
    assert sum(map(len, found.values())) == row.total == 18
    assert sorted(r.seq for rows in found.values() for r in rows) == list(range(18)), "each task once"
    for rows in found.values():
        for task in rows:
            if task.stage == "reduce":
                first, count = (int(v) for v in task.parameters()["deps"].split(","))
                assert {r.seq for r in rows} >= set(range(first, first + count)), "its tile tasks beside it"
    assert len(found) == 2, "two reductions: their two partitions hold every task"
    # tile tasks no reduction waits for spread over every partition, by sequence
    plain = application.submit(clients, small_request(start="2022-01-01", end="2022-03-31")).job
    planner.plan(clients, plain)
    by_part = rows_by_part(clients, plain)
    assert sorted(by_part) == jobs.get(clients, plain).parts
    assert all(r.seq % BUCKETS == int(part.rpartition(".")[2] if "." in part else 0)
               for part, rows in by_part.items() for r in rows)
    queued = [r for rows in by_part.values() for r in rows if r.status is TaskStatus.QUEUED]
    assert len(queued) == len(jobs.get(clients, plain).parts and queued) > BUCKETS  # released over all of them
    assert {r.part for r in queued} == set(by_part)


def test_a_reduction_is_counted_off_and_released_in_its_own_partition(settings: Settings) -> None:
    clients = spread(settings)
    body = small_request(start="2022-01-01", end="2022-01-20", reducer={"name": "snow_fraction"})
    job = application.submit(clients, body).job  # 2 tiles × 3 periods + 2 reductions (seqs 6 and 7)
    planner.plan(clients, job)
    rows = {r.seq: r for r in tasks.list_tasks(clients.tasks, jobs.get(clients, job).parts)}
    assert rows[6].part == names.partition(job, 6 % BUCKETS) and rows[7].part == names.partition(job, 7 % BUCKETS)
    counter = rollups.RollupWriter("test")
    for seq in range(6):
        held = transitions.claim(clients, rows[seq].ref, f"w{seq}", in_an_hour)
        assert held is not None and held.ref.partition == rows[seq].part
        assert commit(clients, counter, held, TaskStatus.SUCCEEDED, [])
    for seq in (6, 7):
        reduction = tasks.get_task(clients.tasks, rows[seq].part, rows[seq].task)
        assert reduction.status is TaskStatus.QUEUED and reduction.deps == 0
        assert clients.tasks.get_entity(reduction.part, reduction.dispatch)["Task"] == reduction.task
    counts = tasks.state_counts(clients.tasks, jobs.get(clients, job).parts)
    assert (counts["SUCCEEDED"], counts["QUEUED"]) == (6, 2), "the counters of every partition summed"


def test_the_monitor_and_the_reconciler_look_in_every_partition(settings: Settings) -> None:
    clients = spread(settings)
    job = application.submit(clients, small_request()).job  # 8 tasks over 3 partitions
    planner.plan(clients, job)
    row = jobs.get(clients, job)
    by_part = rows_by_part(clients, job)
    last = by_part[row.parts[-1]][0]
    held = transitions.claim(clients, last.ref, "w-gone", lambda *_: tasks.now())  # overdue at once
    assert held is not None
    held = transitions.claim(clients, by_part[row.parts[1]][0].ref, "w-fails", in_an_hour)
    assert held is not None
    retried = fail(clients, rollups.RollupWriter("w"), held, FailureClass.CONNECTION, "reset")
    assert retried is TaskStatus.QUEUED
    for queue in clients.shard_queues:  # every message lost
        queue.clear_messages()
    for part in row.parts:  # and every dispatch entry due
        for entry in clients.tasks.query_entities("PartitionKey eq @p and RowKey ge @lo and RowKey lt @hi",
                                                  parameters={"p": part, "lo": names.DISPATCH_PREFIX,
                                                              "hi": names.DISPATCH_PREFIX + "~"}):
            clients.tasks.delete_entity(part, entry["RowKey"])
            moved = {**entry, "RowKey": names.dispatch_key(0, entry["Task"])}
            clients.tasks.create_entity(moved)
            task = tasks.get_task(clients.tasks, part, entry["Task"])
            clients.tasks.update_entity(task.stored_changes(dispatch=moved["RowKey"]))
    report = sweep.sweep(clients)
    # the overdue attempt revoked (its next attempt's message sent), and the 7 lost messages
    # sent again but the one queued behind that fresh message in its shard queue
    assert report["revoked"] == 1 and report["resent"] == 6
    revoked = tasks.get_task(clients.tasks, last.part, last.task)
    assert revoked.status is TaskStatus.QUEUED and revoked.attempt == 2
    sent = [tasks.TaskRef.decode(m.content) for q in clients.shard_queues for m in q.peek_messages(max_messages=32)]
    assert len(sent) == 7 and {r.partition for r in sent} == set(row.parts)
    assert all(tasks.get_task(clients.tasks, r.partition, r.task).attempt == r.attempt for r in sent)
    assert rollups.newest_failures(clients.tasks, row.parts, 5)[0].part == last.part, "newest first, across them"


def test_a_partitioned_job_runs_to_its_end_and_cancels_in_every_partition(settings: Settings) -> None:
    settings = with_stage(settings.with_(partitions=BUCKETS, shards=BUCKETS), "flaky")
    clients = Clients(settings)
    clients.ensure_resources()
    with running_control(settings), running_workers(settings, count=2):
        job = application.submit(clients, small_request(start="2022-01-01", end="2022-03-31")).job  # 24 tasks
        wait_for(lambda: jobs.get(clients, job).state.finished, 120, "the job to end")
        slow = application.submit(clients, small_request(start="2022-01-01", end="2022-12-31")).job
        wait_for(lambda: jobs.get(clients, slow).state is JobState.RUNNING, 60, "the second job to run")
        jobs.cancel(clients, slow, owner="test")
        wait_for(lambda: jobs.get(clients, slow).state.finished, 120, "the cancel to end")
    row = jobs.get(clients, job)
    assert row.state is JobState.SUCCEEDED and row.buckets == BUCKETS
    found = rows_by_part(clients, job)
    assert sorted(found) == row.parts and all(r.status is TaskStatus.SUCCEEDED for rs in found.values() for r in rs)
    manifest = json.loads(clients.products.download_blob(names.manifest_blob(job)).readall())
    assert sorted(e["task"] for e in manifest["tasks"]) == [names.task_key(s) for s in range(24)]
    ran = attempts.list_attempts(clients.tasks, row.parts)
    assert {a.part for a in ran} == set(row.parts) and len(ran) == 25, "one retry, after a lost connection"
    status = jobs.status(clients, job)
    assert status["counts"]["SUCCEEDED"] == 24 and status["failures"] == {"connection_failure": 1}
    shown = status["workers"]  # each slot's rows of every partition summed
    assert (sum(w["attempts"] for w in shown), sum(w["committed"] for w in shown)) == (25, 24)
    assert attempts.clear_indexes(clients, row.parts) == 0, "nothing left in any partition's indexes"
    cancelled = Counter(r.status for rs in rows_by_part(clients, slow).values() for r in rs)
    assert jobs.get(clients, slow).state is JobState.CANCELLED
    assert set(cancelled) <= {TaskStatus.SUCCEEDED, TaskStatus.CANCELLED} and sum(cancelled.values()) == 92
    assert jobs.status(clients, slow)["counts"]["CANCELLED"] == cancelled[TaskStatus.CANCELLED]


def test_status_reads_each_partition_s_rollups_and_no_task_row(settings: Settings) -> None:
    clients = spread(settings)
    small = application.submit(clients, small_request()).job  # 8 tasks
    large = application.submit(clients, small_request(start="2021-01-01", end="2022-12-31")).job  # 184 tasks
    read: dict[str, int] = {}
    for job in (small, large):
        planner.plan(clients, job)  # its releaser's rollup row in each partition
        with counting_reads() as reads:
            watched = Clients(clients.settings)
            jobs.status(watched, job)
            watched.close()
        read[job] = sum(reads)
    assert read[small] == read[large] == 1 + BUCKETS, "the job row, and one rollup row in each partition"
