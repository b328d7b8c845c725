"""Task messages that name several attempts: packed at release by shard and partition,
claimed together in one transaction, each attempt settled on its own and the message
deleted once; a claim together refused or unanswered, attempts given back, a failure's
next attempt in a message of its own; the commits of one partition that come together made
in one transaction, one of them revoked, or the answer lost."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import Counter
from typing import Any

import pytest
from azure.core.exceptions import ServiceResponseError

from pipeline.lifecycle import dispatch, jobs, rollups, sweep, tasks, transitions
from pipeline.lifecycle.policy import Act, Move
from pipeline.lifecycle.status import TaskStatus
from pipeline.lifecycle.tasks import MESSAGE_TASKS, TaskRef
from pipeline.requests import application
from pipeline.settings import Settings
from pipeline.storage import clients as clients_module
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import (
    commit,
    in_an_hour,
    parts,
    running_control,
    running_workers,
    small_request,
    wait_for,
    with_stage,
)
from worker import commits
from worker.delivery import Delivery
from worker.runner import Worker

JOB = "j20261125-000000-abcdef"
SEVERAL = 8


def several(settings: Settings, **changes: object) -> Clients:
    clients = Clients(settings.with_(tasks_per_message=SEVERAL, **changes))
    clients.ensure_resources()
    return clients


def planned(clients: Clients, **request: object) -> str:
    job = application.submit(clients, small_request(**request)).job
    sweep.handle_plan(clients, json.dumps({"job": job}).encode())
    return job


def sent(clients: Clients) -> list[tuple[int, list[TaskRef]]]:
    """The visible messages of every shard queue, as (shard, attempts named)."""
    return [(shard, TaskRef.decode_all(m.content)) for shard, queue in enumerate(clients.shard_queues)
            for m in queue.peek_messages(max_messages=32)]


def test_a_message_of_several_attempts_round_trips_and_a_malformed_one_is_refused() -> None:
    part = names.partition(JOB, 1)
    refs = [TaskRef.of(part, names.task_key(seq), 1 + seq % 2) for seq in (1, 5, 9)]
    assert TaskRef.decode_all(TaskRef.encode_many(refs)) == refs
    assert TaskRef.decode_all(refs[0].encode()) == [refs[0]]  # a message of one, as before
    first = [TaskRef.of(JOB, names.task_key(seq), 1) for seq in (0, 4)]
    assert b"part" not in TaskRef.encode_many(first) and TaskRef.decode_all(TaskRef.encode_many(first)) == first
    with pytest.raises(ValueError):
        TaskRef.decode(TaskRef.encode_many(refs))  # a reader of one attempt is not handed several

    too_many = [TaskRef.of(part, names.task_key(seq), 1) for seq in range(MESSAGE_TASKS + 1)]
    for bad in ([refs[0]], [refs[0], dataclasses.replace(refs[1], backup=True)], [refs[0], first[0]], too_many):
        with pytest.raises(ValueError):
            TaskRef.encode_many(bad)

    pair = [[names.task_key(1), 1], [names.task_key(2), 1]]
    for body in ({"job": JOB, "tasks": pair[:1]},  # one: a plain message says that
                 {"job": JOB, "tasks": [pair[0], [names.task_key(1), 2]]},  # a task twice
                 {"job": JOB, "tasks": [pair[0], ["00000000x", 1]]},
                 {"job": JOB, "tasks": [pair[0], [names.task_key(2), 0]]},
                 {"job": JOB, "tasks": [pair[0], [names.task_key(2), 1, True]]},
                 {"job": JOB, "tasks": [pair[0], [names.task_key(2), "1"]]},
                 {"job": JOB, "tasks": pair, "backup": True},
                 {"job": JOB, "tasks": pair, "part": "j20261125-000000-fedcba.1"},  # another job's
                 {"job": JOB, "tasks": pair, "part": JOB},
                 {"job": JOB, "tasks": names.task_key(1)},
                 {"job": JOB, "tasks": [[names.task_key(n), 1] for n in range(MESSAGE_TASKS + 1)]}):
        with pytest.raises(ValueError):
            TaskRef.decode_all(json.dumps(body).encode())


def test_packing_keeps_a_message_to_one_shard_and_partition_and_a_backup_alone() -> None:
    other = names.partition(JOB, 1)
    messages = [(seq % 2, TaskRef.of(other if seq % 4 >= 2 else JOB, names.task_key(seq), 1)) for seq in range(12)]
    messages.insert(3, (1, TaskRef.of(JOB, names.task_key(99), 2, backup=True)))
    packed = dispatch.pack(messages, 2)
    assert Counter((s, r) for s, refs in packed for r in refs) == Counter(messages)  # each once
    for shard, refs in packed:
        assert 1 <= len(refs) <= 2 and {r.partition for r in refs} == {refs[0].partition}
        assert all(s == shard for s, r in messages if r in refs)
        assert len(refs) == 1 or not any(r.backup for r in refs)
    assert [len(refs) for _, refs in dispatch.pack(messages, 1)] == [1] * len(messages)
    assert max(len(refs) for _, refs in dispatch.pack(messages * 3, 1000)) <= MESSAGE_TASKS


def test_a_release_names_each_queued_task_once_in_messages_of_one_shard_and_partition(settings: Settings) -> None:
    clients = several(settings, partitions=2)
    job = planned(clients, end="2022-03-31")  # 24 tasks
    rows = {row.task: row for row in tasks.list_tasks(clients.tasks, parts(clients, job))}
    found = sent(clients)
    named = [ref.task for _, refs in found for ref in refs]
    assert sorted(named) == sorted(t for t, r in rows.items() if r.status is TaskStatus.QUEUED) and len(named) == 24
    assert len(found) == 4  # a message per shard: each shard's tasks lie in one partition
    for shard, refs in found:
        assert all(rows[r.task].shard == shard and rows[r.task].part == r.partition for r in refs)
        assert len(refs) <= SEVERAL


def test_a_message_of_several_is_claimed_in_one_transaction_and_deleted_once(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    clients = several(settings)
    job = planned(clients)  # 8 tasks over 4 shards: a message of two in each
    assert sorted(len(refs) for _, refs in sent(clients)) == [2, 2, 2, 2]
    claims_alone, together, deletes = Counter[str](), [], []
    real_claim, real_many = transitions.claim, transitions.claim_many
    monkeypatch.setattr(transitions, "claim", lambda *a, **k: claims_alone.update([a[1].task]) or real_claim(*a, **k))
    monkeypatch.setattr(transitions, "claim_many",
                        lambda clients, wanted, *a, **k: together.append(len(wanted)) or real_many(clients, wanted, *a,
                                                                                                   **k))

    def hook(request: Any) -> None:
        if request.http_request.method == "DELETE" and "/messages/" in request.http_request.url:
            deletes.append(request.http_request.url)

    monkeypatch.setitem(clients_module.HOOKS, "raw_request_hook", hook)
    worker = Worker(clients.settings, slots=2, worker_id="w-several")
    try:
        for _ in range(4):
            assert worker.run_once(2) == 1  # one message, two attempts
    finally:
        worker.close()
    assert together == [2, 2, 2, 2] and not claims_alone and len(deletes) == 4
    assert not sent(clients)
    assert {r.status for r in tasks.list_tasks(clients.tasks, parts(clients, job))} == {TaskStatus.SUCCEEDED}
    counts = tasks.state_counts(clients.tasks, parts(clients, job))
    assert counts["SUCCEEDED"] == 8 and counts["RUNNING"] == 0 and counts["QUEUED"] == 0
    # claimed under one writer, ended under its slots': the worker table sums them
    (entry,) = jobs.status(clients, job)["workers"]
    assert (entry["worker"], entry["attempts"], entry["committed"]) == ("w-several", 8, 8)


def test_a_claim_together_refused_claims_nothing_and_one_unanswered_is_read_back(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    clients = several(settings)
    job = planned(clients, end="2022-03-31")
    rows = [r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.status is TaskStatus.QUEUED]
    wanted = [(TaskRef.of(r.part, r.task, r.attempt), r) for r in rows[:3]]
    counter = rollups.RollupWriter("w1~9")
    moved = rows[1]  # changed since it was read (the reconciler moved its dispatch entry)
    clients.tasks.update_entity(moved.stored_changes(last_write="moved"), **tasks.if_match(moved.etag))
    assert transitions.claim_many(clients, wanted, "w1", in_an_hour, counter) is None
    assert {tasks.get_task(clients.tasks, r.part, r.task).status for r in rows[:3]} == {TaskStatus.QUEUED}
    for ref, _ in wanted:  # each then alone, on its row as it is
        assert transitions.claim(clients, ref, "w1", in_an_hour, counter) is not None

    later = [(TaskRef.of(r.part, r.task, r.attempt), r) for r in rows[3:7]]
    real = counter.write

    def applied_then_lost(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        cancelled = tasks.get_task(clients.tasks, rows[6].part, rows[6].task)  # a cancel lands meanwhile
        clients.tasks.update_entity(cancelled.stored_changes(status=TaskStatus.CANCELLED),
                                    **tasks.if_match(cancelled.etag))
        raise ServiceResponseError("connection reset by peer")

    monkeypatch.setattr(counter, "write", applied_then_lost)
    got = transitions.claim_many(clients, later, "w1", in_an_hour, counter)
    monkeypatch.undo()
    assert got is not None and got[3] is None  # the cancelled one is not held
    assert [c.ref.task for c in got if c] == [r.task for r in rows[3:6]]
    for held in got[:3]:  # each holds, fenced on the ETag read back
        assert held is not None and commit(clients, counter, held, TaskStatus.SUCCEEDED, [])
    fresh = [(TaskRef.of(r.part, r.task, r.attempt), r) for r in tasks.list_tasks(clients.tasks, parts(clients, job))
             if r.status is TaskStatus.QUEUED][:4]
    got = transitions.claim_many(clients, fresh, "w1", in_an_hour, counter)
    assert got is not None and all(c and commit(clients, counter, c, TaskStatus.SUCCEEDED, [])
                                      for c in got)
    counts = tasks.state_counts(clients.tasks, parts(clients, job))  # (the cancel was by hand: uncounted)
    assert (counts["RUNNING"], counts["SUCCEEDED"], counts["QUEUED"]) == (4, 7, 24 - 11)


def test_attempts_given_up_go_back_whole_or_in_a_message_of_their_own(clients: Clients) -> None:
    queue = clients.shard_queues[0]
    refs = [TaskRef.of(JOB, names.task_key(seq), 1) for seq in (0, 4, 8)]
    queue.send_message(TaskRef.encode_many(refs))

    def receive() -> Delivery:
        (message,) = queue.receive_messages(max_messages=1, visibility_timeout=60)
        return Delivery(queue, message, TaskRef.decode_all(message.content))

    def visible() -> list[list[TaskRef]]:
        return sorted((TaskRef.decode_all(m.content) for m in queue.peek_messages(max_messages=32)), key=len)

    receive().give_up(refs)  # none went to a slot: the message comes back whole
    assert visible() == [refs]
    delivery = receive()
    delivery.taken()
    delivery.give_up(refs[1:])  # one ran: the others go out in a message of their own
    assert visible() == [refs[1:]]
    delivery.settle()  # the one that ran ends: the message is gone
    assert visible() == [refs[1:]]
    receive().give_up(refs[1:], alone=True)  # long attempts: each in a message of its own
    assert visible() == [[refs[1]], [refs[2]]] or visible() == [[refs[2]], [refs[1]]]
    assert queue.get_queue_properties().approximate_message_count == 2


def test_a_job_runs_to_its_end_on_messages_of_several_with_a_retry_and_waits_given_back(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    from worker import runner

    monkeypatch.setattr(runner, "AHEAD_HOLD_S", 0.05)  # shorter than one attempt: waits are given back
    settings = with_stage(settings, "flaky", tasks_per_message=SEVERAL, partitions=2)
    clients = Clients(settings)
    clients.ensure_resources()
    with running_control(settings), running_workers(settings, count=2, slots=1) as pool:
        job = application.submit(clients, small_request(end="2022-03-31")).job
        wait_for(lambda: jobs.get(clients, job).state.finished, 240, "the job to finish")
        # a message sent again while its first waited untaken (at load 30 a worker was found
        # slow and drained, and the sweep resent what it held) finds its tasks ended after the
        # job: the workers drop it, and nothing stays queued
        wait_for(lambda: not any(q.get_queue_properties().approximate_message_count for q in clients.shard_queues),
                 120, "the queues to empty")
    rows = tasks.list_tasks(clients.tasks, parts(clients, job))
    assert {r.status for r in rows} == {TaskStatus.SUCCEEDED} and len(rows) == 24
    assert sorted(r.attempt for r in rows) == [1] * 23 + [2]  # the flaky one ran again, once
    assert sum(w.inbox.handed_back for w in pool.workers) >= 1
    assert not [m for q in clients.shard_queues for m in q.peek_messages(max_messages=32)]
    poisoned = [clients.queue(settings.names.poison_queue(q.queue_name)) for q in clients.shard_queues]
    assert not [m for q in poisoned for m in q.peek_messages(max_messages=1)]


def committed(*outputs: str) -> Move:
    """The move that commits an attempt with ``outputs``."""
    return Move(Act.COMMIT, TaskStatus.SUCCEEDED, TaskStatus.SUCCEEDED.value, outputs=outputs)


def _claimed(clients: Clients, job: str, count: int) -> list[transitions.Claim]:
    rows = [r for r in tasks.list_tasks(clients.tasks, parts(clients, job)) if r.status is TaskStatus.QUEUED][:count]
    got = transitions.claim_many(clients, [(TaskRef.of(r.part, r.task, r.attempt), r) for r in rows], "w1",
                                    in_an_hour, rollups.RollupWriter("claimer"))
    assert got is not None and None not in got
    return [c for c in got if c]


def test_commits_together_fence_each_row_and_one_revoked_is_refused_alone(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    clients = several(settings)
    job = planned(clients, end="2022-03-31")
    counter = rollups.RollupWriter("w1~9")
    first, revoked, third = _claimed(clients, job, 3)
    row = tasks.get_task(clients.tasks, revoked.ref.partition, revoked.ref.task)  # the monitor moved it on
    clients.tasks.update_entity(row.stored_changes(last_write="revoked"), **tasks.if_match(row.etag))
    ended = [(held, committed(f"out-{held.ref.task}")) for held in (first, revoked, third)]
    real_apply = transitions.apply
    lost = ConnectionError("storage gone for this one")

    def third_lost(clients: Clients, counter: rollups.RollupWriter, held: transitions.Claim, move: Move) -> bool:
        if held is third:
            raise lost
        return real_apply(clients, counter, held, move)

    monkeypatch.setattr(transitions, "apply", third_lost)
    assert transitions.apply_together(clients, counter, ended) == [True, False, lost]  # each its own answer
    monkeypatch.undo()
    assert commit(clients, counter, third, TaskStatus.SUCCEEDED, [f"out-{third.ref.task}"])
    rows = {r.task: r for r in tasks.list_tasks(clients.tasks, parts(clients, job))}
    assert rows[first.ref.task].outputs == json.dumps([f"out-{first.ref.task}"])
    assert rows[revoked.ref.task].status is TaskStatus.RUNNING and rows[revoked.ref.task].outputs == ""
    outcome = clients.tasks.get_entity(revoked.ref.partition, names.attempt_key(revoked.ref.task, 1))["Outcome"]
    assert outcome == "DISCARDED"

    real = counter.write

    def applied_then_lost(*args: Any, **kwargs: Any) -> Any:
        real(*args, **kwargs)
        raise ServiceResponseError("connection reset by peer")

    group = _claimed(clients, job, 4)
    monkeypatch.setattr(counter, "write", applied_then_lost)
    assert transitions.apply_together(clients, counter, [(h, committed()) for h in group]) == [True] * 4
    monkeypatch.undo()
    counts = tasks.state_counts(clients.tasks, parts(clients, job))  # each counted once
    assert (counts["SUCCEEDED"], counts["RUNNING"]) == (6, 1)
    assert not [e for e in clients.tasks.query_entities("RowKey ge @lo and RowKey lt @hi",
                                                        parameters={"lo": names.DEADLINE_PREFIX,
                                                                    "hi": names.DEADLINE_PREFIX + "~"})
                if e["Task"] in {h.ref.task for h in [first, third, *group]}]  # their deadline entries gone


def test_a_workers_commits_that_come_together_share_a_transaction_and_one_alone_waits_for_none(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    clients = several(settings)
    job = planned(clients, end="2022-03-31")
    monkeypatch.setattr(commits, "LINGER_S", 5.0)  # a group that waited for nothing would show
    group: list[int] = []
    real = transitions.apply_together
    monkeypatch.setattr(transitions, "apply_together",
                        lambda c, k, ended: group.append(len(ended)) or real(c, k, ended))
    together = commits.Commits(clients, rollups.RollupWriter("w1~2"))
    held = _claimed(clients, job, 3)
    results: list[bool] = []

    def end(one: transitions.Claim) -> None:
        with together.running(one.ref.partition):
            results.append(together.commit(rollups.RollupWriter(f"w1~{one.ref.task}"), one, committed()))

    with together.running(held[0].ref.partition):  # three slots of one partition at once ...
        threads = [threading.Thread(target=end, args=(one,)) for one in held]
        for thread in threads:
            thread.start()
        wait_for(lambda: len(together._waiting.get(held[0].ref.partition, [])) == 3, 10, "three commits waiting")
    for thread in threads:  # ... and a fourth that ended without one: the group no longer waits for it
        thread.join(10)
    assert results == [True] * 3 and group == [3] and together.grouped == 3
    (alone,) = _claimed(clients, job, 1)
    started = time.monotonic()
    with together.running(alone.ref.partition):
        assert together.commit(rollups.RollupWriter("w1~0"), alone, committed())  # by itself ...
    assert time.monotonic() - started < commits.LINGER_S / 2  # ... at once: nothing else of its partition runs
    assert group == [3]
    assert tasks.state_counts(clients.tasks, parts(clients, job))["SUCCEEDED"] == 4
