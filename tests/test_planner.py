"""Planning is idempotent; release keeps the queues within the window."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from pipeline import stages
from pipeline.failures import FailureClass
from pipeline.lifecycle import dispatch, jobs, partitions, planner, rollups, sweep, tasks, transitions
from pipeline.lifecycle.status import JobState, TaskStatus
from pipeline.requests import application
from pipeline.requests.expansion import expand, plan_of
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import (
    commit,
    fail,
    in_an_hour,
    job_write_answer_lost,
    parts,
    queue_depth,
    running_control,
    running_workers,
    small_request,
    wait_for,
)


def task_rows(clients: Clients, job: str) -> list[tasks.TaskRow]:
    return tasks.list_tasks(clients.tasks, parts(clients, job))


def window_job(clients: Clients) -> tuple[str, list[tasks.TaskRow]]:
    """A job of 184 tasks planned, its first window released, and its rows."""
    job = application.submit(clients, small_request(start="2021-01-01", end="2022-12-31")).job
    planner.plan(clients, job)
    assert jobs.get(clients, job).released == clients.settings.window
    return job, task_rows(clients, job)


def end(clients: Clients, rows: list[tasks.TaskRow], seqs: range) -> None:
    """Tasks ``seqs`` claimed and committed: their places in the window free."""
    counter = rollups.RollupWriter("test")
    for seq in seqs:
        held = transitions.claim(clients, rows[seq].ref, "w", in_an_hour)
        assert held is not None and commit(clients, counter, held, TaskStatus.SUCCEEDED, [])


def test_plan_message_twice_makes_no_duplicate(clients: Clients) -> None:
    request = small_request(start="2022-01-01", end="2022-12-31")  # 2 tiles × 46 = 92 tasks
    job = application.submit(clients, request).job
    body = f'{{"job": "{job}"}}'.encode()
    threads = [threading.Thread(target=sweep.handle_plan, args=(clients, body)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sweep.handle_plan(clients, body)
    rows = task_rows(clients, job)
    assert len(rows) == 92
    specs = [(r.params, r.stage) for r in rows]
    assert len(set(specs)) == 92
    assert jobs.get(clients, job).state == JobState.RUNNING.value
    # every released task has a message; a task with two messages is harmless but the
    # release lease keeps concurrent planners from doubling the window
    assert queue_depth(clients) <= 2 * clients.settings.window


def test_plan_resumes_after_a_crash_midway(clients: Clients) -> None:
    request = small_request(start="2022-01-01", end="2022-12-31")
    job = application.submit(clients, request).job
    specs = plan_of(expand(request, 1000))
    # a planner that died after writing its first batch, before moving its cursor
    row = jobs.get(clients, job)
    first = [tasks.task_entity(names.partition(job, partitions.bucket_of(seq, specs[seq], row.buckets)), seq,
                               specs[seq], clients.settings.shards) for seq in range(50)]
    assert sum(tasks.create_batch(clients.tasks, [e for e in first if e["PartitionKey"] == part])
               for part in row.parts) == 50
    planner.plan(clients, job)
    rows = task_rows(clients, job)
    assert [r.seq for r in rows] == list(range(92))
    assert jobs.get(clients, job).planned == 92


def test_release_never_puts_more_than_the_window_in_the_queues(settings: Settings) -> None:
    """A window of 16 over a job of 46 tasks (nearly three windows): the window is bounded
    the same way at any size, and a quarter of the tasks (184 in windows of 64) take less
    than half the time."""
    settings = settings.with_(window=16)
    clients = Clients(settings)
    clients.ensure_resources()
    request = small_request(start="2022-01-01", end="2022-06-30")
    job = application.submit(clients, request).job
    total = len(plan_of(expand(request, 1000)))
    assert total > 2 * settings.window
    depths: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            depths.append(queue_depth(clients))
            stop.wait(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    workers, slots = 2, 2
    with running_control(settings):
        wait_for(lambda: jobs.get(clients, job).state == JobState.RUNNING.value, 30, "planning")
        with running_workers(settings, workers, slots=slots):
            wait_for(lambda: jobs.get(clients, job).state == JobState.SUCCEEDED.value, 180, "the job")
    stop.set()
    sampler.join()
    # each resend of a message still waiting in a queue (the reconciler's, on a slow
    # machine) adds one message beyond the window's; and a queue counts a message until it is
    # deleted, which its worker does once its task has ended, and released the next: each slot
    # may hold one such for a moment. Nothing else may add to the window.
    rows = task_rows(clients, job)
    resends = sum(r.resends for r in rows)
    assert max(depths) <= settings.window + resends + workers * slots, (max(depths), resends)
    assert max(depths) >= settings.window // 2, "the window was used"
    counts = Counter(r.status for r in rows)
    assert counts == {"SUCCEEDED": total}
    # and the counters agree with the rows
    assert tasks.terminal_counts(clients.tasks, parts(clients, job))["SUCCEEDED"] == total


def test_a_release_slower_than_the_lease_still_sends_each_task_once(settings: Settings) -> None:
    """A slow storage must not let a live releaser's lease lapse: another releaser would
    take the cursor and resend the whole window (and the first one's sends would not count)."""
    slow = Clients(settings.with_(lease_seconds=1))
    slow.ensure_resources()
    for queue in slow.shard_queues:
        send = queue.send_message

        def slow_send(body: bytes, _send=send, **kwargs: object) -> object:
            time.sleep(0.1)  # 64 messages over 8 threads: ~0.8 s a chunk, the window ~1.6 s
            return _send(body, **kwargs)

        queue.send_message = slow_send  # type: ignore[method-assign]
    fast = Clients(settings.with_(lease_seconds=1))
    request = small_request(start="2021-01-01", end="2022-12-31")  # 184 tasks, window 64
    job = application.submit(fast, request).job
    planned = threading.Thread(target=planner.plan, args=(slow, job))
    planned.start()
    while planned.is_alive():  # others (workers, the sweep) call release all the while
        planner.release(fast, job)
        time.sleep(0.05)
    planned.join()
    assert jobs.get(fast, job).released == settings.window
    assert queue_depth(fast) == settings.window


def test_a_release_sends_the_room_it_counted_once(clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release counts the window's room once: tasks that end while it sends leave their
    places to the next look, rather than a count of the job's rows and a chunk of a few
    tasks each, chasing the drain."""
    job, rows = window_job(clients)
    window = clients.settings.window
    end(clients, rows, range(0, 10))
    counted, ended_meanwhile = 0, list[bool]()
    state_counts, send = tasks.state_counts, dispatch.send

    def counting(*args: object, **kwargs: object) -> Counter[str]:
        nonlocal counted
        counted += 1
        return state_counts(*args, **kwargs)  # type: ignore[arg-type]

    def ending_meanwhile(*args: object, **kwargs: object) -> int:
        if not ended_meanwhile:  # ten more end while the release sends
            end(clients, rows, range(10, 20))
            ended_meanwhile.append(True)
        return send(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tasks, "state_counts", counting)
    monkeypatch.setattr(dispatch, "send", ending_meanwhile)
    assert planner.release(clients, job) == 10
    assert counted == 1
    monkeypatch.undo()
    assert jobs.get(clients, job).released == window + 10
    assert planner.release(clients, job) == 10, "the next look tops up what drained meanwhile"


def test_a_release_after_a_dead_releaser_fills_the_room_past_its_resends(clients: Clients) -> None:
    """A releaser that died after queueing 20 tasks, before moving the cursor: its successor
    sends their messages again (they are QUEUED already, in the window's count) and still
    fills the room with tasks not yet released."""
    job, rows = window_job(clients)
    window = clients.settings.window
    end(clients, rows, range(10))  # room for ten
    jobs.update(clients, jobs.get(clients, job), released=window - 20)  # the dead releaser's cursor
    assert planner.release(clients, job) == 30
    assert jobs.get(clients, job).released == window + 10
    statuses = [r.status for r in task_rows(clients, job)]
    assert statuses[window - 20:window + 10] == [TaskStatus.QUEUED] * 30
    assert set(statuses[window + 10:]) == {TaskStatus.PENDING}


@pytest.mark.parametrize("lost", ["lease", "cursor"])
def test_a_releaser_whose_write_applied_with_its_answer_lost_goes_on(
        clients: Clients, monkeypatch: pytest.MonkeyPatch, lost: str) -> None:
    """A releaser's lease taken (or its cursor moved), the answer lost and the client's retry
    refused (the row has changed: by that very write): the row read again shows the write,
    so the releaser goes on, sends the room and gives the lease back — not a release given
    up with the lease still held, the window unfed until it runs out."""
    job, rows = window_job(clients)
    window = clients.settings.window
    end(clients, rows, range(10))  # room for ten
    refused = job_write_answer_lost(monkeypatch, clients, lambda fields: ("released" in fields) == (lost == "cursor"))
    assert planner.release(clients, job) == 10
    monkeypatch.undo()
    row = jobs.get(clients, job)
    assert refused and row.released == window + 10
    assert row.releaser_until == planner.NO_RELEASER, "the lease given back"


def test_a_job_all_settled_at_planning_is_left_still_by_a_release(
        clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tile task made already, so settled at planning (the job announced at once): a
    release, as the sweep makes one at each pass over a running job, sends nothing and leaves
    the job row as it is — its walk of the cursor over the settled tasks changed the row
    under the finisher, and kept the sweep from finding the job still."""
    monkeypatch.setitem(stages.MADE_ALREADY, clients.settings.tile_stage,
                        lambda clients, rows: {r.task: [f"tiles:made/{r.task}"] for r in rows})
    job = application.submit(clients, small_request()).job
    planner.plan(clients, job)
    row = jobs.get(clients, job)
    assert row.state is JobState.RUNNING and row.released == 0
    assert {r.status for r in task_rows(clients, job)} == {TaskStatus.CACHED}
    assert planner.release(clients, job) == 0
    assert jobs.get(clients, job).etag == row.etag
    assert queue_depth(clients) == 0


def test_a_reduction_counts_its_tile_tasks_off_and_is_released_once_at_zero(clients: Clients) -> None:
    """Each tile task's end (committed, dead) takes its reduction's count down in its own
    transaction; the last releases it (QUEUED, its dispatch entry, one message), also when
    the last few end at once; nothing lists the reduction's tile tasks."""
    body = small_request(start="2022-01-01", end="2022-01-20", reducer={"name": "snow_fraction"})
    job = application.submit(clients, body).job  # 2 tiles × 3 periods + 2 reductions
    planner.plan(clients, job)
    rows = task_rows(clients, job)
    reductions = [r for r in rows if r.stage == "reduce"]
    assert [r.seq for r in reductions] == [6, 7] and jobs.get(clients, job).tiles == 6
    assert jobs.get(clients, job).released == 6  # the cursor stops before the reductions
    assert reductions[0].parameters()["deps"] == "0,3" and reductions[0].deps == 3

    def claimed(seq: int) -> transitions.Claim:
        held = transitions.claim(clients, rows[seq].ref, f"w{seq}", in_an_hour)
        assert held is not None
        return held

    def reduction(seq: int) -> tasks.TaskRow:
        return tasks.get_task(clients.tasks, rows[seq].part, names.task_key(seq))

    counter = rollups.RollupWriter("test")
    assert commit(clients, counter, claimed(0), TaskStatus.SUCCEEDED, [])
    assert commit(clients, counter, claimed(1), TaskStatus.NO_DATA, [])
    assert reduction(6).status == "PENDING" and reduction(6).deps == 1  # one of its tiles still runs
    before = queue_depth(clients)
    assert fail(clients, counter, claimed(2), FailureClass.USER_CODE, "no", again=True) is TaskStatus.DEAD
    row = reduction(6)
    assert row.status == "QUEUED" and row.deps == 0 and row.dispatch.startswith(names.DISPATCH_PREFIX)
    assert clients.tasks.get_entity(row.part, row.dispatch)["Task"] == row.task, "its dispatch entry"
    assert queue_depth(clients) == before + 1
    # the last three end together: their writes race on the reduction's row, each counts once
    held = [claimed(seq) for seq in (3, 4, 5)]
    ends = [threading.Thread(target=commit, args=(clients, rollups.RollupWriter(f"t{h.ref.task}"), h))
            for h in held]
    for end in ends:
        end.start()
    for end in ends:
        end.join()
    assert reduction(7).status == "QUEUED" and reduction(7).deps == 0
    assert queue_depth(clients) == before + 2
    status = jobs.status(clients, job)["counts"]
    assert (status["QUEUED"], status["SUCCEEDED"], status["NO_DATA"], status["DEAD"]) == (2, 4, 1, 1)
