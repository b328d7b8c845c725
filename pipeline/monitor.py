"""The monitor: revoke attempts that run past their kill threshold or stop heartbeating,
and requeue their tasks (the ModisAzure task manager's 4× rule, with a floor, a cold-start
ceiling and per-stage limits). Each time an attempt of a task is revoked for time, the
task's later attempts may run ``backoff`` times longer: a straggler's retry on a healthy
worker finishes well inside its limit anyway, and a task that is slow everywhere (storage
slowed down, the machine overloaded) still ends instead of being killed at the same limit
until its budget is spent.

Running attempts are indexed by deadline in their job's partition (``pipeline.attempts``),
so one pass is a key-range query for "before now" per active job: no scan. A worker's
claim writes its attempt's entry, every heartbeat moves it, and its commit removes it;
the deadline is the earlier of the kill time and the heartbeat's expiry.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import ResourceNotFoundError

from pipeline import attempts, jobs, runtimes, transitions
from pipeline.clients import Clients
from pipeline.completion import all_terminal
from pipeline.failures import FailureClass
from pipeline.settings import Settings, env_name
from pipeline.status import TaskStatus
from pipeline.tasks import TaskRef, TerminalCounter, now

log = logging.getLogger(__name__)
_counter = TerminalCounter(f"monitor-{uuid.uuid4().hex[:12]}")


@dataclass(frozen=True)
class StageLimits:
    factor: float  # revoke past factor × mean runtime ...
    sigmas: float  # ... or past mean + sigmas × stdev if that is earlier (0: not used) ...
    floor_s: float  # ... but never before this
    ceiling_s: float  # the limit until min_samples runs are known
    min_samples: int
    max_attempts: int  # the retry budget when a failure may be the task's own
    max_transient_attempts: int  # ... and while it is the platform's (a lost worker, a kill)
    backoff: float  # after n revocations for time, an attempt may run backoff^n × the limit

    def budget(self, failure: FailureClass) -> int:
        """Attempts a task may have had when it fails this way and still be retried."""
        return self.max_transient_attempts if failure.transient else self.max_attempts


def limits_for(settings: Settings, stage: str) -> StageLimits:
    """The stage's limits: the settings' defaults with BAGPIPE_STAGE_LIMITS over them."""
    overrides: dict[str, Any] = json.loads(settings.stage_limits).get(stage, {}) if settings.stage_limits else {}
    unknown = set(overrides) - {"factor", "sigmas", "floor", "ceiling", "min_samples", "max_attempts",
                                "max_transient_attempts", "backoff"}
    if unknown:
        raise ValueError(f"{env_name('stage_limits')}: unknown limit(s) {sorted(unknown)} for {stage}")
    return StageLimits(
        factor=float(overrides.get("factor", settings.kill_factor)),
        sigmas=float(overrides.get("sigmas", settings.kill_sigmas)),
        floor_s=float(overrides.get("floor", settings.kill_floor_s)),
        ceiling_s=float(overrides.get("ceiling", settings.kill_ceiling_s)),
        min_samples=int(overrides.get("min_samples", settings.min_samples)),
        max_attempts=int(overrides.get("max_attempts", settings.max_attempts)),
        max_transient_attempts=int(overrides.get("max_transient_attempts", settings.max_transient_attempts)),
        backoff=float(overrides.get("backoff", settings.kill_backoff)),
    )


def kill_after(limits: StageLimits, history: runtimes.Runtime, timeouts: int = 0, work: float = 1.0) -> float:
    """Seconds an attempt of ``work`` units (``runtimes.work_of``) may run: factor × the
    mean time of that much work once the history is trusted (or the high quantile mean +
    sigmas × stdev, if asked for and earlier), else the cold-start ceiling; never under the
    floor. After ``timeouts`` earlier revocations for time, backoff^timeouts times that, up
    to the ceiling."""
    if history.count < limits.min_samples:
        return max(limits.floor_s, limits.ceiling_s)
    limit = limits.factor * history.mean
    if limits.sigmas > 0:
        limit = min(limit, history.mean + limits.sigmas * history.stdev)
    limit = max(limits.floor_s, limit * work)
    return max(limit, min(limit * limits.backoff**timeouts, limits.ceiling_s))


@dataclass
class SweepReport:
    revoked: list[dict[str, Any]] = field(default_factory=list)
    stale: int = 0


def revoke_overdue(clients: Clients, job: str, report: SweepReport) -> None:
    """Revoke every attempt of ``job`` whose deadline has passed (one key-range query)."""
    at = now()
    for row in attempts.overdue(clients, job, at):
        ref = TaskRef(job, row["Task"], int(row["Attempt"]))
        why = FailureClass.EXECUTION_TIMEOUT if at >= row["KillAt"] else FailureClass.HEARTBEAT_LOST
        try:
            task = clients.tasks.get_entity(ref.job, ref.task)
        except ResourceNotFoundError:  # its job was deleted
            attempts.unindex(clients, job, row["RowKey"])
            report.stale += 1
            continue
        budget = limits_for(clients.settings, task["Stage"]).budget(why)
        outcome = transitions.revoke(clients, _counter, task, ref, row["RowKey"], why, budget, row.get("Worker", ""))
        if outcome is None:
            report.stale += 1
            continue
        report.revoked.append({"job": ref.job, "task": ref.task, "attempt": ref.attempt,
                               "why": why.value, "then": outcome.value})
        log.warning("revoked %s (%s): task now %s", ref, why.value, outcome.value)
        if outcome is TaskStatus.DEAD and all_terminal(clients, jobs.get(clients, ref.job)):
            jobs.announce_done(clients, ref.job)


def kill_time(settings: Settings, stage: str, history: runtimes.Runtime, timeouts: int,
              started: datetime, work: float = 1.0) -> datetime:
    """When an attempt of ``work`` units of a task of ``stage`` with this runtime history,
    started at ``started``, is to be revoked (``timeouts``: earlier revocations of the task
    for time)."""
    return started + timedelta(seconds=kill_after(limits_for(settings, stage), history, timeouts, work))
