"""The monitor against Azurite with real worker processes and stage processes: runtime
history, the kill rule, revocation of stragglers and of lost workers, real kills."""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ServiceResponseError
from azure.data.tables import TableClient, UpdateMode

from bagpipe.azurite import Azurite
from bagpipe.serving import free_port
from pipeline.lifecycle import attempts, jobs, policy, rollups, runtimes, sweep, tasks, transitions
from pipeline.lifecycle.status import TaskStatus
from pipeline.requests import application
from pipeline.requests.expansion import expand
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import (
    PIDS,
    commit,
    in_an_hour,
    parts,
    running_control,
    running_workers,
    small_request,
    wait_for,
    with_stage,
)
from worker.delivery import Delivery
from worker.lease import Lease
from worker.slot import BOUND_PAST_KILL_TIME, PAST_KILL_TIME

# it times workers, attempts or links: `make test` runs it alone, not beside other tests
pytestmark = pytest.mark.alone


def runtimes_table(clients: Clients):
    return clients.runtimes


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_runtime_history_is_exact_under_concurrent_updates(clients: Clients) -> None:
    samples = [random.Random(i).uniform(0.5, 3.0) for i in range(120)]
    chunks = [samples[i::6] for i in range(6)]

    def writer(chunk: list[float]) -> None:
        for value in chunk:
            runtimes.merge(runtimes_table(clients), "digest", "MOD10A2", runtimes.Runtime().add(value))

    threads = [threading.Thread(target=writer, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    found = runtimes.read(runtimes_table(clients), "digest", "MOD10A2")
    assert found.count == len(samples)
    assert found.mean == pytest.approx(statistics.fmean(samples), rel=1e-9)
    assert found.stdev == pytest.approx(statistics.stdev(samples), rel=1e-9)


def test_merged_statistics_equal_one_sample_at_a_time() -> None:
    samples = [random.Random(i).uniform(0.1, 9.0) for i in range(50)]
    one_by_one, left, right = runtimes.Runtime(), runtimes.Runtime(), runtimes.Runtime()
    for value in samples:
        one_by_one = one_by_one.add(value)
    for value in samples[:17]:
        left = left.add(value)
    for value in samples[17:]:
        right = right.add(value)
    merged = left.merge(right)
    assert merged.count == 50
    assert merged.mean == pytest.approx(one_by_one.mean, rel=1e-12)
    assert merged.stdev == pytest.approx(statistics.stdev(samples), rel=1e-9)
    assert runtimes.Runtime().merge(left) == left and left.merge(runtimes.Runtime()) == left


def test_workers_books_merge_into_an_exact_history_and_keep_samples_storage_refused(
        clients: Clients, azurite: Azurite) -> None:
    table = runtimes_table(clients)
    samples = [random.Random(100 + i).uniform(0.5, 3.0) for i in range(90)]
    books = [runtimes.RuntimeBook(table, flush_s=0.05) for _ in range(3)]

    def writer(book: runtimes.RuntimeBook, chunk: list[float]) -> None:
        for value in chunk:
            book.add("book", "MOD10A2", value)
            time.sleep(0.01)

    threads = [threading.Thread(target=writer, args=(b, samples[i::3])) for i, b in enumerate(books)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(b.flush() for b in books)
    found = runtimes.read(table, "book", "MOD10A2")
    assert found.count == len(samples)
    assert found.mean == pytest.approx(statistics.fmean(samples), rel=1e-9)
    assert found.stdev == pytest.approx(statistics.stdev(samples), rel=1e-9)

    # a book whose storage is unreachable keeps its samples, counts them in its reads, and
    # merges them once storage answers again
    cut = TableClient.from_connection_string(
        clients.settings.storage_connection.replace(f":{azurite.table_port}/", f":{free_port()}/"),
        table.table_name, retry_total=0)
    book = runtimes.RuntimeBook(cut, flush_s=3600)
    book.add("book", "MOD10A2", 100.0)
    assert not book.flush()
    book.table = table
    assert book.read("book", "MOD10A2").count == len(samples) + 1
    assert book.flush()
    assert runtimes.read(table, "book", "MOD10A2").count == len(samples) + 1


def test_kill_rule_ceiling_then_factor_times_mean_with_a_floor(settings: Settings) -> None:
    limits = policy.limits_for(settings.with_(kill_floor_s=2.0, kill_ceiling_s=600.0, min_samples=5), "digest")
    assert policy.kill_after(limits, runtimes.Runtime(4, 30.0, 0.0)) == 600.0  # cold: the ceiling
    assert policy.kill_after(limits, runtimes.Runtime(5, 30.0, 0.0)) == 120.0  # 4 × mean
    assert policy.kill_after(limits, runtimes.Runtime(50, 0.1, 0.0)) == 2.0  # the floor
    tuned = settings.with_(stage_limits=json.dumps({"digest": {"factor": 3, "max_attempts": 7}}), min_samples=1)
    assert policy.kill_after(policy.limits_for(tuned, "digest"), runtimes.Runtime(5, 30.0, 0.0)) == 90.0
    assert policy.limits_for(tuned, "digest").max_attempts == 7
    assert policy.limits_for(tuned, "digest").max_transient_attempts == settings.max_transient_attempts
    assert policy.limits_for(tuned, "other").factor == settings.kill_factor
    with pytest.raises(ValueError, match="unknown limit"):
        policy.limits_for(settings.with_(stage_limits='{"digest": {"factr": 3}}'), "digest")


def test_each_revocation_for_time_gives_the_next_attempts_longer_up_to_the_ceiling(settings: Settings) -> None:
    limits = policy.limits_for(settings.with_(kill_floor_s=2.0, kill_ceiling_s=600.0, min_samples=5), "digest")
    known = runtimes.Runtime(5, 30.0, 0.0)
    assert [policy.kill_after(limits, known, n) for n in (0, 1, 2, 3, 4, 5)] == [120, 240, 480, 600, 600, 600]
    assert policy.kill_after(limits, runtimes.Runtime(50, 0.1, 0.0), 2) == 8.0  # from the floor
    assert policy.kill_after(limits, runtimes.Runtime(4, 30.0, 0.0), 2) == 600.0  # cold: the ceiling
    flat = policy.limits_for(settings.with_(stage_limits='{"digest": {"backoff": 1}}', min_samples=5), "digest")
    assert policy.kill_after(flat, known, 8) == 120.0
    # a limit above the ceiling (a long stage) is never cut down to it
    assert policy.kill_after(limits, runtimes.Runtime(5, 300.0, 0.0), 1) == 1200.0


def test_quantile_rule_revokes_at_mean_plus_sigmas_when_that_is_earlier(settings: Settings) -> None:
    limits = policy.limits_for(settings.with_(kill_floor_s=1.0, min_samples=5, kill_sigmas=4.0), "digest")
    history = runtimes.Runtime()
    for seconds in (9.0, 10.0, 11.0, 10.0, 9.5, 10.5):
        history = history.add(seconds)
    assert policy.kill_after(limits, history) == pytest.approx(10.0 + 4 * history.stdev)  # < 40 s
    noisy = runtimes.Runtime(50, 10.0, 49 * 25.0)  # stdev 5: mean + 4σ = 30 s, 4 × mean = 40 s
    assert policy.kill_after(limits, noisy) == pytest.approx(30.0)
    wild = runtimes.Runtime(50, 10.0, 49 * 400.0)  # stdev 20: 4 × mean comes first
    assert policy.kill_after(limits, wild) == pytest.approx(40.0)


def marked_task(clients: Clients, job: str) -> tasks.TaskRow:
    (row,) = [r for r in tasks.list_tasks(clients.tasks, parts(clients, job))
              if r.parameters()["tile"] == "h10v05" and r.parameters()["date"] == "2022-01-09"]
    return row


def attempt_rows(clients: Clients, job: str, task: str) -> list[attempts.AttemptRow]:
    return [a for a in attempts.list_attempts(clients.tasks, parts(clients, job)) if a.task == task]


def index_rows(clients: Clients, job: str, task: str) -> list[str]:
    """The task's entries in the monitor's deadline index."""
    return [r["RowKey"] for r in clients.tasks.query_entities(
        "PartitionKey eq @p and RowKey ge @lo and RowKey lt @hi",
        parameters={"p": job, "lo": names.DEADLINE_PREFIX, "hi": names.DEADLINE_PREFIX + "~"}) if r["Task"] == task]


def test_straggler_is_revoked_at_about_4x_and_succeeds_on_retry(settings: Settings) -> None:
    # the kill rule alone (a backup would end the straggler first: tests/test_speculation.py)
    settings = with_stage(settings, "straggler", kill_floor_s=0.5, min_samples=3, kill_grace_s=1.0,
                          speculate_share=0.0, slow_ratio=10.0)
    clients = Clients(settings)
    clients.ensure_resources()
    mean = 0.8  # what a 0.5 s sleep costs end to end here, seeded as history: fifty samples,
    # so that the job's own tasks, slow on a loaded machine, cannot lift 4× the mean past 5 s
    work = expand(small_request(), 100)[0].work()  # the history is per megapixel
    runtimes.merge(runtimes_table(clients), "straggler", "MOD10A2",
                   runtimes.Runtime(50, mean / work, 50 * (0.1 / work) ** 2))
    with running_control(settings), running_workers(settings, slots=2) as pool:
        job = application.submit(clients, small_request()).job
        wait_for(lambda: jobs.get(clients, job).state.finished, 240, "the job to finish")
    assert jobs.get(clients, job).state == "SUCCEEDED"
    task = marked_task(clients, job)
    assert task.attempt == 2 and task.status == "SUCCEEDED" and task.timeouts == 1
    assert settings.slow_ratio in pool.workers[0].pace.ratios  # revoked for time: at least "slow"
    first, second = attempt_rows(clients, job, task.task)
    assert first.failure_class == "execution_timeout" and first.revoked_by in ("monitor", "worker")
    ran_for = (first.ended_at - first.started_at).total_seconds()
    history = runtimes.read(runtimes_table(clients), "straggler", "MOD10A2")
    assert 3.0 * mean <= ran_for <= 4 * history.mean * work + 2.0, ran_for  # revoked at about 4× the mean
    assert second.outcome == "SUCCEEDED"
    # the revoked stage process is dead, and only the retry's output is published
    pid = int((PIDS / f"{job}-{task.task}-1.pid").read_text())
    assert not alive(pid)
    assert json.loads(task.outputs) == [names.output_prefix(job, task.task, 2) + "summary.json"]
    status = jobs.status(clients, job)
    # (on a loaded machine a normal 0.5 s task may pass 4 × 0.8 s too: it is revoked and retried
    # like the straggler, and the job still succeeds)
    assert set(status["failures"]) == {"execution_timeout"}
    assert status["monitor_kills"] == status["failures"]["execution_timeout"] >= 1


def assert_other_kills_by_rule(clients: Clients, job: str, straggler: str, status: dict[str, Any]) -> None:
    """The straggler's revocation counted, and any other task's attempt revoked for time
    revoked by a rule: at its kill time (4 × 0.8 s), having run that long, or by its pace.
    A normal 0.5 s task may meet either on a loaded machine (at load 20 one ran past 3.2 s,
    and its pace said so): the count of kills was 2 where 1 was asserted."""
    assert status["monitor_kills"] == status["failures"]["execution_timeout"] >= 1, status
    for attempt in attempts.list_attempts(clients.tasks, parts(clients, job)):
        if attempt.task != straggler and attempt.failure_class == "execution_timeout":
            assert attempt.revoked_by == "monitor" or attempt.error in (PAST_KILL_TIME, BOUND_PAST_KILL_TIME), attempt
            if attempt.error != BOUND_PAST_KILL_TIME:
                assert (attempt.ended_at - attempt.started_at).total_seconds() >= 3.0, attempt


def with_history(settings: Settings, stage: str) -> tuple[Settings, Clients]:
    """The deployment running ``stage``, its history 0.8 ± 0.1 s a task (fifty samples): a
    kill time of 4 × 0.8 s."""
    settings = with_stage(settings, stage, kill_floor_s=0.5, min_samples=3, kill_grace_s=1.0)
    clients = Clients(settings)
    clients.ensure_resources()
    work = expand(small_request(), 100)[0].work()
    runtimes.merge(runtimes_table(clients), stage, "MOD10A2", runtimes.Runtime(50, 0.8 / work, 50 * (0.1 / work) ** 2))
    return settings, clients


def test_a_worker_revokes_its_own_attempt_at_its_kill_time(settings: Settings) -> None:
    # no monitor runs: the worker, which knows its attempt's kill time, makes the move itself
    settings, clients = with_history(settings, "straggler")
    job = application.submit(clients, small_request()).job
    sweep.handle_plan(clients, json.dumps({"job": job}).encode())
    with running_workers(settings, slots=2):
        task = wait_for(lambda: (found := marked_task(clients, job)).status == "SUCCEEDED" and found, 240,
                        "the straggler's retry to commit")
    assert task.attempt == 2 and task.timeouts == 1 and task.last_failure == "execution_timeout"
    first, second = attempt_rows(clients, job, task.task)
    assert (first.revoked_by, first.failure_class, second.outcome) == ("worker", "execution_timeout", "SUCCEEDED")
    # at its kill time, 4 × 0.8 s, not after the 5 s it needed: the worker says which rule it
    # applied (its storage writes, slow on a loaded machine, come after the decision)
    assert first.error == PAST_KILL_TIME and (first.ended_at - first.started_at).total_seconds() >= 3.0
    assert not alive(int((PIDS / f"{job}-{task.task}-1.pid").read_text()))
    assert_other_kills_by_rule(clients, job, task.task, jobs.status(clients, job))
    assert index_rows(clients, job, task.task) == []


def test_a_worker_revokes_an_attempt_whose_pace_takes_it_far_past_its_kill_time(settings: Settings) -> None:
    # the straggler says its progress: a tenth of its work in 0.8 s, where its kill time
    # (4 × 0.8 s) allows 3.2 s for all of it; its worker revokes it once it has run a fifth of
    # those 3.2 s, not at them; the job's other tasks, saying a pace within their history, run on
    settings, clients = with_history(settings, "paced_straggler")
    with running_control(settings), running_workers(settings, slots=2):
        job = application.submit(clients, small_request()).job
        wait_for(lambda: jobs.get(clients, job).state.finished, 240, "the job to finish")
    task = marked_task(clients, job)
    assert task.attempt == 2 and task.timeouts == 1 and task.last_failure == "execution_timeout"
    first, second = (a for a in attempt_rows(clients, job, task.task) if not a.backup)  # (the monitor may back it up)
    assert (first.revoked_by, first.failure_class, second.outcome) == ("worker", "execution_timeout", "SUCCEEDED")
    # at its pace, well before its kill time (3.2 s): the worker says which rule it applied, where
    # the attempt's end, written after the decision, came at 3.0 s on a machine at load 20
    assert first.error == BOUND_PAST_KILL_TIME, first
    assert not alive(int((PIDS / f"{job}-{task.task}-1.pid").read_text()))
    status = jobs.status(clients, job)
    assert status["state"] == "SUCCEEDED"
    assert_other_kills_by_rule(clients, job, task.task, status)  # the others, within their pace, run on


def test_stage_that_ignores_sigterm_is_sigkilled_with_its_children(settings: Settings) -> None:
    settings = with_stage(settings, "stubborn", kill_ceiling_s=3.0, kill_floor_s=1.0, kill_grace_s=1.0)
    clients = Clients(settings)
    clients.ensure_resources()
    with running_control(settings), running_workers(settings, slots=2):
        job = application.submit(clients, small_request()).job
        pid_file = PIDS / f"{job}-stubborn.pid"
        pids = wait_for(lambda: pid_file.exists() and [int(p) for p in pid_file.read_text().split()],
                        60, "the stubborn stage")
        wait_for(lambda: not any(alive(p) for p in pids), 30, "the stage's process group to die")
        wait_for(lambda: jobs.get(clients, job).state.finished, 240, "the job to finish")
    assert jobs.get(clients, job).state == "SUCCEEDED"
    assert marked_task(clients, job).attempt == 2


def test_worker_killed_mid_stage_task_finishes_elsewhere(settings: Settings) -> None:
    # the marked task's first attempt never ends by itself, ignores SIGTERM and has a child
    settings = with_stage(settings, "stubborn", kill_ceiling_s=600.0)
    clients = Clients(settings)
    clients.ensure_resources()
    env = {**os.environ, **settings.to_env()}
    with running_control(settings):
        job = application.submit(clients, small_request()).job
        doomed = subprocess.Popen([sys.executable, "-m", "bagpipe.cli", "worker", "--slots", "8"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        marked = wait_for(lambda: jobs.get(clients, job).state == "RUNNING" and marked_task(clients, job),
                          60, "planning")
        pid_file = PIDS / f"{job}-stubborn.pid"
        wait_for(lambda: pid_file.exists() and len(pid_file.read_text().split()) == 2, 60, "the marked task to start")
        stage_pids = [int(p) for p in pid_file.read_text().split()]
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        wait_for(lambda: not any(alive(p) for p in stage_pids), 10, "the orphaned stage to die with its worker")
        killed_at = time.monotonic()
        with running_workers(settings, slots=2):
            wait_for(lambda: jobs.get(clients, job).state.finished, 240, "the job to finish")
        recovered_in = time.monotonic() - killed_at
    assert jobs.get(clients, job).state == "SUCCEEDED"
    row = tasks.get_task(clients.tasks, marked.part, marked.task)
    assert row.attempt == 2 and row.last_failure == "heartbeat_lost"
    assert "Timeouts" not in clients.tasks.get_entity(marked.part, marked.task)  # a lost heartbeat is not a timeout
    assert json.loads(row.outputs) == [names.output_prefix(job, marked.task, 2) + "summary.json"]
    assert recovered_in < settings.lease_seconds + 20


def test_sweep_activity_revokes_an_overdue_attempt(clients: Clients, settings: Settings) -> None:
    job = application.submit(clients, small_request()).job
    sweep.handle_plan(clients, json.dumps({"job": job}).encode())
    queue = clients.shard_queues[0]
    message = next(iter(queue.receive_messages(max_messages=1, visibility_timeout=60)))
    due_at_once = lambda *_: tasks.now()  # noqa: E731
    held = transitions.claim(clients, tasks.TaskRef.decode(message.content), "w-gone", due_at_once)
    assert held is not None
    report = sweep.sweep(clients)
    assert report["revoked"] == 1
    row = tasks.get_task(clients.tasks, held.ref.partition, held.ref.task)
    assert row.status == "QUEUED" and row.attempt == 2 and row.last_failure == "execution_timeout"
    assert row.timeouts == 1  # its next attempt may run backoff × longer
    assert not transitions.still_held(clients, held), "the old attempt's heartbeat is refused"
    assert index_rows(clients, job, held.ref.task) == []
    assert sweep.sweep(clients)["revoked"] == 0


def test_the_index_moves_with_the_task_row_in_one_write(clients: Clients) -> None:
    job = application.submit(clients, small_request()).job
    sweep.handle_plan(clients, json.dumps({"job": job}).encode())
    ref = tasks.list_tasks(clients.tasks, parts(clients, job))[0].ref

    def overtaken(*_: object) -> datetime:  # another claim lands between the read and the write
        clients.tasks.update_entity({"PartitionKey": job, "RowKey": ref.task, "Worker": "other"}, mode=UpdateMode.MERGE)
        return in_an_hour()

    assert transitions.claim(clients, ref, "loser", overtaken) is None
    assert index_rows(clients, job, ref.task) == [] and attempt_rows(clients, job, ref.task) == []
    held = transitions.claim(clients, ref, "winner", in_an_hour)
    assert held is not None
    assert index_rows(clients, job, ref.task) == [held.index]
    (attempt,) = attempt_rows(clients, job, ref.task)
    assert attempt.worker == "winner" and attempt.outcome == "RUNNING"
    assert commit(clients, rollups.RollupWriter("t"), held, TaskStatus.SUCCEEDED, [])
    assert index_rows(clients, job, ref.task) == []
    (attempt,) = attempt_rows(clients, job, ref.task)
    assert attempt.outcome == "SUCCEEDED" and attempt.runtime_s >= 0
    # a commit whose index entry had already gone still commits, and leaves none
    second = tasks.list_tasks(clients.tasks, parts(clients, job))[1].ref
    held = transitions.claim(clients, second, "w", in_an_hour)
    assert held is not None
    attempts.unindex(clients, job, held.index)
    assert commit(clients, rollups.RollupWriter("t"), held, TaskStatus.SUCCEEDED, [])
    assert clients.tasks.get_entity(second.partition, second.task)["Status"] == "SUCCEEDED"
    assert sum(tasks.terminal_counts(clients.tasks, parts(clients, job)).values()) == 2


def test_a_heartbeat_written_but_answered_with_an_error_leaves_no_row_to_revoke_the_live_attempt(
        clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    job = application.submit(clients, small_request()).job
    sweep.handle_plan(clients, json.dumps({"job": job}).encode())
    queue = clients.shard_queues[0]
    message = next(iter(queue.receive_messages(max_messages=1, visibility_timeout=60)))
    ref = tasks.TaskRef.decode(message.content)
    held = transitions.claim(clients, ref, "w1", lambda *_: tasks.now() + timedelta(minutes=5))
    assert held is not None
    first = held.index
    real = attempts.move
    lost: list[str] = []

    def written_then_error(*args: Any, **kwargs: Any) -> str:
        if not lost:
            lost.append(real(*args, **kwargs))  # the row is moved ...
            raise ServiceResponseError("connection reset by peer")  # ... and the answer lost
        return real(*args, **kwargs)

    monkeypatch.setattr(attempts, "move", written_then_error)
    with Lease(clients, Delivery(queue, message, [ref]), held) as lease:
        wait_for(lambda: lost and len(rows := index_rows(clients, job, ref.task)) == 1
                 and rows[0] not in (first, lost[0]), 30, "one index row, written after the failed beat")
        assert not lease.revoked.is_set()
    assert commit(clients, rollups.RollupWriter("t"), held, TaskStatus.SUCCEEDED, [])
    assert index_rows(clients, job, ref.task) == []
