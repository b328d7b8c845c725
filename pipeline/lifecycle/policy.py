"""The retry and kill policy, in one place the worker and the monitor both read: how many
attempts a task may have, how long its retry waits, and how long an attempt may run.

The kill rule is the ModisAzure task manager's: past ``factor`` × the mean runtime of that
much work (``runtimes.work_of``), with a floor, a cold-start ceiling until the history is
trusted, and per-stage limits (``BAGPIPE_STAGE_LIMITS``). Each time an attempt of a task is
revoked for time, the task's later attempts may run ``backoff`` times longer: a straggler's
retry on a healthy worker finishes well inside its limit anyway, and a task that is slow
everywhere (storage slowed down, the machine overloaded) still ends instead of being killed
at the same limit until its budget is spent.

The retry rule: a failure that may be the platform's (``FailureClass.transient``: a lost
worker, a kill, a storage hiccup) gets the larger budget, one that may be the task's own the
smaller, and none at all when the same input failed the same way twice. A retry waits
``RETRY_BACKOFF_S`` (none when its worker was found slow: it goes to a healthy one).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pipeline.failures import FailureClass
from pipeline.lifecycle import runtimes
from pipeline.settings import Settings, env_name

RETRY_BACKOFF_S = (2, 10, 30)  # visibility delay before attempt 2, 3, 4+


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


def speculate_after(settings: Settings, stage: str, history: runtimes.Runtime, work: float = 1.0) -> float | None:
    """Seconds after which an attempt of ``work`` units may get a backup copy: past the
    speculation quantile of its history (mean + z × stdev, z that quantile of a normal law),
    never under the kill floor. None while the history is not trusted or speculation is off:
    a backup is started only for an attempt known to be slow."""
    limits = limits_for(settings, stage)
    if settings.speculate_share <= 0 or history.count < limits.min_samples:
        return None
    z = statistics.NormalDist().inv_cdf(min(settings.speculate_quantile, 0.9999))
    return max(limits.floor_s, (history.mean + z * history.stdev) * work)


@dataclass(frozen=True)
class Retry:
    """What a failed attempt's task gets: ``budget`` (attempts it may have had and still be
    retried) and the seconds its next attempt waits."""

    budget: int
    delay_s: int


def retry(settings: Settings, stage: str, failure: FailureClass, attempt: int, last_failure: str) -> Retry:
    """The retry of attempt ``attempt`` of a task of ``stage`` that failed as ``failure``
    (``last_failure``: how its previous attempt failed, if it did)."""
    budget = limits_for(settings, stage).budget(failure)
    if not failure.transient and last_failure == failure.value:
        budget = attempt  # the same input failed the same way twice: give up
    delay = 0 if failure is FailureClass.WORKER_SLOW else RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S)) - 1]
    return Retry(budget, delay)


def kill_time(settings: Settings, stage: str, history: runtimes.Runtime, timeouts: int,
              started: datetime, work: float = 1.0) -> datetime:
    """When an attempt of ``work`` units of a task of ``stage`` with this runtime history,
    started at ``started``, is to be revoked (``timeouts``: earlier revocations of the task
    for time)."""
    return started + timedelta(seconds=kill_after(limits_for(settings, stage), history, timeouts, work))


def speculate_time(settings: Settings, stage: str, history: runtimes.Runtime, started: datetime,
                   work: float = 1.0) -> datetime | None:
    """When an attempt started at ``started`` may get a backup (None: never)."""
    after = speculate_after(settings, stage, history, work)
    return None if after is None else started + timedelta(seconds=after)
