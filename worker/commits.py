"""A worker's commits made together: a group commit with a short linger.

The attempts of one partition that a worker claimed together mostly end together too. A
slot's commit waits up to ``LINGER_S`` for the worker's other slots that run attempts of the
same partition to reach theirs, and one transaction commits them all, each row fenced on
its own claim (``transitions.apply_together``). A commit that cannot join — a backup's, a
tile task's that counts itself off its reduction (``transitions.joins_others``) — goes its
own way (``transitions.apply``), as does one whose worker runs nothing else of its
partition: that one does not wait at all. Each commit comes here from its attempt's end
(``pipeline.lifecycle.ends``), which decided it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pipeline.lifecycle import transitions
from pipeline.lifecycle.policy import Move
from pipeline.lifecycle.rollups import RollupWriter
from pipeline.lifecycle.transitions import Claim
from pipeline.storage.clients import Clients

LINGER_S = 0.02  # the longest a commit waits for others of its partition


@dataclass
class _Waiting:
    held: Claim
    move: Move
    result: bool | Exception | None = None


class Commits:
    """The commits of one worker's slots, grouped per partition under ``writer``'s rollup."""

    def __init__(self, clients: Clients, writer: RollupWriter) -> None:
        self.clients, self.writer = clients, writer
        self._changed = threading.Condition()
        self._running: Counter[str] = Counter()  # attempts of each partition in the worker's slots
        self._waiting: dict[str, list[_Waiting]] = {}
        self.grouped = 0  # commits made in a transaction with others

    @contextmanager
    def running(self, part: str) -> Iterator[None]:
        """While a slot runs (and ends) an attempt of partition ``part``."""
        with self._changed:
            self._running[part] += 1
        try:
            yield
        finally:
            with self._changed:
                self._running[part] -= 1
                self._changed.notify_all()

    def commit(self, writer: RollupWriter, held: Claim, move: Move) -> bool:
        """The commit ``move`` of the attempt ``held``, with those of the worker's other
        slots in its partition that come within the linger; ``writer`` (the slot's) for one
        made alone. Whether it applied."""
        part = held.ref.partition
        if not transitions.joins_others(held, move):
            return transitions.apply(self.clients, writer, held, move)
        mine = _Waiting(held, move)
        with self._changed:
            group = self._waiting.setdefault(part, [])
            if len(group) >= transitions.GROUP_COMMITS:
                group = []  # full: this one goes alone
            else:
                group.append(mine)
                self._changed.notify_all()
                if len(group) > 1:  # the first of the group commits it
                    while mine.result is None:
                        self._changed.wait()
                    return _outcome(mine.result)
                until = time.monotonic() + LINGER_S
                while len(group) < min(self._running[part], transitions.GROUP_COMMITS) and time.monotonic() < until:
                    self._changed.wait(until - time.monotonic())
                del self._waiting[part]
        if len(group) <= 1:
            return transitions.apply(self.clients, writer, held, move)
        results: list[bool | Exception]
        try:
            results = transitions.apply_together(self.clients, self.writer, [(w.held, w.move) for w in group])
        except Exception as exc:  # unsettled (the read back failed): each raises it, as its own commit would
            results = [exc] * len(group)
        with self._changed:
            for waiting, result in zip(group, results, strict=True):
                waiting.result = result
            self.grouped += len(group)
            self._changed.notify_all()
        return _outcome(mine.result)


def _outcome(result: bool | Exception | None) -> bool:
    if isinstance(result, Exception):
        raise result
    return bool(result)
