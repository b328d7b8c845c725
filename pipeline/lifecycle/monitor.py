"""The monitor: revoke attempts that run past their kill threshold or stop heartbeating,
and requeue their tasks, within the retry budget (the thresholds and budgets are
``pipeline.lifecycle.policy``'s, which the worker reads too).

Running attempts are indexed by deadline in their job's partition (``pipeline.lifecycle.attempts``),
so one pass is a key-range query for "before now" per active job: no scan. A worker's
claim writes its attempt's entry, every heartbeat moves it, and its commit removes it;
the deadline is the earlier of the kill time and the heartbeat's expiry.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from azure.core.exceptions import ResourceNotFoundError

from pipeline.lifecycle import attempts, policy, progress, transitions
from pipeline.lifecycle.failures import FailureClass
from pipeline.lifecycle.status import TaskStatus
from pipeline.lifecycle.tasks import TaskRef, TerminalCounter, get_task, now
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)
_counter = TerminalCounter(f"monitor-{uuid.uuid4().hex[:12]}")


@dataclass
class SweepReport:
    revoked: list[dict[str, Any]] = field(default_factory=list)
    stale: int = 0


def revoke_overdue(clients: Clients, job: str, report: SweepReport) -> None:
    """Revoke every attempt of ``job`` whose deadline has passed (one key-range query)."""
    at = now()
    for entry in attempts.overdue(clients, job, at):
        ref = TaskRef(job, entry.task, entry.attempt)
        why = FailureClass.EXECUTION_TIMEOUT if at >= entry.kill_at else FailureClass.HEARTBEAT_LOST
        try:
            task = get_task(clients.tasks, ref.job, ref.task)
        except ResourceNotFoundError:  # its job was deleted
            attempts.unindex(clients, job, entry.key)
            report.stale += 1
            continue
        budget = policy.limits_for(clients.settings, task.stage).budget(why)
        outcome = transitions.revoke(clients, _counter, task, ref, entry.key, why, budget, entry.worker)
        if outcome is None:
            report.stale += 1
            continue
        report.revoked.append({"job": ref.job, "task": ref.task, "attempt": ref.attempt,
                               "why": why.value, "then": outcome.value})
        log.warning("revoked %s (%s): task now %s", ref, why.value, outcome.value)
        if outcome is TaskStatus.DEAD:
            progress.task_ended(clients, ref.job)
