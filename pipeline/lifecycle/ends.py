"""An attempt's end, whoever ends it: the one door.

An attempt ends in one of a few ways (``policy.Ending``): its worker commits it, sees it
fail, stops it at its kill time, or finds its fence gone; the monitor finds it overdue,
silent, or on a worker found slow. :func:`end` reads what storage says of the attempt
(``policy.Facts``: whether it still runs, whether a backup copy of it runs, whether its
worker gave it up to that copy), asks ``policy.decide`` for the move (retry or dead, after
how long, give way, drop the copy, throw the work away), makes it (``transitions.apply``:
one fenced transaction, or the one record a move without one needs, and the messages it
sends), tells the job's progress once the task has ended, and returns what the worker
settles its message with. The worker, the monitor and the backups all come through here:
no other module computes a retry budget or follows a task's end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pipeline.failures import FailureClass
from pipeline.lifecycle import attempts, policy, progress, transitions
from pipeline.lifecycle.attempts import Deadline
from pipeline.lifecycle.policy import Act, Ending, Facts, Move, Outcome, Verdict
from pipeline.lifecycle.rollups import RollupWriter
from pipeline.lifecycle.status import TaskStatus
from pipeline.lifecycle.transitions import Claim
from pipeline.storage.clients import Clients


@dataclass(frozen=True)
class Ended:
    """What an end did: its move, and whether the move applied (a fenced one is refused when
    the attempt had been revoked meanwhile)."""

    move: Move
    applied: bool

    @property
    def status(self) -> TaskStatus | None:
        """Where the move left the task (None: it did not move it)."""
        return self.move.status if self.applied else None

    @property
    def verdict(self) -> Verdict:
        """What the attempt's worker does with its share of the message."""
        return self.move.verdict if self.applied else Verdict.SETTLE


Together = Callable[[Claim, Move], bool]  # a commit made with others of its partition (``worker.commits``)


def end(clients: Clients, writer: RollupWriter, attempt: Claim | Deadline, outcome: Outcome,
        follow: Callable[[str], object] | None = None, together: Together | None = None) -> Ended:
    """End ``attempt`` — a worker's claim, or the deadline entry the monitor found due — as
    ``outcome`` says: read what storage says of it, decide, make the move (moving
    ``writer``'s rollup; a commit through ``together`` when given), and, when its task has
    ended, tell the job's progress (``follow``: the worker's watch; else at once)."""
    if isinstance(attempt, Deadline):
        held, running = transitions.held_at(clients, attempt)
        facts = _monitored_facts(clients, held, attempt.backup, running)
    else:
        held, facts = attempt, _worker_facts(clients, attempt, outcome)
    move = policy.decide(outcome, facts, policy.limits_for(clients.settings, held.stage))
    if together is not None and move.act is Act.COMMIT:
        applied = together(held, move)
    else:
        applied = transitions.apply(clients, writer, held, move)
    ended = Ended(move, applied)
    if ended.status is not None and ended.status.terminal:
        if follow is not None:
            follow(held.ref.job)
        else:
            progress.task_ended(clients, held.ref.job)
    return ended


def _speculating(clients: Clients) -> bool:
    return clients.settings.speculate_share > 0


def _copy_runs(clients: Clients, held: Claim) -> bool:
    ref = held.ref
    return _speculating(clients) and attempts.is_running(clients, ref.partition, ref.task, ref.attempt, backup=True)


def _worker_facts(clients: Clients, held: Claim, outcome: Outcome) -> Facts:
    """What storage says of an attempt its own worker ends: it holds the attempt (its fence
    decides the rest); whether a copy of it runs is read where that matters (stopped at its
    kill time, or its worker found slow)."""
    ref = held.ref
    asks = not ref.backup and (outcome.ending is Ending.OVERRAN or (
        outcome.ending is Ending.FAILED and outcome.failure is FailureClass.WORKER_SLOW))
    return Facts(ref.attempt, ref.backup, copy_runs=asks and _copy_runs(clients, held), last_failure=held.last_failure)


def _monitored_facts(clients: Clients, held: Claim, backup: bool, running: bool) -> Facts:
    """What storage says of an attempt whose deadline entry fell due: whether it still runs
    (``running``: the task row names it, on the entry's worker; a backup: its own row says
    so), whether a copy of it runs, whether its worker gave it up to that copy."""
    ref = held.ref
    if backup:
        return Facts(ref.attempt, True, held=attempts.is_running(clients, ref.partition, ref.task, ref.attempt,
                                                                 backup=True))
    if not running:
        return Facts(ref.attempt, held=False)
    copy_runs = _copy_runs(clients, held)
    gave_way = not copy_runs and _speculating(clients) and attempts.gave_way(clients, ref.partition, ref.task,
                                                                              ref.attempt)
    return Facts(ref.attempt, copy_runs=copy_runs, gave_way=gave_way, last_failure=held.last_failure)
