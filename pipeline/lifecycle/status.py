"""The task and job state machines: the states and the one function that owns transitions."""

from __future__ import annotations

from enum import StrEnum


class TaskStatus(StrEnum):
    PENDING = "PENDING"  # planned, not yet released to a queue
    QUEUED = "QUEUED"  # a queue message names its current attempt
    RUNNING = "RUNNING"  # an attempt holds the lease and heartbeats
    SUCCEEDED = "SUCCEEDED"  # the current attempt committed its outputs
    CACHED = "CACHED"  # the outputs already existed; nothing was computed
    NO_DATA = "NO_DATA"  # the catalog has none of its sources (ocean, an outage): nothing to make
    FAILED = "FAILED"  # an attempt failed; passes on to QUEUED (retry) or DEAD
    TIMED_OUT = "TIMED_OUT"  # an attempt was revoked as overdue; passes on like FAILED
    DEAD = "DEAD"  # the retry budget is spent
    CANCELLED = "CANCELLED"  # the job was cancelled before the task finished

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset(
    {TaskStatus.SUCCEEDED, TaskStatus.CACHED, TaskStatus.NO_DATA, TaskStatus.DEAD, TaskStatus.CANCELLED}
)
# terminal states that are not failures: the job can still succeed
ENDED_WELL = frozenset({TaskStatus.SUCCEEDED, TaskStatus.CACHED, TaskStatus.NO_DATA})
# the states in which a task has outputs (made now, or found made)
MADE = frozenset({TaskStatus.SUCCEEDED, TaskStatus.CACHED})

_ALLOWED: dict[TaskStatus, frozenset[TaskStatus]] = {
    # PENDING -> CACHED: a tile task whose every output the cache holds is settled at
    # planning (``transitions.settle``), never queued: a repeat request costs almost nothing
    TaskStatus.PENDING: frozenset({TaskStatus.QUEUED, TaskStatus.CACHED, TaskStatus.CANCELLED}),
    TaskStatus.QUEUED: frozenset({TaskStatus.RUNNING, TaskStatus.CANCELLED}),
    TaskStatus.RUNNING: frozenset(
        {
            TaskStatus.SUCCEEDED,
            TaskStatus.CACHED,
            TaskStatus.NO_DATA,
            TaskStatus.FAILED,
            TaskStatus.TIMED_OUT,
            TaskStatus.CANCELLED,
        }
    ),
    TaskStatus.FAILED: frozenset({TaskStatus.QUEUED, TaskStatus.DEAD}),
    TaskStatus.TIMED_OUT: frozenset({TaskStatus.QUEUED, TaskStatus.DEAD}),
}


class IllegalTransition(ValueError):
    """A change of state the state machine does not allow."""


def transition(current: TaskStatus | str, new: TaskStatus | str) -> TaskStatus:
    """Check that a task may go from ``current`` to ``new``; return ``new``."""
    current, new = TaskStatus(current), TaskStatus(new)
    if new not in _ALLOWED.get(current, frozenset()):
        raise IllegalTransition(f"task cannot go from {current.value} to {new.value}")
    return new


def after_failure(current: TaskStatus | str, failed_as: TaskStatus, attempt: int,
                  max_attempts: int) -> TaskStatus:
    """Where a failed (or timed-out) attempt leaves its task: QUEUED while the retry
    budget lasts, else DEAD. Both steps are checked."""
    transition(current, failed_as)
    return transition(failed_as, TaskStatus.QUEUED if attempt < max_attempts else TaskStatus.DEAD)


class JobState(StrEnum):
    ACCEPTED = "ACCEPTED"  # stored, a plan message is on its way
    RUNNING = "RUNNING"  # planned: tasks exist and are being released
    CANCELLING = "CANCELLING"  # cancel asked; tasks are being cancelled
    FINISHING = "FINISHING"  # every task is terminal; manifest and email are being made
    SUCCEEDED = "SUCCEEDED"  # done, every task succeeded (or was cached)
    FAILED = "FAILED"  # done, some task is DEAD
    CANCELLED = "CANCELLED"  # done after a cancel

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


_JOB_ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.ACCEPTED: frozenset({JobState.RUNNING, JobState.CANCELLING, JobState.FINISHING}),  # FINISHING: unplannable
    JobState.RUNNING: frozenset({JobState.FINISHING, JobState.CANCELLING}),
    JobState.CANCELLING: frozenset({JobState.FINISHING}),
    JobState.FINISHING: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}),
}


def job_transition(current: JobState | str, new: JobState | str) -> JobState:
    """Check that a job may go from ``current`` to ``new``; return ``new``."""
    current, new = JobState(current), JobState(new)
    if new not in _JOB_ALLOWED.get(current, frozenset()):
        raise IllegalTransition(f"job cannot go from {current.value} to {new.value}")
    return new
