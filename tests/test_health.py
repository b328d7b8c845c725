"""Worker health against Azurite: the monitor marks slow the worker whose attempts run far
past their history while the others' do not; a real worker process found slow drains (its
attempts finish elsewhere), exits to be replaced, and the job's status shows it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from pipeline.lifecycle import attempts, health, jobs, runtimes, sweep, tasks, transitions
from pipeline.lifecycle.status import TaskStatus
from pipeline.reduction import sandbox
from pipeline.requests import application
from pipeline.requests.expansion import expand
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from tests.conftest import in_an_hour, parts, running_control, running_workers, small_request, wait_for, with_stage
from tests.test_speculation import _backed_up, _backup_message
from worker.pace import Pace
from worker.runner import Worker

# it times workers, attempts or links: `make test` runs it alone, not beside other tests
pytestmark = pytest.mark.alone


def reported(clients: Clients, ratios: dict[str, list[float]], running: dict[str, list[float]] | None = None,
             slots: int = 2) -> dict[str, str]:
    """Each worker's report: its ended attempts' ratios (and its running ones')."""
    return {worker: health.report(clients, worker, values, (running or {}).get(worker, []), slots, len(values))
            for worker, values in ratios.items()}


def test_the_worker_running_far_past_its_history_is_marked_slow(clients: Clients) -> None:
    healthy = {f"w{i}": [1.0, 0.9, 1.2, 1.1] for i in range(5)}
    # its first attempts were fine; the two it runs now have run past 3× already
    reported(clients, healthy | {"vm": [1.0, 0.8, 1.1]}, {"vm": [1.5, 1.6], "w0": [1.5, 0.2]})
    assert health.find_slow(clients, 2.0) == []
    reported(clients, healthy | {"vm": [1.0, 0.8, 1.1]}, {"vm": [3.2, 3.6]})
    assert health.find_slow(clients, 2.0) == ["vm"]
    assert reported(clients, healthy | {"vm": [1.0, 0.8, 1.1, 3.8]}, {"vm": [4.6]}) == {
        **{w: health.HEALTHY for w in healthy}, "vm": health.SLOW}
    assert health.find_slow(clients, 2.0) == []  # marked once


def test_a_slow_worker_stays_slow_while_its_new_attempts_are_young() -> None:
    assert health.recent_ratio([1.0, 5.6, 5.7], [0.1, 0.2], 2) == 5.6
    assert health.recent_ratio([1.0, 1.1], [3.0, 3.4], 2) == 3.0
    assert health.recent_ratio([1.0, 1.1, 0.9, 1.0], [6.0, 5.0, 0.3, 0.2], 4) == 0.9  # two slow tasks, not a machine
    assert health.recent_ratio([1.0, 6.0, 1.1, 5.0], [], 4) == 1.0  # nor two of its last four (the median: 3.05)
    assert health.recent_ratio([1.0], [0.5], 2) is None


def test_nobody_is_marked_when_everyone_is_slow_or_the_rule_is_off(clients: Clients) -> None:
    reported(clients, {f"w{i}": [2.5, 2.8] for i in range(3)} | {"vm": [4.0, 4.5]})  # not 2 × 2.65
    assert health.find_slow(clients, 2.0) == []  # the others are slow too: storage, not a VM
    reported(clients, {f"w{i}": [1.0, 1.0] for i in range(3)})
    assert health.find_slow(clients, 0.0) == []  # off
    assert health.find_slow(clients, 2.0) == ["vm"]


def test_at_most_a_third_of_the_workers_are_slow_at_once(clients: Clients) -> None:
    reported(clients, {"a": [1.0, 1.0], "b": [1.0, 1.1], "c": [0.9, 1.0], "d": [5.0, 6.0], "e": [4.0, 4.5],
                       "f": [3.0, 3.0]})
    assert health.find_slow(clients, 2.0) == ["d", "e"]  # the slowest first, two of six
    assert health.find_slow(clients, 2.0) == []  # f stays: two of six are already slow


def test_one_of_two_workers_may_be_slow(clients: Clients) -> None:
    reported(clients, {"w0": [1.0, 1.0], "vm": [4.0, 4.0]})
    assert health.find_slow(clients, 2.0) == ["vm"]


def test_workers_that_stopped_are_not_the_fleet_a_new_worker_is_compared_with(settings: Settings) -> None:
    """A worker that stops (idle, or told to) says it left: heard from within the last 30 s,
    it stood for the machines a worker started after it was compared with, and a new worker
    whose first attempts ran cold was drained for being slower than workers that were gone."""
    clients = Clients(settings)
    clients.ensure_resources()
    with running_workers(settings, count=2) as pool:
        gone = [worker.id for worker in pool.workers]
        for worker in gone:  # what each said of its attempts while it ran
            health.report(clients, worker, [1.0, 0.9, 1.1], [], 2, 3)
    rows = {row["RowKey"]: row for row in clients.workers.query_entities(
        "PartitionKey eq @p", parameters={"p": health.PARTITION})}
    assert [rows[worker].get("Left") for worker in gone] == [health.STOPPED] * 2
    reported(clients, {"new": [4.0, 4.2, 3.9]})  # cold caches: its first attempts run 4× their history
    assert health.find_slow(clients, 2.0) == [], "compared with workers that had stopped"


def test_a_worker_whose_machine_barely_runs_it_is_marked_before_its_attempts_show_it(clients: Clients) -> None:
    young = {f"w{i}": [1.0, 1.1] for i in range(3)} | {"vm": [1.0, 0.9]}  # no attempt slow yet
    for worker, ratios in young.items():
        health.report(clients, worker, ratios, [0.3, 0.4], 2, 2, stall=6.0 if worker == "vm" else 1.1)
    assert health.find_slow(clients, 2.0) == ["vm"]
    for worker, ratios in young.items():  # every worker stalls (the machine overloaded): nobody
        health.report(clients, f"{worker}-b", ratios, [0.3, 0.4], 2, 2, stall=4.0)
    for worker in young:
        health.left(clients, worker, health.REPLACED)
    assert health.find_slow(clients, 2.0) == []
    for worker, ratios in young.items():  # a stall below the floor counts for nothing
        health.report(clients, f"{worker}-c", ratios, [0.3, 0.4], 2, 2, stall=2.5 if worker == "vm" else 1.0)
        health.left(clients, f"{worker}-b", health.REPLACED)
    assert health.find_slow(clients, 2.0) == []


PROBE = """
import sys, threading, time
from worker.pace import Pace
pace, stop = Pace(2.0), threading.Event()
threading.Thread(target=pace.probe, args=(stop,), daemon=True).start()
print("ready", flush=True)
time.sleep(3.0)
print(pace.stall(), pace.asked(), flush=True)
"""


def probed_stall(run_share: float | None) -> tuple[float, bool]:
    """The stall the probe of a process finds, the process let run ``run_share`` of every
    half second (SIGSTOP/SIGCONT from outside, as a VM's slowness is: the process cannot
    tell), or undisturbed (None); and whether it asked for a report at once."""
    probe = subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[1])
    assert probe.stdout is not None and probe.stdout.readline().strip() == "ready"
    try:
        while run_share is not None and probe.poll() is None:
            os.kill(probe.pid, signal.SIGSTOP)
            time.sleep(0.5 * (1 - run_share))
            os.kill(probe.pid, signal.SIGCONT)
            time.sleep(0.5 * run_share)
    finally:
        if probe.poll() is None:
            os.kill(probe.pid, signal.SIGCONT)
    stall, asked = probe.stdout.readline().split()
    probe.wait(10)
    return float(stall), asked == "True"


def test_the_stall_probe_sees_a_machine_that_runs_the_worker_a_tenth_of_the_time() -> None:
    stall, asked = probed_stall(None)
    assert stall < 2.0 and not asked
    stall, asked = probed_stall(0.1)
    assert stall >= health.STALL_FLOOR and asked  # the monitor hears of it at once


def test_the_worker_table_shows_the_stall_and_what_a_slow_worker_was_found_on(clients: Clients) -> None:
    for worker, stall in (("w0", 1.0), ("w1", 1.1), ("vm", 6.7)):
        health.report(clients, worker, [1.0, 1.1], [], 2, 2, stall)
    assert health.find_slow(clients, 2.0) == ["vm"]
    health.report(clients, "vm", [1.0, 1.1], [], 2, 2, 1.0)  # its last report, its attempts taken
    health.report(clients, "w1", [1.0, 1.1], [], 2, 2, 3.5)  # stalled, not enough to be slow
    table = {w["worker"]: w for w in health.worker_table(clients, {w: {"running": 1} for w in ("w0", "w1", "vm")})}
    assert (table["vm"]["recent_ratio"], table["vm"]["state"]) == (6.7, health.SLOW)
    assert (table["w1"]["recent_ratio"], table["w0"]["recent_ratio"]) == (3.5, 1.0)


def test_the_worker_table_shows_how_each_worker_confines_programs(clients: Clients, settings: Settings) -> None:
    """A worker writes its sandbox's mode when it starts, before any report: one that cannot
    confine a program says so (its reductions are refused), one not heard from says nothing."""
    worker = Worker(settings, slots=1, worker_id="w0")
    worker.say_sandbox()
    health.sandbox(clients, "w1", sandbox.Mode(False, 0, True).describe())
    table = {w["worker"]: w for w in health.worker_table(clients, {w: {"running": 1} for w in ("w0", "w1", "w2")})}
    assert table["w0"]["sandbox"] == sandbox.mode(settings.sandbox == "auto").describe()
    refused = table["w1"]["sandbox"]
    assert refused.startswith("none: this kernel gives no Landlock") and refused.endswith("reductions refused")
    assert table["w2"]["sandbox"] is None
    assert health.find_slow(clients, 2.0) == [], "a row with its sandbox alone is no worker's figures"


def test_a_report_asked_for_at_once_is_made_at_once_and_then_as_usual(clients: Clients) -> None:
    pace = Pace(2.0)
    assert pace.report(clients, "w0", 2) == health.HEALTHY and not pace.asked()
    assert pace.report(clients, "w0", 2) is None  # not yet time
    pace.report_soon()
    assert pace.asked() and pace.report(clients, "w0", 2) == health.HEALTHY
    assert not pace.asked() and pace.report(clients, "w0", 2) is None


def test_a_worker_not_heard_from_lately_is_not_compared(clients: Clients) -> None:
    reported(clients, {"w0": [1.0, 1.0], "vm": [4.0, 4.0]})
    later = tasks.now() + health.HEARD_WITHIN + timedelta(seconds=1)
    assert health.find_slow(clients, 2.0, at=later) == []
    health.left(clients, "w0", health.REPLACED)  # gone: not an "other" any more
    assert health.find_slow(clients, 2.0) == []
    assert sweep.sweep(clients)["slow_workers"] == 0


def test_the_monitor_takes_a_slow_workers_attempts_from_it_at_once(clients: Clients) -> None:
    # 8 tasks, each claimed by a worker of its own (w0 … w7); w0's attempt has a backup on "spare"
    job, held, backup = _backed_up(clients)
    stalled = {"w0", "w1"}  # machines that barely run their workers
    for i in range(6):
        worker = f"w{i}"
        health.report(clients, worker, [1.0, 1.1], [0.4], 2, 3, 6.7 if worker in stalled else 1.0)
    done = sweep.sweep(clients)
    assert (done["slow_workers"], done["revoked"], done["errors"]) == (2, 1, 0)
    # w1's attempt: taken from it at once, a worker_slow failure (no kill, no timeout), requeued
    taken = tasks.get_task(clients.tasks, held[1].ref.partition, held[1].ref.task)
    assert (taken.status, taken.attempt, taken.last_failure, taken.timeouts) == (TaskStatus.QUEUED, 2,
                                                                                 "worker_slow", 0)
    (row,) = [a for a in attempts.list_attempts(clients.tasks, parts(clients, job))
              if (a.task, a.attempt) == (taken.task, 1)]
    assert (row.outcome, row.failure_class, row.revoked_by) == ("FAILED", "worker_slow", "monitor")
    assert row.ended_at is not None and row.worker == "w1"
    # w0's attempt is left to its worker, which gives way to the backup; the healthy ones run on
    assert tasks.get_task(clients.tasks, held[0].ref.partition, held[0].ref.task).worker == "w0"
    assert all(tasks.get_task(clients.tasks, h.ref.partition, h.ref.task).status is TaskStatus.RUNNING
               for h in held[2:])
    status = jobs.status(clients, job)
    assert status["monitor_kills"] == 0 and status["failures"] == {"worker_slow": 1}
    # the next attempt's message was sent: a healthy worker claims it
    ref = _backup_message(clients)
    assert ref == tasks.TaskRef(job, taken.task, 2)
    assert transitions.claim(clients, ref, "w9", in_an_hour) is not None
    assert backup.ref.task == held[0].ref.task
    assert sweep.sweep(clients)["revoked"] == 0  # taken once


def test_a_slow_worker_drains_exits_to_be_replaced_and_its_tasks_finish_elsewhere(settings: Settings,
                                                                                  tmp_path: Path) -> None:
    # the kill rule out of the way: health alone acts
    settings = with_stage(settings, "slow_machine", slow_ratio=3.0, min_samples=3, monitor_interval_s=0.5,
                          kill_factor=100.0)
    clients = Clients(settings)
    clients.ensure_resources()
    request = small_request(end="2022-03-05")  # 2 tiles × 8 periods
    work = expand(request, 100)[0].work()
    runtimes.merge(clients.runtimes, "slow_machine", "MOD10A2", runtimes.Runtime(20, 1.0 / work, 0.0))  # 1 s a task
    log = tmp_path / "slow-worker.log"
    with open(log, "wb") as out:
        slow = subprocess.Popen([sys.executable, "-m", "bagpipe.cli", "worker", "--slots", "2"],
                                env={**os.environ, **settings.to_env(), "BAGPIPE_TEST_SLOW_MACHINE": "1"},
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "ready" in log.read_text(errors="replace"), 120, "the slow worker to start")
        with running_control(settings):
            job = application.submit(clients, request).job
            wait_for(lambda: any(f"-{slow.pid}-" in row.worker
                                 for row in tasks.list_tasks(clients.tasks, parts(clients, job))), 60,
             "the slow worker to claim")
            with running_workers(settings, slots=2):
                assert slow.wait(120) == health.REPLACE_EXIT, log.read_text(errors="replace")[-2000:]
                assert not re.search(r"\w+Warning: ", log.read_text(errors="replace"))  # a Python warning
                wait_for(lambda: jobs.get(clients, job).state.finished, 120, "the job to finish")
    finally:
        if slow.poll() is None:
            slow.kill()
            slow.wait()
    status = jobs.status(clients, job)
    assert status["state"] == "SUCCEEDED" and status["counts"]["SUCCEEDED"] == 16
    by_worker = {w["worker"]: w for w in status["workers"]}
    (vm,) = [w for w in by_worker if f"-{slow.pid}-" in w]
    assert by_worker[vm]["state"] == health.REPLACED and by_worker[vm]["recent_ratio"] >= 3.0
    others = [w for name, w in by_worker.items() if name != vm]
    # the others stopped when their test's workers did: gone from the fleet the monitor compares
    assert others and all(w["state"] == health.STOPPED and w["recent_ratio"] < by_worker[vm]["recent_ratio"] / 2
                          for w in others)
    assert status["failures"].get("worker_slow", 0) >= 1 and status["monitor_kills"] == 0
    ended = attempts.list_attempts(clients.tasks, parts(clients, job))
    given_up = {a.task for a in ended if a.failure_class == "worker_slow"}
    assert given_up and all(f"-{slow.pid}-" in a.worker for a in ended
                            if a.task in given_up and a.failure_class)
    for task in given_up:  # each finished on a healthy worker, its output published
        row = tasks.get_task(clients.tasks, job, task)
        assert row.status == "SUCCEEDED" and f"-{slow.pid}-" not in row.worker and json.loads(row.outputs)
    started = time.monotonic()
    assert sweep.sweep(clients)["slow_workers"] == 0 and time.monotonic() - started < 30
