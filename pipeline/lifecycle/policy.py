"""The retry and kill policy, with no storage: how long an attempt may run, when a backup
copy of it would help, and — :func:`decide` — what its end makes of its task, whoever ends
it (``pipeline.lifecycle.ends`` reads the facts, asks, and makes the move).

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
``RETRY_BACKOFF_S`` (none when its worker was found slow: it goes to a healthy one, nor
when it was revoked for time). A backup copy's failure drops the copy only; an attempt whose
copy runs is left to it (the first of the two to commit ends the task), or given up to it by
a worker found slow or stopping it at its kill time.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pipeline.failures import FailureClass
from pipeline.lifecycle import runtimes
from pipeline.lifecycle.status import TaskStatus, after_failure
from pipeline.settings import Settings, env_name

RETRY_BACKOFF_S = (2, 10, 30)  # visibility delay before attempt 2, 3, 4+
# the most characters of output names a task row holds (a string property is 64 KiB of UTF-16)
OUTPUTS_CHARS = 30_000


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


# --- an attempt's end ----------------------------------------------------------------------
class Ending(StrEnum):
    """How an attempt came to its end, as the one who ends it saw it."""

    COMMITTED = "committed"  # its worker: the stage made its outputs
    FAILED = "failed"  # its worker: the stage failed
    OVERRAN = "overran"  # its worker: stopped at its kill time, or sooner, its pace bound to pass it far
    REVOKED = "revoked"  # its worker: its fence was gone (revoked, cancelled, beaten by its copy)
    OVERDUE = "overdue"  # the monitor: past its kill time
    SILENT = "silent"  # the monitor: its heartbeat lapsed
    SLOW = "slow"  # the monitor: its worker was found slow

    @property
    def monitors(self) -> bool:
        """Whether the monitor ends it this way (else its own worker)."""
        return self in (Ending.OVERDUE, Ending.SILENT, Ending.SLOW)


@dataclass(frozen=True)
class Outcome:
    """What happened to an attempt: how it ended, and (committed) the status and outputs its
    stage gave, or (failed, overran) its failure and error."""

    ending: Ending
    status: TaskStatus = TaskStatus.SUCCEEDED  # committed: SUCCEEDED, CACHED or NO_DATA
    outputs: tuple[str, ...] = ()
    failure: FailureClass = FailureClass.UNKNOWN
    error: str = ""

    @classmethod
    def committed(cls, status: TaskStatus, outputs: list[str]) -> Outcome:
        return cls(Ending.COMMITTED, status, tuple(outputs))

    @classmethod
    def failed(cls, failure: FailureClass, error: str) -> Outcome:
        return cls(Ending.FAILED, failure=failure, error=error)

    @classmethod
    def overran(cls, error: str) -> Outcome:
        return cls(Ending.OVERRAN, failure=FailureClass.EXECUTION_TIMEOUT, error=error)

    @classmethod
    def of(cls, ending: Ending) -> Outcome:
        """An ending that says nothing more: revoked, overdue, silent, slow."""
        failure = {Ending.OVERDUE: FailureClass.EXECUTION_TIMEOUT, Ending.SILENT: FailureClass.HEARTBEAT_LOST,
                   Ending.SLOW: FailureClass.WORKER_SLOW}.get(ending, FailureClass.UNKNOWN)
        return cls(ending, failure=failure)


@dataclass(frozen=True)
class Facts:
    """What storage says of the attempt when it ends."""

    attempt: int  # its number: the attempts its task has had
    backup: bool = False  # it is a backup copy of its attempt
    held: bool = True  # its row still says it runs (the task row names it; a backup: its own row)
    copy_runs: bool = False  # a backup copy of it runs
    gave_way: bool = False  # its worker, found slow, gave it up to its copy, which then ended uncommitted
    last_failure: str = ""  # how its task's previous attempt failed, if it did


class Act(StrEnum):
    """What a move does."""

    COMMIT = "commit"  # the outputs published on the task row (fenced on the claim)
    FAIL = "fail"  # the task QUEUED for its next attempt, or DEAD (fenced on the claim)
    GIVE_WAY = "give_way"  # the attempt recorded as given up; the task left to its running copy
    ABANDON = "abandon"  # a backup recorded as failed and dropped; the task stays with its attempt
    LAPSE = "lapse"  # a backup past its deadline given up; the task stays with its attempt
    DISCARD = "discard"  # the task went on without the attempt: its work thrown away
    DROP = "drop"  # a stale deadline entry removed: the task has moved on
    WAIT = "wait"  # nothing now: its copy runs, and the first of the two to commit ends the task


class Verdict(StrEnum):
    """What the attempt's worker does with its share of the message, once the move is made."""

    SETTLE = "settle"  # done with it (the last attempt of a message deletes it)
    NEXT = "next"  # hand it back naming the next attempt, visible after the move's delay
    BACK = "back"  # hand it back as it is: it may stand in for the next attempt


@dataclass(frozen=True)
class Move:
    """The decision for one attempt's end."""

    act: Act
    status: TaskStatus | None = None  # where the task goes (COMMIT, FAIL)
    ended_as: str = ""  # the attempt row's outcome
    failure: FailureClass | None = None
    error: str = ""
    delay_s: int = 0  # seconds a requeued task's next attempt waits
    timed_out: bool = False  # revoked for time: its task's later attempts may run longer
    kill: bool = False  # counted among the job's kills
    revoked_by: str = ""  # "worker" or "monitor": who took the task from its attempt
    keep_end: bool = False  # the attempt's end was recorded when it gave way: keep it
    send: bool = False  # the move sends the next attempt's message (else its worker hands its own back)
    verdict: Verdict = Verdict.SETTLE
    outputs: tuple[str, ...] = ()  # a commit's: the names its task row is to publish


def budget(failure: FailureClass, facts: Facts, limits: StageLimits) -> int:
    """Attempts a task may have had when it fails this way and still be retried: the larger
    budget while the failure may be the platform's, the smaller when it may be the task's
    own, and none left when the same input failed the same way twice."""
    if failure.transient:
        return limits.max_transient_attempts
    if facts.last_failure == failure.value:
        return facts.attempt
    return limits.max_attempts


def decide(outcome: Outcome, facts: Facts, limits: StageLimits) -> Move:
    """The move that ends an attempt: pure, from what happened, what storage says and the
    stage's limits."""
    ending = outcome.ending
    if ending is Ending.REVOKED or (not facts.held and not ending.monitors):
        return Move(Act.DISCARD, verdict=Verdict.SETTLE if facts.backup else Verdict.BACK)
    if not facts.held:
        return Move(Act.DROP)
    if ending is Ending.COMMITTED:
        if len(json.dumps(list(outcome.outputs))) > OUTPUTS_CHARS:
            return decide(Outcome.failed(FailureClass.USER_CODE, (
                f"{len(outcome.outputs)} outputs whose names take more than the {OUTPUTS_CHARS} characters a "
                "task row can name")), facts, limits)
        return Move(Act.COMMIT, outcome.status, outcome.status.value, outputs=outcome.outputs)
    if ending.monitors:
        return _monitored(outcome, facts, limits)
    failure = outcome.failure
    if facts.backup:  # the attempt it copies goes on, whatever befell the copy
        return Move(Act.ABANDON, ended_as=TaskStatus.FAILED.value, failure=failure, error=outcome.error)
    if facts.copy_runs and (ending is Ending.OVERRAN or failure is FailureClass.WORKER_SLOW):
        return Move(Act.GIVE_WAY, ended_as=TaskStatus.FAILED.value, failure=failure, error=outcome.error)
    overran = ending is Ending.OVERRAN
    delay = 0 if overran or failure is FailureClass.WORKER_SLOW else \
        RETRY_BACKOFF_S[min(facts.attempt, len(RETRY_BACKOFF_S)) - 1]
    return _fail(failure, outcome.error, facts, limits, TaskStatus.TIMED_OUT if overran else TaskStatus.FAILED,
                 delay_s=delay, timed_out=overran, kill=overran, revoked_by="worker" if overran else "")


def _monitored(outcome: Outcome, facts: Facts, limits: StageLimits) -> Move:
    """The monitor's moves: a backup past its deadline given up, an attempt left to its
    running copy, or the task taken from its attempt, as the failure it was."""
    ending = outcome.ending
    if facts.backup:
        if ending is Ending.SLOW:
            return Move(Act.WAIT)  # its worker, found slow, gives it up itself
        return Move(Act.LAPSE, ended_as=TaskStatus.TIMED_OUT.value, failure=outcome.failure, revoked_by="monitor")
    if facts.copy_runs:
        return Move(Act.WAIT)
    if facts.gave_way or ending is Ending.SLOW:  # its machine's fault: it ran out of no time
        why = FailureClass.WORKER_SLOW
        return _fail(why, f"revoked by the monitor: {why.value}", facts, limits, TaskStatus.FAILED,
                     revoked_by="monitor", keep_end=facts.gave_way, send=True)
    return _fail(outcome.failure, f"revoked by the monitor: {outcome.failure.value}", facts, limits,
                 TaskStatus.TIMED_OUT, timed_out=ending is Ending.OVERDUE, kill=True, revoked_by="monitor", send=True)


def _fail(failure: FailureClass, error: str, facts: Facts, limits: StageLimits, failed_as: TaskStatus,
          delay_s: int = 0, timed_out: bool = False, kill: bool = False, revoked_by: str = "",
          keep_end: bool = False, send: bool = False) -> Move:
    after = after_failure(TaskStatus.RUNNING, failed_as, facts.attempt, budget(failure, facts, limits))
    requeued = after is TaskStatus.QUEUED
    return Move(Act.FAIL, after, failed_as.value, failure, error, delay_s if requeued else 0, timed_out, kill,
                revoked_by, keep_end, send and requeued,
                Verdict.NEXT if requeued and not send else Verdict.SETTLE)
