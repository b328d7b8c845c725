"""Backup attempts at a job's tail (``pipeline.lifecycle.speculation``), against a real
Azurite: asked for once, only at the tail and within the job's share; the first of an
attempt and its backup to commit ends the task and the other's work is thrown away; a
failed backup leaves the task to its attempt; an overdue attempt waits for its running
backup, and gets revoked once that backup lapses. Then real workers: a straggler's backup
on the other worker wins, and the straggler's stage process is killed."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from azure.core.exceptions import ServiceResponseError

from pipeline.failures import FailureClass
from pipeline.lifecycle import attempts, ends, jobs, rollups, runtimes, sweep, tasks, transitions
from pipeline.lifecycle.policy import Act, Ending, Outcome
from pipeline.lifecycle.status import TaskStatus
from pipeline.requests import application
from pipeline.requests.expansion import expand
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import (
    PIDS,
    commit,
    end,
    in_an_hour,
    parts,
    running_control,
    running_workers,
    small_request,
    wait_for,
    with_stage,
)
from tests.test_monitor import alive, attempt_rows, index_rows, marked_task
from tests.test_worker import planned_job, receive_one

# it times workers, attempts or links: `make test` runs it alone, not beside other tests
pytestmark = pytest.mark.alone


def _at_once(stage: str, params: dict[str, str], started: datetime) -> datetime:
    """A speculation time: a backup would help from the start."""
    return started


def _in(seconds: float) -> Callable[..., datetime]:
    """A kill time ``seconds`` from the claim."""
    return lambda *_: tasks.now() + timedelta(seconds=seconds)


def _claim_all(clients: Clients, job: str, slow: int = 1, leave: int = 0,
               first_kill: Callable[..., datetime] = in_an_hour) -> list[transitions.Claim]:
    """Claim the job's tasks (all but ``leave`` of them, which stay QUEUED), each by a worker
    of its own; the first ``slow`` ones due for a backup at once, the first one to be
    revoked at ``first_kill``."""
    total = jobs.get(clients, job).total
    held: list[transitions.Claim] = []
    while len(held) < total - leave:
        queue, message = receive_one(clients)
        queue.delete_message(message)
        ref = tasks.TaskRef.decode(message.content)
        if ref.job != job:  # another job's backup
            continue
        claim = transitions.claim(clients, ref, f"w{len(held)}", in_an_hour if held else first_kill,
                                  speculate_time=_at_once if len(held) < slow else None)
        assert claim is not None
        held.append(claim)
    return held


def _backup_message(clients: Clients) -> tasks.TaskRef:
    queue, message = receive_one(clients)
    queue.delete_message(message)
    return tasks.TaskRef.decode(message.content)


def _messages(clients: Clients) -> int:
    """How many task messages the shards hold, visible now."""
    return sum(len(q.peek_messages(max_messages=32)) for q in clients.shard_queues)


def _backed_up(clients: Clients, first_kill: Callable[..., datetime] = in_an_hour,
               backup_kill: Callable[..., datetime] = in_an_hour) -> tuple[str, list[transitions.Claim],
                                                                         transitions.Claim]:
    """A planned job whose tasks are all claimed, the first one's backup asked for by the
    monitor and taken by worker "spare": the job, the attempts and the backup."""
    job = planned_job(clients)
    held = _claim_all(clients, job, first_kill=first_kill)
    assert sweep.sweep(clients)["backups"] == 1
    backup = transitions.claim_backup(clients, _backup_message(clients), "spare", backup_kill)
    assert backup is not None
    return job, held, backup


def test_a_backup_asked_for_once_commits_first_and_its_attempt_is_thrown_away(settings: Settings) -> None:
    clients = Clients(settings.with_(speculate_share=0.5))  # room for more backups than one
    clients.ensure_resources()
    job = planned_job(clients)
    first, *_ = _claim_all(clients, job)
    assert sweep.sweep(clients)["backups"] == 1
    ref = _backup_message(clients)
    assert ref == tasks.TaskRef(job, first.ref.task, 1, backup=True)
    assert tasks.TaskRef.decode(ref.encode()) == ref
    with pytest.raises(transitions.NotHere):  # not on the machine of the attempt it copies
        transitions.claim_backup(clients, ref, first.worker, in_an_hour)
    backup = transitions.claim_backup(clients, ref, "spare", in_an_hour)
    assert backup is not None and backup.etag == first.etag  # one fence for both
    assert transitions.claim_backup(clients, ref, "another", in_an_hour) is None  # taken once
    again = sweep.sweep(clients)
    assert (again["backups"], again["errors"]) == (0, 0)  # asked for once
    assert jobs.status(clients, job)["speculative_attempts"] == 1

    counter = rollups.RollupWriter("test")
    made = [names.output_prefix(job, ref.task, 1, backup=True) + "summary.json"]
    assert commit(clients, counter, backup, TaskStatus.SUCCEEDED, made)
    assert not transitions.still_held(clients, first)
    primary = attempt_rows(clients, job, ref.task)[0]  # closed by the backup's commit, whatever its worker does
    assert (primary.backup, primary.outcome) == (False, transitions.LOST_TO_BACKUP) and primary.ended_at is not None
    assert not commit(clients, counter, first, TaskStatus.SUCCEEDED, ["its own"])
    row = tasks.get_task(clients.tasks, ref.partition, ref.task)
    assert row.status is TaskStatus.SUCCEEDED and row.worker == "spare" and json.loads(row.outputs) == made
    primary, copy = attempt_rows(clients, job, ref.task)
    assert (primary.outcome, primary.discarded) == (transitions.LOST_TO_BACKUP, True)  # its refused commit keeps it
    assert (copy.backup, copy.outcome, copy.worker) == (True, "SUCCEEDED", "spare")
    assert rollups.read(clients.tasks, parts(clients, job)).counts["SUCCEEDED"] == 1  # counted once
    assert index_rows(clients, job, ref.task) == []  # each left the index with its commit, applied or refused


def test_the_attempt_commits_first_and_its_backup_is_refused(clients: Clients) -> None:
    job, (first, *_), backup = _backed_up(clients)
    assert transitions.still_held(clients, backup)
    counter = rollups.RollupWriter("test")
    assert commit(clients, counter, first, TaskStatus.SUCCEEDED, ["first"])
    assert not transitions.still_held(clients, backup)
    end(clients, counter, backup, Outcome.of(Ending.REVOKED))  # what its worker does once its lease sees the fence gone
    assert not attempts.is_running(clients, job, first.ref.task, 1, backup=True)  # nothing waits on it
    assert not commit(clients, counter, backup, TaskStatus.SUCCEEDED, ["copy"])  # had it ended first
    row = tasks.get_task(clients.tasks, first.ref.partition, first.ref.task)
    assert json.loads(row.outputs) == ["first"] and row.worker == first.worker
    assert [a.outcome for a in attempt_rows(clients, job, first.ref.task)] == ["SUCCEEDED", "DISCARDED"]
    assert index_rows(clients, job, first.ref.task) == []


def test_a_backup_whose_attempt_ends_before_anyone_takes_it_is_recorded_as_not_run(clients: Clients) -> None:
    job = planned_job(clients)
    first, *_ = _claim_all(clients, job)
    assert sweep.sweep(clients)["backups"] == 1
    ref = _backup_message(clients)
    with pytest.raises(transitions.NotHere):  # its attempt's own worker hands it back
        transitions.claim_backup(clients, ref, first.worker, in_an_hour)
    assert commit(clients, rollups.RollupWriter("test"), first, TaskStatus.SUCCEEDED, ["first"])
    assert transitions.claim_backup(clients, ref, "spare", in_an_hour) is None  # no longer wanted
    primary, copy = attempt_rows(clients, job, first.ref.task)
    assert primary.outcome == "SUCCEEDED" and copy.outcome == transitions.NOT_RUN and copy.ended_at is not None
    assert index_rows(clients, job, first.ref.task) == []


def test_a_backup_that_committed_is_not_given_up_by_a_monitor_that_read_it_running(
        clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    job, (first, *_), backup = _backed_up(clients)
    (entry,) = [e for e in attempts.overdue(clients, parts(clients, job), tasks.now() + timedelta(days=1)) if e.backup]
    etag = attempts.running_etag(clients, job, first.ref.task, 1, backup=True)  # the monitor reads it RUNNING ...
    assert etag is not None
    assert commit(clients, rollups.RollupWriter("test"), backup, TaskStatus.SUCCEEDED, ["copy"])
    monkeypatch.setattr(attempts, "running_etag", lambda *_, **__: etag)  # ... every time, then gives it up
    ended = ends.end(clients, rollups.RollupWriter("monitor"), entry, Outcome.of(Ending.SILENT))
    assert ended.move.act is Act.LAPSE  # made, fenced on the row it read: refused, the entry alone removed
    copy = attempt_rows(clients, job, first.ref.task)[1]
    assert (copy.outcome, copy.failure_class, copy.revoked_by) == ("SUCCEEDED", "", "")
    assert index_rows(clients, job, first.ref.task) == [first.index]  # the attempt's, until its worker discards


def test_a_failed_backup_leaves_the_task_to_its_attempt(clients: Clients) -> None:
    job, (first, *_), backup = _backed_up(clients)
    before = tasks.get_task(clients.tasks, first.ref.partition, first.ref.task)
    dropped = end(clients, rollups.RollupWriter("spare"), backup, Outcome.failed(FailureClass.USER_CODE, "it crashed"))
    assert dropped.move.act is Act.ABANDON and dropped.status is None
    after = tasks.get_task(clients.tasks, first.ref.partition, first.ref.task)
    assert after.etag == before.etag and after.status is TaskStatus.RUNNING  # the task row untouched
    assert transitions.still_held(clients, first) and not transitions.still_held(clients, backup)
    assert index_rows(clients, job, first.ref.task) == [first.index]
    assert commit(clients, rollups.RollupWriter("test"), first, TaskStatus.SUCCEEDED, ["first"])
    copy = attempt_rows(clients, job, first.ref.task)[1]
    assert (copy.outcome, copy.failure_class) == ("FAILED", FailureClass.USER_CODE.value)


def test_backups_only_at_the_tail_and_within_the_share(settings: Settings) -> None:
    clients = Clients(settings.with_(speculate_share=0.2))  # 8 tasks: one backup at most
    clients.ensure_resources()
    job = planned_job(clients)
    held = _claim_all(clients, job, slow=3, leave=1)
    assert sweep.sweep(clients)["backups"] == 0  # a task still waits for a slot: none is idle
    queue, message = receive_one(clients)
    last = transitions.claim(clients, tasks.TaskRef.decode(message.content), "w-last", in_an_hour)
    assert last is not None
    queue.delete_message(message)
    assert sweep.sweep(clients)["backups"] == 1
    assert sweep.sweep(clients)["backups"] == 0  # the share is spent
    asked = [a for a in attempts.list_attempts(clients.tasks, parts(clients, job)) if a.backup]
    assert [(a.task, a.outcome) for a in asked] == [(held[0].ref.task, transitions.REQUESTED)]
    off = Clients(settings.with_(speculate_share=0.0))
    other = planned_job(off)
    _claim_all(off, other, slow=8)
    assert sweep.sweep(off)["backups"] == 0  # speculation off


def test_an_overdue_attempt_waits_for_its_running_backup_and_is_revoked_once_it_lapses(clients: Clients) -> None:
    job, (first, *_), backup = _backed_up(clients, first_kill=_in(2), backup_kill=_in(3.5))  # revoked in 2 s
    time.sleep(2.2)
    assert sweep.sweep(clients)["revoked"] == 0  # its backup runs: the first to commit ends the task
    assert transitions.still_held(clients, first)
    time.sleep(1.5)
    assert sweep.sweep(clients)["revoked"] == 0  # the backup lapses first (it sorts after its attempt)
    assert not transitions.still_held(clients, backup)  # its worker kills it
    assert sweep.sweep(clients)["revoked"] == 1
    row = tasks.get_task(clients.tasks, first.ref.partition, first.ref.task)
    assert row.status is TaskStatus.QUEUED and row.attempt == 2
    copy = attempt_rows(clients, job, first.ref.task)[1]
    assert (copy.backup, copy.outcome, copy.revoked_by) == (True, "TIMED_OUT", "monitor")


def test_real_workers_a_stragglers_backup_wins_and_the_straggler_is_killed(settings: Settings) -> None:
    # the marked task's first attempt takes 5 s where the others take 0.5 s; killing it would
    # take 20× the mean: only a backup can end it early. Workers of one slot each: the
    # straggler's worker, full, takes no message, so its backup goes straight to another (with
    # two slots it could come to the straggler's worker, be handed back and come again, each
    # pass a second, until the straggler had committed)
    clients = _seeded(settings, "straggler", kill_factor=20.0, speculate_share=0.5)
    with running_control(clients.settings), running_workers(clients.settings, count=3, slots=1):
        job = application.submit(clients, small_request()).job
        wait_for(lambda: jobs.get(clients, job).state.finished, 120, "the job to finish")
    assert jobs.get(clients, job).state == "SUCCEEDED"
    task = marked_task(clients, job)
    assert task.attempt == 1 and json.loads(task.outputs) == [
        names.output_prefix(job, task.task, 1, backup=True) + "summary.json"]
    primary, copy = attempt_rows(clients, job, task.task)
    assert copy.backup and copy.outcome == "SUCCEEDED" and copy.worker != primary.worker
    assert primary.discarded and primary.outcome == transitions.LOST_TO_BACKUP
    assert not alive(int((PIDS / f"{job}-{task.task}-1.pid").read_text()))  # killed with its attempt
    status = jobs.status(clients, job)
    assert status["speculative_attempts"] >= 1 and status["monitor_kills"] == 0
    assert status["counts"]["SUCCEEDED"] == 8


def test_a_slow_workers_attempt_gives_way_to_its_backup_and_is_requeued_if_the_backup_fails(
        clients: Clients) -> None:
    job, (first, *_), backup = _backed_up(clients, first_kill=_in(1))  # revoked in 1 s
    gave = end(clients, rollups.RollupWriter("slow"), first, Outcome.failed(FailureClass.WORKER_SLOW, "found slow"))
    assert gave.move.act is Act.GIVE_WAY and gave.status is None  # the task row and its entry untouched
    assert transitions.still_held(clients, backup)  # the backup keeps the fence
    time.sleep(1.2)
    assert sweep.sweep(clients)["revoked"] == 0
    end(clients, rollups.RollupWriter("spare"), backup, Outcome.failed(FailureClass.USER_CODE, "it crashed there"))
    assert sweep.sweep(clients)["revoked"] == 1  # the task is not left RUNNING with nobody on it
    row = tasks.get_task(clients.tasks, first.ref.partition, first.ref.task)
    assert row.status is TaskStatus.QUEUED and row.attempt == 2
    # past its kill time by then, yet it was given up, not timed out: the next attempt keeps its limit
    assert row.timeouts == 0 and row.last_failure == FailureClass.WORKER_SLOW.value
    gave, copy = attempt_rows(clients, job, first.ref.task)[:2]
    assert (gave.outcome, gave.failure_class, gave.error) == ("FAILED", "worker_slow", "found slow")
    assert copy.backup and copy.outcome == "FAILED"
    assert jobs.status(clients, job)["monitor_kills"] == 0


def _answer_lost_once(monkeypatch: pytest.MonkeyPatch, clients: Clients) -> list[bool]:
    """The next transaction of ``clients`` is applied and its answer lost."""
    real, lost = clients.tasks.submit_transaction, []

    def applied_then_lost(operations: Any, **kwargs: Any) -> Any:
        answer = real(operations, **kwargs)
        if not lost:
            lost.append(True)
            raise ServiceResponseError("connection reset by peer")
        return answer

    monkeypatch.setattr(clients.tasks, "submit_transaction", applied_then_lost)
    return lost


def test_lost_answers_on_the_backup_path_leave_nothing_stuck(settings: Settings,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    clients = Clients(settings.with_(lease_seconds=60))  # the attempts' heartbeats hold
    clients.ensure_resources()
    job = planned_job(clients)
    first, *_ = _claim_all(clients, job)
    monitor = Clients(clients.settings)
    with monkeypatch.context() as patch:
        lost = _answer_lost_once(patch, monitor)
        assert sweep.sweep(monitor)["errors"] == 1 and lost  # the ask applied, its answer lost ...
    assert sweep.sweep(monitor)["backups"] == 0  # ... and not asked again; the attempt goes on alone
    (asked,) = [a for a in attempts.list_attempts(clients.tasks, parts(clients, job)) if a.backup]
    assert asked.outcome == transitions.REQUESTED
    assert _messages(clients) == 0  # its message never sent ...
    later = Clients(settings.with_(lease_seconds=1))  # ... until a lease has passed with nobody taking it
    time.sleep(1.1)
    assert sweep.sweep(later)["backups"] == 0  # the same backup, asked for again: counted once
    ref = _backup_message(clients)
    assert ref == tasks.TaskRef(job, first.ref.task, 1, backup=True)
    assert sweep.sweep(later)["backups"] == 0 and _messages(clients) == 0  # not again within a lease
    worker = Clients(settings.with_(lease_seconds=1))  # the backup's worker, whose heartbeat lapses at once
    with monkeypatch.context() as patch:
        _answer_lost_once(patch, worker)
        with pytest.raises(ServiceResponseError):  # the backup's claim applied, its answer lost
            transitions.claim_backup(worker, ref, "spare", in_an_hour)
    assert transitions.claim_backup(worker, ref, "spare", in_an_hour) is None  # taken once
    # nobody runs it: its heartbeat lapses and the monitor gives it up
    wait_for(lambda: sweep.sweep(monitor)["stale"] and not attempts.is_running(clients, job, first.ref.task, 1,
                                                                              backup=True), 10, "the backup to lapse")
    assert sweep.sweep(monitor)["revoked"] == 0 and transitions.still_held(clients, first)
    assert commit(clients, rollups.RollupWriter("test"), first, TaskStatus.SUCCEEDED, ["first"])
    assert index_rows(clients, job, first.ref.task) == []


def _seeded(settings: Settings, stage: str, **changes: object) -> Clients:
    """A deployment whose tile tasks run ``stage``, with a trusted history of 0.8 s per task."""
    clients = Clients(with_stage(settings, stage, kill_floor_s=0.5, min_samples=3, kill_grace_s=1.0,
                                 lease_seconds=3, **changes))
    clients.ensure_resources()
    work = expand(small_request(), 100)[0].work()  # the history is per megapixel
    runtimes.merge(clients.runtimes, stage, "MOD10A2", runtimes.Runtime(50, 0.8 / work, 50 * (0.1 / work) ** 2))
    return clients


def test_real_workers_an_attempt_past_its_kill_time_is_left_to_its_running_backup(settings: Settings) -> None:
    # killed at 6 × 0.8 s, the marked task's first attempt (12 s) would be retried; its
    # backup, asked for at the job's tail (about 2 s; started by 4.8 s, on a loaded machine
    # too), runs until 5.3 s after the attempt began: it is running at the kill time, and must
    # be let win (workers of one slot, so that the backup cannot come to its attempt's worker)
    clients = _seeded(settings, "slow_copy", speculate_share=0.5, kill_factor=6.0)
    with running_control(clients.settings), running_workers(clients.settings, count=3, slots=1):
        job = application.submit(clients, small_request()).job
        wait_for(lambda: jobs.get(clients, job).state.finished, 120, "the job to finish")
    task = marked_task(clients, job)
    assert task.attempt == 1 and task.timeouts == 0
    primary, copy = attempt_rows(clients, job, task.task)
    assert copy.backup and copy.outcome == "SUCCEEDED" and primary.outcome == transitions.LOST_TO_BACKUP
    assert jobs.status(clients, job)["monitor_kills"] == 0


def test_a_backup_that_reaches_the_worker_of_its_attempt_goes_back_and_is_not_run_there(
        settings: Settings) -> None:
    clients = _seeded(settings, "straggler", kill_factor=20.0, speculate_share=0.5)
    with running_control(clients.settings), running_workers(clients.settings, count=1, slots=2):
        job = application.submit(clients, small_request()).job
        wait_for(lambda: jobs.get(clients, job).state.finished, 120, "the job to finish")
        task = marked_task(clients, job)
        # its message, handed back, comes to the worker once more: the backup was never run
        wait_for(lambda: attempt_rows(clients, job, task.task)[1].outcome != transitions.REQUESTED, 10,
                 "the backup's message to come back")
    primary, copy = attempt_rows(clients, job, task.task)
    assert primary.outcome == "SUCCEEDED" and copy.backup and copy.outcome == transitions.NOT_RUN
    assert copy.started_at is None and copy.worker == ""
    assert jobs.status(clients, job)["speculative_attempts"] >= 1
