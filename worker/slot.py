"""A worker's slot: one attempt at a time, in a stage process of its own kept warm from
task to task, its moves counted in a rollup row of its own (``pipeline.lifecycle.rollups``:
one writer per row, so that concurrent ends never contend on a counter).

The slot runs an attempt's stage and watches it: the stage is killed when the attempt is
revoked, once it runs past its kill time (unless a backup of it runs: then the monitor
decides), as soon as its pace says it will run far past (``worker.pace.bound_to_overrun``),
or when its worker is found slow."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from pipeline.failures import FailureClass
from pipeline.lifecycle import attempts, rollups, tasks
from pipeline.lifecycle.policy import Ending, Outcome
from pipeline.lifecycle.status import TaskStatus
from pipeline.lifecycle.transitions import Claim
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from worker import child
from worker.child import StageProcess
from worker.lease import Lease
from worker.pace import bound_to_overrun

PAST_KILL_TIME = "ran past its kill time"  # the error of an attempt its own worker revoked
BOUND_PAST_KILL_TIME = "bound to run far past its kill time at its pace"  # ... revoked sooner
log = logging.getLogger(__name__)


@dataclass
class Slot:
    """What one of a worker's slots keeps from task to task: its rollup writer and its warm
    stage process."""

    writer: rollups.RollupWriter
    process: StageProcess | None = None

    def stage_process(self, settings: Settings) -> StageProcess:
        """The slot's stage process, a new one if the last was killed, failed or is spent."""
        if self.process is None or not self.process.usable():
            self.close()
            self.process = StageProcess(settings)
        return self.process

    def close(self) -> None:
        if self.process is not None:
            self.process.close()
            self.process = None

    def run(self, clients: Clients, held: Claim, lease: Lease, draining: threading.Event,
            worker: str) -> Outcome:
        """Run the attempt ``held`` (of ``worker``, under ``lease``) in the slot's stage
        process (its own process group), and watch it until it ends or is killed: how it
        ended."""
        settings = clients.settings
        context = {
            "job": held.ref.job, "task": held.ref.task, "attempt": held.ref.attempt, "params": held.params,
            "backup": held.ref.backup, "part": held.ref.partition,
            "output_prefix": names.output_prefix(held.ref.job, held.ref.task, held.ref.attempt, held.ref.backup),
        }
        process = self.stage_process(settings)
        process.start(held.stage, context)
        allowed = (held.kill_at - held.started).total_seconds()
        backed_up = False  # past its kill time with a backup running: left to the monitor
        while True:
            ended = process.poll(0.2)
            if ended is not None:
                return _outcome(ended)
            if lease.revoked.is_set():
                process.kill(settings.kill_grace_s)
                return Outcome.of(Ending.REVOKED)
            now = tasks.now()
            if not backed_up and (now >= held.kill_at or bound_to_overrun(
                    (now - held.started).total_seconds(), allowed, process.projected_s())):
                runs = _backup_runs(clients, held)
                if runs is False:
                    process.kill(settings.kill_grace_s)
                    return Outcome.overran(PAST_KILL_TIME if now >= held.kill_at else BOUND_PAST_KILL_TIME)
                backed_up = runs is True
            if draining.is_set():  # found slow: a healthy worker runs it sooner
                process.kill(settings.kill_grace_s)
                return Outcome.failed(FailureClass.WORKER_SLOW, f"worker {worker} found slow: given up")


def _outcome(ended: child.Outcome) -> Outcome:
    """How the attempt ended, from how its stage did."""
    if ended.outputs is None:
        return Outcome.failed(ended.failure or FailureClass.UNKNOWN, ended.error)
    status = TaskStatus.NO_DATA if ended.no_data else TaskStatus.CACHED if ended.cached else TaskStatus.SUCCEEDED
    return Outcome.committed(status, ended.outputs)


def _backup_runs(clients: Clients, held: Claim) -> bool | None:
    """Whether a backup of the attempt runs (None if that could not be read)."""
    if held.ref.backup:
        return False
    try:
        return attempts.is_running(clients, held.ref.partition, held.ref.task, held.ref.attempt, backup=True)
    except Exception as exc:  # storage unreachable: the next look, or the monitor
        log.info("backup of %s not read: %s", held.ref, exc)
        return None
