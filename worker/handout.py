"""Attempts going from a worker's inbox to its slots, and what their claims are given.

Those of one partition whose rows were read ahead (``worker.readahead``) and are QUEUED for
them are claimed in one transaction (``transitions.claim_many``, ``tasks.MESSAGE_TASKS`` at
a time); the others — a backup, a row not read ahead or moved since, a task named twice —
are claimed each in its slot. Every claim is given its attempt's kill time and the time
from which a backup copy would help, from its stage's runtime history
(``pipeline.lifecycle.policy``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from pipeline import planning
from pipeline.lifecycle import policy, rollups, runtimes, tasks, transitions
from pipeline.lifecycle.status import TaskStatus
from pipeline.storage.clients import Clients
from worker.delivery import Delivery
from worker.readahead import RowsAhead

log = logging.getLogger(__name__)


@dataclass
class Handed:
    """An attempt going to a slot: its message, the row read ahead for its claim (``hint``),
    or its claim made already with others of its partition (``held``)."""

    delivery: Delivery
    ref: tasks.TaskRef
    hint: tasks.TaskRow | None = None
    held: transitions.Claim | None = None


class Handout:
    """The claims of worker ``worker``: its runtime ``history``, the rows it read ahead
    (``rows``), and the rollup writer of the moves it makes several at a time (``writer``)."""

    def __init__(self, clients: Clients, worker: str, history: runtimes.RuntimeBook, rows: RowsAhead,
                 writer: rollups.RollupWriter) -> None:
        self.clients, self.settings, self.worker = clients, clients.settings, worker
        self.history, self.rows, self.writer = history, rows, writer

    def kill_time(self, current: tasks.TaskRef, stage: str, params: dict[str, str], timeouts: int) -> datetime:
        history = self.history.read(stage, planning.history_of(params))
        return policy.kill_time(self.settings, stage, history, timeouts, tasks.now(), planning.work_of(params))

    def speculate_time(self, stage: str, params: dict[str, str], started: datetime) -> datetime | None:
        history = self.history.read(stage, planning.history_of(params))
        return policy.speculate_time(self.settings, stage, history, started, planning.work_of(params))

    def claim_together(self, popped: list[tuple[Delivery, tasks.TaskRef]]) -> list[Handed]:
        """The attempts going to slots now, those that can be claimed together claimed."""
        handed: list[Handed] = []
        together: dict[str, dict[str, Handed]] = {}
        for delivery, ref in popped:
            item = Handed(delivery, ref, None if ref.backup else self.rows.take(ref))
            row, group = item.hint, together.setdefault(ref.partition, {})
            if row is not None and row.status is TaskStatus.QUEUED and ref.attempt <= row.attempt \
                    and ref.task not in group:
                group[ref.task] = item
            else:
                handed.append(item)
        for group in together.values():
            items = list(group.values())
            handed += items
            for first in range(0, len(items) - 1, tasks.MESSAGE_TASKS):
                self._claim_group(items[first:first + tasks.MESSAGE_TASKS])
        return handed

    def _claim_group(self, items: list[Handed]) -> None:
        """Claim ``items`` (of one partition, each with its row read ahead) in one transaction;
        where it did not apply, each is left to be claimed in its slot, reading its row."""
        wanted = [(i.ref, i.hint) for i in items if i.hint is not None]
        if len(wanted) < 2:
            return
        got: list[transitions.Claim | None] | None = None
        try:
            got = transitions.claim_many(self.clients, wanted, self.worker, self.kill_time, self.writer,
                                         self.speculate_time)
        except Exception as exc:
            log.info("attempts of %s not claimed together: %s", items[0].ref.partition, exc)
        for n, item in enumerate(items):
            item.hint, item.held = None, got[n] if got else None
