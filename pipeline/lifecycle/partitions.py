"""A job's tasks spread over table partitions (job id + bucket), and the reads that span them.

Azure serves a table partition about 2,000 entities/s (its documented target, 1 KiB
entities): one partition per job caps a job's task rate at a few hundred tasks/s, whatever
its workers. So the planner sizes a job's buckets for its peak rate (:func:`buckets_for`)
and spreads its tasks over them (:func:`bucket_of`). Everything that must change together
stays in one partition, so that each move of a task is still one entity-group transaction:
a task's row, its attempts' rows, its deadline and dispatch entries, its failure entries,
the mover's rollup row of that partition — and a reduction with every tile task it waits
for, so that a tile task's end counts itself off the reduction in its own commit.

The job's own rows (its plan's ``~tiles`` row) live in its first partition, named as the
job itself (``names.partition``): a job of one bucket is laid out as before partitions.
A read of the whole job (its counters, its failures, its due entries) is one key-range query
per partition (:func:`query`): never a filter on another property, which Azure would serve
by scanning the table. Each partition more makes a read of the job's counts cost as much
again (a rollup row per writer in every partition): partitions spread a job's moves, not its
looks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from typing import Any, TypeVar

from azure.data.tables import TableClient, TableEntity

from pipeline.planning import TaskPlan
from pipeline.settings import Settings
from pipeline.storage import names

PARTITION_TARGET = 2_000  # entities/s one table partition serves (Azure's scalability targets)
PARTITION_SHARE = 0.5  # of that target, the most a job's peak may ask of one partition
ENTITIES_PER_TASK = 12  # a short task's entities in its partition: its claim, heartbeat, commit, reads
SHORTEST_TASK_S = 1.0  # the peak rate is sized for tasks this short (shorter ones are the no-op's)
QUERY_THREADS = 8  # partitions read at once by one read of the whole job
T = TypeVar("T")


def buckets_for(settings: Settings, count: int) -> int:
    """How many partitions a job of ``count`` tasks gets: at its peak, every task of its
    release window (or all of them, if fewer) running tasks of SHORTEST_TASK_S, no partition
    is asked for more than PARTITION_SHARE of its target (``settings.partitions`` > 0 asks
    for that many instead). Rounded up to a divisor of the shard queues, so that a shard's
    tasks lie in one partition and the rows of a receive's messages are one key range there
    (``worker.readahead``); and no more than the shard queues: a read of the job's counts
    reads a rollup row per writer in every partition, so each partition more costs every
    look at the job as much again (``docs/scale.md``). More partitions take more shards."""
    wanted = settings.partitions or math.ceil(
        min(settings.window, count) * ENTITIES_PER_TASK / SHORTEST_TASK_S / (PARTITION_SHARE * PARTITION_TARGET))
    shards = settings.shards
    return next((b for b in range(max(1, wanted), shards) if shards % b == 0), shards)


def bucket_of(seq: int, plan: TaskPlan, buckets: int) -> int:
    """The bucket of task ``seq``: that of its group, if its plan gives one (a task that
    waits and those it waits for: a task's count-off is part of its own commit); any other
    task by its sequence number, so that the tasks released together spread over every
    bucket."""
    return (seq if plan.group is None else plan.group) % buckets


def chunks(items: Iterable[T], part_of: Callable[[T], str], size: int) -> Iterator[tuple[str, list[T]]]:
    """``items`` by their partition (``part_of``; in their order within each), ``size`` at
    most at a time: the rows of one entity-group transaction are one partition's."""
    by_part: dict[str, list[T]] = {}
    for item in items:
        by_part.setdefault(part_of(item), []).append(item)
    for part, found in by_part.items():
        for start in range(0, len(found), size):
            yield part, found[start : start + size]


def parts(job: str, buckets: int) -> list[str]:
    """The PartitionKeys of a job of ``buckets`` buckets, the job's own first."""
    return [names.partition(job, b) for b in range(buckets)]


def query(table: TableClient, where: list[str], filter: str, parameters: dict[str, Any],
          limit: int | None = None, **kwargs: Any) -> Iterator[TableEntity]:
    """The rows matching ``filter`` (a condition on RowKey, with ``parameters``) in each of
    the partitions ``where``, one partition after another (the first ``limit`` of each, if
    given): one query each, run together."""
    if isinstance(where, str):  # a job id where its partitions are meant: each letter would be one
        raise TypeError(f"partitions are a list, not {where!r}")
    paging: dict[str, Any] = {"results_per_page": limit} if limit else {}

    def one(part: str) -> list[TableEntity]:
        rows = table.query_entities(f"PartitionKey eq @pk and {filter}", parameters={"pk": part, **parameters},
                                    **paging, **kwargs)
        return list(islice(rows, limit))

    if len(where) == 1:
        yield from one(where[0])
        return
    with ThreadPoolExecutor(min(QUERY_THREADS, len(where))) as pool:
        for found in pool.map(one, where):
            yield from found
