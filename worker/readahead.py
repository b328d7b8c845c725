"""Task rows read ahead of their claims: one key-range query for the attempts of a receive.

A claim reads its task row before its transaction: a point read per task. A worker that
receives several attempts at once (in one message or several) reads the rows of those of
one job in a single key-range query instead (a shard holds every ``shards``-th task of a
job, so their keys lie close together) and keeps each as a *hint* for its claim (``transitions.claim``): the claim tries
its transaction on the hint's ETag, and reads the row as before wherever the hint does not
let it claim (not QUEUED, or changed since). A hint only spares a read; it decides nothing.
"""

from __future__ import annotations

import logging
import threading
import time

from pipeline.lifecycle import tasks
from pipeline.lifecycle.tasks import TaskRef, TaskRow
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)
SPAN_PER_ROW = 8  # a query reads at most this many rows for each it is for (the other shards' between them)


class RowsAhead:
    """The hints of one worker, each kept ``keep_s`` seconds at most (its message waits for a
    slot no longer than that before it is handed back)."""

    def __init__(self, clients: Clients, keep_s: float) -> None:
        self.clients, self.keep_s = clients, keep_s
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str], tuple[TaskRow, float]] = {}
        self.taken = 0  # hints handed to claims (each spares a read, unless it was stale)

    def read(self, refs: list[TaskRef]) -> int:
        """Read the rows of ``refs`` (a receive's attempts), a query per partition of a job of
        which they name two tasks or more close together; returns how many hints it keeps. A
        backup, or an attempt that stands alone, is left to its claim's own read."""
        wanted: dict[str, set[int]] = {}
        for ref in refs:
            if not ref.backup:
                wanted.setdefault(ref.partition, set()).add(int(ref.task))
        kept = 0
        for part, seqs in wanted.items():
            first, last = min(seqs), max(seqs)
            if len(seqs) < 2 or last - first + 1 > SPAN_PER_ROW * len(seqs):
                continue
            try:
                rows = tasks.list_tasks(self.clients.tasks, [part], first, last - first + 1)
            except Exception as exc:  # a hint spares a read: its claim reads the row instead
                log.info("rows of %s not read ahead: %s", part, exc)
                continue
            at = time.monotonic()
            with self._lock:
                for row in rows:
                    if row.seq in seqs:
                        self._rows[(part, row.task)] = (row, at)
                        kept += 1
        self._forget_old()
        return kept

    def take(self, ref: TaskRef) -> TaskRow | None:
        """The hint for ``ref``'s claim, if one was read for it lately (each is taken once)."""
        with self._lock:
            found = self._rows.pop((ref.partition, ref.task), None)
            if found is None or time.monotonic() - found[1] > self.keep_s:
                return None
            self.taken += 1
        return found[0]

    def _forget_old(self) -> None:
        """Drop the hints of messages handed back or deleted unclaimed."""
        oldest = time.monotonic() - self.keep_s
        with self._lock:
            for key in [key for key, (_, at) in self._rows.items() if at < oldest]:
                del self._rows[key]
