"""Runtime history per (stage, product[, reducer]) across all requests: count, mean and
M2 (Welford), updated with conditional writes so concurrent updates are never lost.

The history measures work, not tasks: each sample is an attempt's seconds per megapixel of
its work (``planning.work_of``, as its application planned it: the target tile's pixels per layer
made, and for a reduction the pixels of all its inputs), so that jobs on different grids share one history and each
attempt's kill threshold follows its own size. Only computed outputs are samples: a task
that ended CACHED or NO_DATA did no work worth the name, and a mostly cached rerun would
otherwise drag the mean to the floor and get real computations killed.

A worker keeps a :class:`RuntimeBook`: it adds its samples locally and merges them into the
table every few seconds (one conditional write per key, where a write per sample would cost
two storage calls per task), and serves the history it last read or merged. A worker that
is killed loses its last few seconds of samples: statistics, never results."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
from azure.data.tables import TableClient, UpdateMode

log = logging.getLogger(__name__)

UNIT = "s/Mpx"  # what a history row's samples measure; a row without it (per task) is not read


@dataclass(frozen=True)
class Runtime:
    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    @property
    def stdev(self) -> float:
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 0.0

    def add(self, seconds: float) -> Runtime:
        """Welford's update: the statistics with one more sample."""
        count = self.count + 1
        delta = seconds - self.mean
        mean = self.mean + delta / count
        return Runtime(count, mean, self.m2 + delta * (seconds - mean))

    def merge(self, other: Runtime) -> Runtime:
        """The statistics of both sets of samples together (Chan et al.'s pairwise update)."""
        if not other.count:
            return self
        count = self.count + other.count
        delta = other.mean - self.mean
        return Runtime(count, self.mean + delta * other.count / count,
                       self.m2 + other.m2 + delta * delta * self.count * other.count / count)


def _of(row: Mapping[str, Any]) -> Runtime:
    if row.get("Unit") != UNIT:
        return Runtime()  # kept per task before the history measured work: not comparable
    return Runtime(int(row["Count"]), float(row["Mean"]), float(row["M2"]))


def read(table: TableClient, stage: str, key: str) -> Runtime:
    try:
        row = table.get_entity(stage, key)
    except ResourceNotFoundError:
        return Runtime()
    return _of(row)


def merge(table: TableClient, stage: str, key: str, samples: Runtime, tries: int = 50) -> Runtime:
    """Add the statistics of some samples, retrying on a concurrent update; returns the new
    statistics."""
    for _ in range(tries):
        try:
            row = table.get_entity(stage, key)
        except ResourceNotFoundError:
            new = samples
            try:
                table.create_entity({"PartitionKey": stage, "RowKey": key, "Count": new.count,
                                     "Mean": new.mean, "M2": new.m2, "Unit": UNIT})
                return new
            except ResourceExistsError:
                continue
        new = _of(row).merge(samples)
        try:
            table.update_entity(
                {"PartitionKey": stage, "RowKey": key, "Count": new.count, "Mean": new.mean, "M2": new.m2,
                 "Unit": UNIT},
                mode=UpdateMode.REPLACE, etag=row.metadata["etag"], match_condition=MatchConditions.IfNotModified,
            )
            return new
        except ResourceModifiedError:
            continue
    raise RuntimeError(f"runtime history of {stage}/{key} kept changing; samples dropped")


class RuntimeBook:
    """One process's runtime history: samples merged into the table at most every
    ``flush_s`` seconds, reads served from the last table value (refreshed after
    ``flush_s``) with this process's unmerged samples on top."""

    def __init__(self, table: TableClient, flush_s: float = 5.0) -> None:
        self.table, self.flush_s = table, flush_s
        self._known: dict[tuple[str, str], tuple[float, Runtime]] = {}  # when read, what
        self._pending: dict[tuple[str, str], Runtime] = {}
        self._flushed = time.monotonic()
        self._lock = threading.Lock()

    def read(self, stage: str, key: str) -> Runtime:
        with self._lock:
            at, known = self._known.get((stage, key), (-math.inf, Runtime()))
            pending = self._pending.get((stage, key), Runtime())
        if time.monotonic() - at >= self.flush_s:
            known = read(self.table, stage, key)
            with self._lock:
                self._known[(stage, key)] = (time.monotonic(), known)
        return known.merge(pending)

    def add(self, stage: str, key: str, seconds: float) -> None:
        with self._lock:
            self._pending[(stage, key)] = self._pending.get((stage, key), Runtime()).add(seconds)
            due = time.monotonic() - self._flushed >= self.flush_s
        if due:
            self.flush()

    def flush(self) -> bool:
        """Merge every unmerged sample into the table; False if some must wait for the next
        flush (storage unreachable)."""
        with self._lock:
            pending, self._pending = self._pending, {}
            self._flushed = time.monotonic()
        merged_all = True
        for (stage, key), samples in pending.items():
            try:
                merged = merge(self.table, stage, key, samples)
            except Exception as exc:
                log.warning("runtime history of %s/%s not merged yet: %s", stage, key, exc)
                merged_all = False
                with self._lock:
                    self._pending[(stage, key)] = self._pending.get((stage, key), Runtime()).merge(samples)
                continue
            with self._lock:
                self._known[(stage, key)] = (time.monotonic(), merged)
        return merged_all
