"""How a worker's attempts run against their history, and how its machine runs it: the
figures it reports for its health (``pipeline.lifecycle.health``), from which the monitor
finds a slow machine.

Each committed attempt with a trusted history leaves the ratio of its time to the time its
history expects; one that ran past its kill time counts as at least "slow", whatever it
ran; the attempts still running count with their ratio so far, so that a machine slowed
in the middle of a long attempt is seen before the attempt ends.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from pipeline.lifecycle import health
from pipeline.lifecycle.tasks import TaskRef
from pipeline.storage.clients import Clients

STALL_NAP_S = 0.05  # the stall probe's nap
STALL_WINDOW_S = 1.0  # the stall is of the naps that ended in the last this many seconds
PACE_AFTER = 0.2  # an attempt's pace is trusted once it has run this share of its allowed time
PACE_MARGIN = 1.5  # ... and revoked when that pace takes it past this many times its allowed time


def bound_to_overrun(elapsed: float, allowed: float, projected: float | None) -> bool:
    """Whether an attempt that has run ``elapsed`` of the ``allowed`` seconds its kill time
    gives it, and whose stage's pace says it will take ``projected`` seconds in all, will
    run far past them: plain once it has run PACE_AFTER of them and its pace takes it past
    PACE_MARGIN times them. The margin keeps an attempt whose work is only roughly in
    proportion to its time (an uneven input, a slow patch) from being revoked for it; a
    straggler 4–10× its history is well past it."""
    return projected is not None and elapsed >= PACE_AFTER * allowed and projected >= PACE_MARGIN * allowed


class Pace:
    """One worker's ratios of attempt times to their history. Safe across its slots' threads."""

    def __init__(self, slow_ratio: float) -> None:
        self.slow_ratio = slow_ratio  # the ratio from which the monitor calls a worker slow (0: never)
        self._lock = threading.Lock()
        self.ratios: deque[float] = deque(maxlen=health.RECENT)  # of the recent ended attempts
        self._running: dict[TaskRef, tuple[float, float]] = {}  # (start, expected s) of the running ones
        self._reported = -health.REPORT_EVERY_S
        self._started = 0  # attempts run
        self._naps: deque[tuple[float, float]] = deque()  # the stall probe's: (ended at, seconds taken)
        self._stalled = False  # the stall is at the monitor's floor
        self._asked = False  # a report is wanted at once

    def started(self, ref: TaskRef, expected: float | None) -> None:
        """An attempt starts, expected to take ``expected`` s (None: no trusted history)."""
        with self._lock:
            self._started += 1
            if expected:
                self._running[ref] = (time.monotonic(), expected)

    def stopped(self, ref: TaskRef) -> None:
        """The attempt is no longer running, however it ended."""
        with self._lock:
            self._running.pop(ref, None)

    def ran(self, seconds: float, expected: float | None) -> None:
        """An attempt committed after ``seconds``, its history expecting ``expected``."""
        if expected:
            with self._lock:
                self.ratios.append(seconds / expected)

    def too_slow(self, seconds: float, expected: float | None) -> None:
        """An attempt ran past its kill time after ``seconds``: at least as slow as "slow"."""
        if expected:
            with self._lock:
                self.ratios.append(max(seconds / expected, self.slow_ratio))

    def probe(self, stopping: threading.Event) -> None:
        """Until ``stopping``: nap STALL_NAP_S again and again, noting how long each nap
        took. On a machine that runs the worker whenever it asks, about what it asked for;
        where the worker runs a tenth of the time (a VM's CPU stolen or throttled, a
        process stopped), ten times that: the task it runs cannot tell, this can. A nap is
        timed from the end of the one before, so that a stop falling between two naps (in
        the bookkeeping here) is counted too: with a window of a few naps, missing it read
        a machine running a tenth of the time as one running all of it."""
        began = time.monotonic()
        while not stopping.is_set():
            stopping.wait(STALL_NAP_S)
            ended = time.monotonic()
            with self._lock:
                self._naps.append((ended, ended - began))
                while self._naps[0][0] < ended - STALL_WINDOW_S:
                    self._naps.popleft()
            began = ended
            stalled = (self.stall() or 0.0) >= health.STALL_FLOOR
            if stalled and not self._stalled:
                self.report_soon()  # the monitor hears of it now, not at the next round
            self._stalled = stalled

    def stall(self) -> float | None:
        """The wall time the probe's recent naps took over the time they asked for (1: the
        worker runs when it asks); None until they span half a window."""
        with self._lock:
            naps = list(self._naps)
        if not naps or naps[-1][0] - (naps[0][0] - naps[0][1]) < STALL_WINDOW_S / 2:
            return None
        return sum(took for _, took in naps) / (len(naps) * STALL_NAP_S)

    def report_soon(self) -> None:
        """Have the next :meth:`report` made at once (its stall just reached the floor; an
        attempt of its was taken from it, which may be the monitor draining it)."""
        with self._lock:
            self._asked = self.slow_ratio > 0  # (no report is made with the health rule off)

    def asked(self) -> bool:
        """Whether a report was asked for at once (:meth:`report_soon`) and not made yet."""
        with self._lock:
            return self._asked

    def report(self, clients: Clients, worker: str, slots: int) -> str | None:
        """Every REPORT_EVERY_S: report the ratios (the ended attempts', then the running
        ones' so far) and return the worker's state as the monitor last judged it; None
        when it is not yet time."""
        with self._lock:
            if self.slow_ratio <= 0 or (not self._asked and time.monotonic() - self._reported < health.REPORT_EVERY_S):
                return None
            self._reported, self._asked = time.monotonic(), False
            ended = list(self.ratios)
            running = [(self._reported - start) / expected for start, expected in self._running.values()]
            count = self._started
        return health.report(clients, worker, ended, running, slots, count, self.stall())
