"""The worker against a real Azurite: stale and undecodable messages, failures and
retries, the fenced commit, exactly-once completion, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from azure.storage.queue import QueueClient, QueueMessage

from bagpipe.mailserver import MailServer
from pipeline.lifecycle import attempts, completion, jobs, planner, rollups, sweep, tasks, transitions
from pipeline.lifecycle.notify import mailer_for
from pipeline.lifecycle.policy import Act, Move
from pipeline.lifecycle.status import TaskStatus
from pipeline.requests import application
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import (
    WorkerThreads,
    commit,
    in_an_hour,
    parts,
    running_control,
    running_workers,
    small_request,
    wait_for,
    with_stage,
)
from worker import runner

# it times workers, attempts or links: `make test` runs it alone, not beside other tests
pytestmark = pytest.mark.alone


def planned_job(clients: Clients, **request: object) -> str:
    job = application.submit(clients, small_request(**request)).job
    sweep.handle_plan(clients, json.dumps({"job": job}).encode())
    return job


def receive_one(clients: Clients) -> tuple[QueueClient, QueueMessage]:
    for queue in clients.shard_queues:
        for message in queue.receive_messages(max_messages=1, messages_per_page=1, visibility_timeout=30):
            return queue, message
    raise AssertionError("no message in any shard")


def test_stale_message_is_deleted_without_running(clients: Clients, workers: WorkerThreads) -> None:
    job = planned_job(clients)
    queue, message = receive_one(clients)
    ref = tasks.TaskRef.decode(message.content)
    held = transitions.claim(clients, ref, "someone-else", in_an_hour)
    assert held is not None
    queue.delete_message(message)
    # a late duplicate of the same attempt, and one from an attempt long gone
    queue.send_message(ref.encode())
    workers.start(1, slots=1)
    wait_for(lambda: jobs.get(clients, job).state == "RUNNING" and
             sum(tasks.terminal_counts(clients.tasks, parts(clients, job)).values()) == 7, 60, "the other tasks")
    row = tasks.get_task(clients.tasks, ref.partition, ref.task)
    assert row.status is TaskStatus.RUNNING and row.worker == "someone-else"
    tried = [a for a in attempts.list_attempts(clients.tasks, parts(clients, job)) if a.task == ref.task]
    assert [a.worker for a in tried] == ["someone-else"], "the duplicate did not run"


@pytest.mark.parametrize("read_ahead", [False, True])
def test_a_claim_applied_with_its_answer_lost_holds(clients: Clients, monkeypatch: pytest.MonkeyPatch,
                                                    read_ahead: bool) -> None:
    """The storage client retries a claim whose answer it lost after it applied: the retry
    is refused (the row's ETag moved), and the claim is recognised as this worker's own,
    not taken for another's and its message dropped (with a hint read ahead, or without)."""
    job = planned_job(clients)
    _, message = receive_one(clients)
    ref = tasks.TaskRef.decode(message.content)
    hint = tasks.get_task(clients.tasks, ref.partition, ref.task) if read_ahead else None
    real, calls = clients.tasks.submit_transaction, []

    def applied_then_retried(operations: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            real(operations, **kwargs)  # applied, its answer lost: the client sends it again
        return real(operations, **kwargs)

    monkeypatch.setattr(clients.tasks, "submit_transaction", applied_then_retried)
    held = transitions.claim(clients, ref, "w1", in_an_hour, hint=hint)
    assert held is not None and len(calls) == 1
    row = tasks.get_task(clients.tasks, ref.partition, ref.task)
    assert row.status is TaskStatus.RUNNING and row.worker == "w1" and row.etag == held.etag
    assert commit(clients, rollups.RollupWriter("test"), held, TaskStatus.SUCCEEDED, ["out"])
    counts = jobs.status(clients, job)["counts"]
    assert counts.get("SUCCEEDED") == 1 and not counts.get("RUNNING")  # moved once
    ran = attempts.list_attempts(clients.tasks, parts(clients, job))
    assert [a.outcome for a in ran if a.task == ref.task] == ["SUCCEEDED"]


def test_undecodable_message_goes_to_poison_with_a_record(clients: Clients, workers: WorkerThreads) -> None:
    queue = clients.shard_queues[0]
    queue.send_message(b"this is not a task reference")
    queue.send_message(json.dumps({"job": "j1", "task": "../../etc", "attempt": 1}).encode())
    queue.send_message(json.dumps({"job": "j1", "task": "000000001", "attempt": "1"}).encode())
    workers.start(1)
    poison = clients.queue(clients.settings.names.poison_queue(queue.queue_name))
    records = wait_for(lambda: (found := list(poison.peek_messages(max_messages=10))) and len(found) == 3
                       and found, 30, "three poison records")
    bodies = [json.loads(tasks.message_bytes(r.content)) for r in records]
    assert all(b["why"].startswith("undecodable") and b["queue"] == queue.queue_name for b in bodies)
    wait_for(lambda: queue.get_queue_properties().approximate_message_count == 0, 30, "the shard to empty")


def test_failures_retry_then_dead_and_the_job_still_completes(settings: Settings, mail: MailServer) -> None:
    settings = with_stage(settings, "explode_one", max_attempts=4)
    clients = Clients(settings)
    clients.ensure_resources()
    with running_control(settings), running_workers(settings):
        job = planned_job(clients)
        wait_for(lambda: jobs.get(clients, job).state.finished, 120, "the job to finish")
    status = jobs.status(clients, job)
    assert status["state"] == "FAILED"
    assert status["counts"]["DEAD"] == 1 and status["counts"]["SUCCEEDED"] == 7
    # a user program failing the same way on the same input twice does not burn the budget
    assert status["failures"] == {"user_code_error": 2}
    dead = next(t for t in tasks.list_tasks(clients.tasks, parts(clients, job)) if t.status == "DEAD")
    assert dead.attempt == 2
    assert "divided by zero" in dead.last_error
    (mail_,) = [m for _, m in mail.messages() if job in str(m["Subject"])]
    assert "failed" in str(mail_["Subject"]) and "1 dead" in mail_.get_content()


def test_transient_failure_succeeds_on_retry_and_only_that_attempt_is_published(settings: Settings) -> None:
    settings = with_stage(settings, "flaky")
    clients = Clients(settings)
    clients.ensure_resources()
    with running_control(settings), running_workers(settings):
        job = planned_job(clients)
        wait_for(lambda: jobs.get(clients, job).state.finished, 120, "the job to finish")
    assert jobs.get(clients, job).state == "SUCCEEDED"
    manifest = json.loads(clients.products.download_blob(names.manifest_blob(job)).readall())
    retried = [t for t in manifest["tasks"] if t["attempt"] == 2]
    assert len(retried) == 1
    assert retried[0]["outputs"] == [names.output_prefix(job, retried[0]["task"], 2) + "summary.json"]
    assert jobs.status(clients, job)["failures"] == {"connection_failure": 1}


def test_commit_is_fenced_on_the_attempt(clients: Clients) -> None:
    job = planned_job(clients)
    _queue, message = receive_one(clients)
    held = transitions.claim(clients, tasks.TaskRef.decode(message.content), "w1", in_an_hour)
    assert held is not None
    # the attempt is revoked (the monitor's move): the row names attempt 2 now
    row = tasks.get_task(clients.tasks, held.ref.partition, held.ref.task)
    clients.tasks.update_entity(row.stored_changes(status=TaskStatus.QUEUED, attempt=2), **tasks.if_match(row.etag))
    counter = rollups.RollupWriter("w1-0")
    assert not commit(clients, counter, held, TaskStatus.SUCCEEDED, ["stale/output"])
    assert not transitions.still_held(clients, held)
    stored = clients.tasks.get_entity(held.ref.partition, held.ref.task)
    assert stored["Status"] == "QUEUED" and "Outputs" not in stored  # as stored: nothing named
    assert sum(tasks.terminal_counts(clients.tasks, parts(clients, job)).values()) == 0
    # the next attempt runs from the same old message and commits
    again = transitions.claim(clients, held.ref, "w2", in_an_hour)
    assert again is not None and again.ref.attempt == 2
    assert commit(clients, counter, again, TaskStatus.SUCCEEDED, ["good/output"])
    assert json.loads(clients.tasks.get_entity(held.ref.partition, held.ref.task)["Outputs"]) == ["good/output"]


def test_a_worker_lost_while_committing_leaves_its_attempt_to_the_monitor(
        settings: Settings, clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that is lost after its stage ended but before its commit reached the task
    row (killed while storage was slow) leaves the attempt in the monitor's index: the
    monitor revokes it when its heartbeat runs out and a retry completes the job."""
    real_apply = transitions.apply
    lost: list[tasks.TaskRef] = []

    def lost_on_first_commit(clients: Clients, writer: rollups.RollupWriter, held: transitions.Claim,
                             move: Move) -> bool:
        if not lost and move.act is Act.COMMIT:
            lost.append(held.ref)
            raise ConnectionError("the worker is gone before its commit was written")
        return real_apply(clients, writer, held, move)

    monkeypatch.setattr(transitions, "apply", lost_on_first_commit)
    with running_control(settings), running_workers(settings, slots=1):  # one slot: each commit alone
        job = planned_job(clients)
        wait_for(lambda: jobs.get(clients, job).state.finished, 90, "the job to finish")
    assert jobs.get(clients, job).state == "SUCCEEDED"
    (ref,) = lost
    row = tasks.get_task(clients.tasks, ref.partition, ref.task)
    assert row.status is TaskStatus.SUCCEEDED and row.attempt == ref.attempt + 1
    first = clients.tasks.get_entity(ref.partition, names.attempt_key(ref.task, ref.attempt))
    assert first["Outcome"] == TaskStatus.TIMED_OUT.value and first["FailureClass"] == "heartbeat_lost"


def test_completion_happens_exactly_once_under_a_race(clients: Clients, settings: Settings,
                                                      mail: MailServer) -> None:
    job = planned_job(clients)
    counter = rollups.RollupWriter("solo")
    while sum(tasks.terminal_counts(clients.tasks, parts(clients, job)).values()) < 8:
        queue, message = receive_one(clients)
        held = transitions.claim(clients, tasks.TaskRef.decode(message.content), "solo", in_an_hour)
        assert held and commit(clients, counter, held, TaskStatus.SUCCEEDED, [])
        queue.delete_message(message)
        planner.release(clients, job)
    mailer = mailer_for(settings)
    barrier = threading.Barrier(8)
    won: list[bool] = []

    def finisher() -> None:
        barrier.wait()
        won.append(completion.complete(Clients(settings), mailer, job))

    threads = [threading.Thread(target=finisher) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert won.count(True) == 1
    assert jobs.get(clients, job).state == "SUCCEEDED"
    assert len([m for _, m in mail.messages() if job in str(m["Subject"])]) == 1
    assert not completion.complete(clients, mailer, job), "a finished job is not finished again"
    assert job not in jobs.active_jobs(clients)


def test_worker_process_exits_cleanly_on_sigterm(settings: Settings, clients: Clients) -> None:
    env = {**os.environ, **settings.to_env()}
    process = subprocess.Popen([sys.executable, "-m", "bagpipe.cli", "worker", "--slots", "1"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    seen = b""
    while b"started with" not in seen:  # its SIGTERM handler is in place from here on
        line = process.stdout.readline()
        assert line, seen.decode()  # it exited before it started
        seen += line
    time.sleep(1)
    assert process.poll() is None, seen.decode()
    process.send_signal(signal.SIGTERM)
    assert process.wait(20) == 0


def held_back(clients: Clients, job: str) -> int:
    """Messages of ``job`` neither visible in a shard nor named by a task row that is
    running or ended: those a worker holds without running them."""
    visible = sum(len(list(q.peek_messages(max_messages=32))) for q in clients.shard_queues)
    started = sum(1 for t in tasks.list_tasks(clients.tasks, parts(clients, job)) if t.status is not TaskStatus.QUEUED)
    return 8 - visible - started


def test_short_attempts_are_received_ahead_and_a_long_wait_hands_them_back(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose attempts are short receives more messages than it has free slots;
    one that waits longer than the hold goes back to the queue, and runs once all the same."""
    monkeypatch.setattr(runner, "AHEAD_HOLD_S", 0.05)  # shorter than one "slow" attempt (0.2 s)
    monkeypatch.setattr(runner, "AHEAD_BELOW_S", 30.0)  # its attempts short however busy the machine
    settings = with_stage(settings, "slow")
    clients = Clients(settings)
    clients.ensure_resources()
    with running_control(settings), running_workers(settings, slots=1) as pool:
        job = planned_job(clients)
        wait_for(lambda: jobs.get(clients, job).state.finished, 120, "the job to finish")
    (worker,) = pool.workers
    assert worker.inbox.handed_back >= 1
    assert worker.inbox.rows.taken >= 1  # the rows of a receive of several read in one query
    assert jobs.get(clients, job).state == "SUCCEEDED"
    tried = attempts.list_attempts(clients.tasks, parts(clients, job))
    assert sorted(a.task for a in tried) == sorted(t.task for t in tasks.list_tasks(clients.tasks, parts(clients, job)))


def test_a_stopping_worker_hands_back_what_it_received_ahead(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Messages received ahead are visible again as soon as their worker stops, not a
    lease later; long attempts are not received ahead at all."""
    monkeypatch.setattr(runner, "AHEAD_HOLD_S", 60.0)
    monkeypatch.setattr(runner, "AHEAD_BELOW_S", 30.0)  # its attempts short however busy the machine
    settings = with_stage(settings, "slow", lease_seconds=60)
    clients = Clients(settings)
    clients.ensure_resources()
    job = planned_job(clients)
    pool = WorkerThreads(settings)
    (worker,) = pool.start(1, slots=1)
    try:
        wait_for(lambda: len(worker.inbox), 60, "a message received ahead")
    finally:
        pool.stop()
    assert held_back(clients, job) == 0
    assert worker.inbox.handed_back >= 1 or worker.handled == 8

    monkeypatch.setattr(runner, "AHEAD_BELOW_S", 0.1)  # a "slow" attempt (0.2 s) is long now
    with running_workers(settings, slots=1):
        for _ in range(20):
            assert held_back(clients, job) <= 1  # the one its slot runs, between receive and claim
            time.sleep(0.1)


def test_rows_read_ahead_spare_the_claims_their_reads_and_decide_nothing(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows of a receive's messages come in one query per job; a claim on a fresh hint
    makes no read of its own; a stale hint is read again, and the row decides."""
    from pipeline.storage import clients as clients_module
    from worker.readahead import RowsAhead

    seen: list[tuple[str, str]] = []

    def hook(request: Any) -> None:
        http = request.http_request
        if http.method == "GET" and "/messages" not in http.url:
            seen.append(("point" if "(PartitionKey=" in http.url.split("?")[0] else "query", http.url))

    monkeypatch.setitem(clients_module.HOOKS, "raw_request_hook", hook)
    clients = Clients(settings)
    clients.ensure_resources()
    job = planned_job(clients)  # 8 tasks over 4 shards: two a shard, four keys apart
    batches = [list(q.receive_messages(max_messages=8, messages_per_page=8, visibility_timeout=60))
               for q in clients.shard_queues]
    ahead = RowsAhead(clients, 60)
    seen.clear()
    assert sum(ahead.read([tasks.TaskRef.decode(m.content) for m in batch]) for batch in batches) == 8
    assert [kind for kind, _ in seen] == ["query"] * 4  # one query per receive, no point read

    refs = [tasks.TaskRef.decode(m.content) for batch in batches for m in batch]
    first, changed, taken, *rest = refs
    # one row changed since it was read (the reconciler's look moves its dispatch entry),
    # another claimed by someone else meanwhile
    row = tasks.get_task(clients.tasks, changed.partition, changed.task)
    clients.tasks.update_entity(row.stored_changes(last_write="moved"), **tasks.if_match(row.etag))
    assert transitions.claim(clients, taken, "someone-else", in_an_hour) is not None
    seen.clear()
    assert transitions.claim(clients, first, "w1", in_an_hour, hint=ahead.take(first)) is not None
    assert seen == []  # claimed on its hint alone
    assert transitions.claim(clients, changed, "w1", in_an_hour, hint=ahead.take(changed)) is not None
    # the stale hint refused, the row read (and the claimer's rollup row, after a refusal), claimed
    assert [url for kind, url in seen if kind == "point" and f"RowKey='{changed.task}'" in url]
    assert transitions.claim(clients, taken, "w1", in_an_hour, hint=ahead.take(taken)) is None
    assert tasks.get_task(clients.tasks, taken.partition, taken.task).worker == "someone-else"
    for ref in rest:
        assert transitions.claim(clients, ref, "w1", in_an_hour, hint=ahead.take(ref)) is not None
    assert ahead.take(first) is None  # each hint is taken once
    assert {r.status for r in tasks.list_tasks(clients.tasks, parts(clients, job))} == {TaskStatus.RUNNING}


class Naps(threading.Event):
    """A worker's stop event that records the waits its loop takes on it (the loop's thread's:
    the stall probe waits on it too, on a thread of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: threading.Thread | None = None
        self.taken: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is not None and threading.current_thread() is self.loop:
            self.taken.append(timeout)
        return super().wait(timeout)


def test_an_idle_worker_looks_again_soon_after_work_and_ever_less_often_after(
        settings: Settings, clients: Clients) -> None:
    """Its queues found empty, a worker waits FIRST_IDLE_NAP_S, then twice as long each time
    up to its idle_sleep (each look is a billed call; a worker idle for long looks rarely);
    work received, started or ended starts them again at the shortest, so that what comes
    after it (a reduction whose tile tasks ended) is found at once."""
    clients.ensure_resources()
    worker = runner.Worker(settings, slots=2, idle_sleep=0.8)
    naps = worker.stopping = Naps()
    thread = naps.loop = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(naps.taken) >= 6, 60, "six naps of an idle worker")
        first = runner.FIRST_IDLE_NAP_S
        assert naps.taken[:6] == [first, 2 * first, 4 * first, 8 * first, 0.8, 0.8]
        before = len(naps.taken)
        job = planned_job(clients)
        wait_for(lambda: jobs.get(clients, job).state == "RUNNING" and sum(
            tasks.terminal_counts(clients.tasks, parts(clients, job)).values()) == 8, 60, "every task")
        wait_for(lambda: len(naps.taken) >= before + 3, 60, "naps after the job's tasks")
    finally:
        naps.set()
        thread.join(60)
    after = naps.taken[before:]
    assert first in after and max(after) <= 0.8  # started again by the job's tasks
