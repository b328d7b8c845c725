"""What a job's status costs as the job grows: latency and entities read by ``GET
/api/jobs/{id}`` (``jobs.status``) and the portal's job view (``jobview.view``) for no-op
jobs of 100, 10,000 and 100,000 tasks.

Each job is built by writing its rows directly, as the planner and the transitions would
have left them once every task ran (running 100,000 no-op tasks on this machine takes the
better part of an hour): its job row, its task rows (``tasks.task_entity``, SUCCEEDED), an
attempt row per task, the plan row (``rollups.plan_row``), the rollup rows of one releaser
and eight worker slots (``rollups.apply`` of the moves each made: queued, claimed,
committed with a runtime) and, for the few tasks that died, their entries in the failure
index; then its status row, as a sweep pass writes it (``snapshots.write``), which the
status and the view read while it is fresh. Beside them, the status summing the rollups
itself (what it does with no fresh status row), and the latency of a key-range query that
matches no row: Azurite (not Azure, whose key ranges are indexed) filters every row of a
table for every query, so its queries slow as the table grows whatever they return. Entities are counted through the
SDK's per-request hooks (``pipeline.storage.clients.HOOKS``): a point read is one, a query as many
as its pages hold. Each size on an Azurite of its own.
Last line: JSON with every figure, ``status_ratio_100k_to_100`` (status latency at
100,000 tasks ÷ at 100) and ``summed_ratio_100k_to_100`` (the same, summing the rollups).

    python -m bench.status_scale [--sizes 100 10000 100000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

from azure.core.exceptions import ServiceRequestError, ServiceResponseError

from bagpipe.azurite import Azurite
from bench.scale_report import Context, Part, table
from pipeline.lifecycle import attempts, jobs, rollups, snapshots, tasks
from pipeline.lifecycle.status import JobState, TaskStatus
from pipeline.requests.expansion import expand, plan_of
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web import jobview
from tests.harness.hooks import counting_reads

WRITERS = 8  # worker slots that ran the job
DIED = 5  # tasks that ended DEAD, with a failure each


def request_for(size: int) -> JobRequest:
    """A MOD10A2 request over 1° tiles of the western US (300 of them) with at least
    ``size`` tasks: as many years from 2001 as that takes (46 periods a year)."""
    years = max(1, -(-size // (300 * 46)))
    return JobRequest.model_validate({
        "region": {"bbox": [-125, 30, -105, 45]}, "grid": {"resolution": 0.05}, "products": ["MOD10A2"],
        "start": "2001-01-01", "end": f"{2000 + years}-12-31"})


def build(clients: Clients, size: int) -> str:
    """A finished-looking no-op job of ``size`` tasks, written row by row."""
    request = request_for(size)
    specs = plan_of(expand(request, 10**7)[:size])
    job = jobs.new_job_id(tasks.now())
    created = tasks.now() - timedelta(hours=1)
    clients.jobs.create_entity(jobs.JobRow(
        job=job, request=request.model_dump_json(), state=JobState.RUNNING, total=size, tiles=size, places=size,
        planned=size, released=size, created_at=created, updated_at=created, label=f"{size} no-op tasks", owner="bench",
    ).to_entity())
    clients.tasks.upsert_entity(rollups.plan_row(job, specs))
    dead = set(random.Random(size).sample(range(size), min(DIED, size)))
    release = rollups.Moves()
    slots = [rollups.Moves() for _ in range(WRITERS)]
    rows: list[dict[str, Any]] = []
    ended = tasks.now()
    for seq, spec in enumerate(specs):
        entity = tasks.task_entity(job, seq, spec, clients.settings.shards)
        status = TaskStatus.DEAD if seq in dead else TaskStatus.SUCCEEDED
        runtime = random.Random(seq).uniform(0.02, 0.2)
        entity |= tasks.TaskRow.as_stored(status=status, ended_at=ended, runtime_s=runtime, outputs="[]")
        rows += [entity, attempts.attempt_row(job, entity["RowKey"], 1, outcome=status.value, runtime_s=runtime,
                                              ended_at=ended, **({"failure_class": "user_code_error"}
                                                                 if status is TaskStatus.DEAD else {}))]
        release.move(spec.stage, spec.tile, TaskStatus.PENDING, TaskStatus.QUEUED)
        slot = slots[seq % WRITERS].move(spec.stage, spec.tile, TaskStatus.QUEUED, TaskStatus.RUNNING)
        slot.move(spec.stage, spec.tile, TaskStatus.RUNNING, status)
        if status is TaskStatus.DEAD:
            slot.failed("user_code_error")
            rows.append(rollups.failure_op(job, entity["RowKey"], 1, spec.stage, "user_code_error", "exit 4",
                                           ended - timedelta(seconds=runtime), ended)[1])
        else:
            slot.ran(spec.stage, runtime)
    def write(start: int) -> None:
        """One transaction of upserts, sent again if its connection is reset (Azurite does,
        under this load): an upsert written twice is written once."""
        for attempt in range(6):
            try:
                clients.tasks.submit_transaction([("upsert", r) for r in rows[start:start + tasks.BATCH]])
                return
            except (ServiceRequestError, ServiceResponseError):
                if attempt == 5:
                    raise
                time.sleep(2**attempt)

    with ThreadPoolExecutor(4) as pool:  # a few transactions in flight keep Azurite busy
        list(pool.map(write, range(0, len(rows), tasks.BATCH)))
    for name, moves in [("release", release), *((f"slot-{i}", m) for i, m in enumerate(slots))]:
        clients.tasks.create_entity({"PartitionKey": job, "RowKey": names.counter_key(name),
                                     **rollups.apply({}, moves)})
    return job


def measured(settings: Settings, call: Callable[[Clients], object], repeat: int) -> tuple[float, int]:
    """The median seconds of ``call`` and the entities it read."""
    with counting_reads() as reads:
        fresh = Clients(settings)
        call(fresh)  # warm: connections, caches
        seconds = []
        for _ in range(repeat):
            reads.clear()
            started = time.perf_counter()
            call(fresh)
            seconds.append(time.perf_counter() - started)
        fresh.close()
    return statistics.median(seconds), sum(reads)


def sweep_pass(clients: Clients, job: str) -> None:
    """The job's status row, written as a sweep pass writes it."""
    began = tasks.now()
    assert snapshots.write(clients, job, rollups.read(clients.tasks, jobs.get(clients, job).parts), began,
                           snapshots.fresh_for(clients.settings, 0.0))


def summed(clients: Clients, job: str) -> dict[str, Any]:
    """The status summing the job's rollups, as it does with no fresh status row."""
    row = jobs.get(clients, job)
    return jobs.status(clients, job, rollups.read(clients.tasks, row.parts, tiles=False), row)


def empty_query(clients: Clients, job: str) -> list[Any]:
    """A key-range query of the job's partition that matches no row: what any query costs
    here before it reads a row (Azurite filters every row of a table for every query)."""
    return list(clients.tasks.query_entities("PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                                             parameters={"pk": job, "lo": "~none~", "hi": "~none~~"}))


def measure(sizes: list[int], repeat: int) -> dict[str, Any]:
    """Every figure of the benchmark, each size on an Azurite of its own."""
    figures: dict[str, Any] = {"sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            azurite = Azurite(Path(tmp) / f"azurite{size}").start()
            try:
                settings = Settings(storage_connection=azurite.connection_string, namespace=f"s{size}",
                                    monitor_interval_s=1800.0)  # the status row fresh while measured
                clients = Clients(settings)
                clients.ensure_resources()
                started = time.monotonic()
                job = build(clients, size)
                built_s = time.monotonic() - started
                sweep_pass(clients, job)  # fresh for an hour (the interval set below): read by every call
                status_s, status_reads = measured(settings, lambda c, j=job: jobs.status(c, j), repeat)
                summed_s, summed_reads = measured(settings, lambda c, j=job: summed(c, j), repeat)
                sweep_pass(clients, job)
                view_s, view_reads = measured(settings, lambda c, j=job: jobview.view(c, j), repeat)
                scan_s, _ = measured(settings, lambda c, j=job: empty_query(c, j), repeat)
                for shown in (jobs.status(clients, job)["counts"], summed(clients, job)["counts"]):
                    assert shown["SUCCEEDED"] + shown["DEAD"] == size, shown
            finally:
                azurite.stop()
            found = {"status_s": round(status_s, 4), "status_entities": status_reads,
                     "summed_s": round(summed_s, 4), "summed_entities": summed_reads,
                     "view_s": round(view_s, 4), "view_entities": view_reads,
                     "empty_query_s": round(scan_s, 4), "rows_of_the_job": 2 * size,
                     "built_s": round(built_s, 1)}
            figures["sizes"][str(size)] = found
            print(f"{size:>7} tasks: status {status_s * 1000:7.1f} ms, {status_reads:3d} entities; summing "
                  f"the rollups {summed_s * 1000:7.1f} ms, {summed_reads:3d} entities; "
                  f"view {view_s * 1000:7.1f} ms, {view_reads:3d} entities; a query of no row "
                  f"{scan_s * 1000:6.1f} ms (the job has {2 * size} task and attempt rows; built in {built_s:.0f} s)",
                  flush=True)
    by_size = figures["sizes"]
    if "100" in by_size and "100000" in by_size:
        figures["status_ratio_100k_to_100"] = round(by_size["100000"]["status_s"] / by_size["100"]["status_s"], 2)
        figures["summed_ratio_100k_to_100"] = round(by_size["100000"]["summed_s"] / by_size["100"]["summed_s"], 2)
        figures["view_ratio_100k_to_100"] = round(by_size["100000"]["view_s"] / by_size["100"]["view_s"], 2)
    return figures


def part(ctx: Context) -> Part:
    """This benchmark as a section of docs/scale.md."""
    figures = measure([100, 10_000, 100_000], 7)
    rows = [(f"{int(size):,}", f"{f['status_s'] * 1000:.1f} ms", f["status_entities"],
             f"{f['summed_s'] * 1000:.1f} ms", f["summed_entities"], f"{f['view_s'] * 1000:.1f} ms",
             f["view_entities"], f"{f['empty_query_s'] * 1000:.1f} ms", f"{f['rows_of_the_job']:,}")
            for size, f in figures["sizes"].items()]
    markdown = f"""## Status at constant cost

What a job's status costs as the job grows (`bench/status_scale.py`): `GET /api/jobs/{{id}}`
(`jobs.status`) and the portal's job view (`jobview.view`) on no-op jobs of 100, 10,000 and
100,000 tasks, each written as the planner and the transitions leave a finished job (its task
and attempt rows, the plan row, the rollup rows of a releaser and eight worker slots, the
failure index of the few that died) and its status row as a sweep pass writes it, each on
an Azurite of its own; the median of 7 calls. Beside them, the status summing the rollups
itself, as it does when no fresh status row is there. Entities are counted through the
SDK's per-request hooks.

{table(["tasks", "status", "entities read", "summing the rollups", "entities read", "job view",
        "entities read", "a query of no row", "rows in the job's partition"], rows)}

The status reads two rows by key whatever the job's size: the job row and its status row,
the sum of its rollups that the sweep writes once a pass (`pipeline.lifecycle.snapshots`),
read for two of the sweep's passes (its figures are at most that old, and the status says
when they were summed, `as_of`), and for a finished job the final one its finisher wrote
(a job that has had workers adds their health rows: one query of the small workers
table). Status at 100,000 tasks takes {figures.get("status_ratio_100k_to_100", "?")}× its time at
100 (`status_ratio_100k_to_100`; the goal was 1.5).

Summing the rollups instead, as every look did before and as a look does when the sweep
has not written lately, takes one key-range query of a row per writer (nine here: a
releaser and eight slots), and grows {figures.get("summed_ratio_100k_to_100", "?")}×
on Azurite: it filters every row of a table for every query (its `queryTableEntities` runs
the filter as a function over the table's whole collection; only a point read finds its row
by an index), so a query that matches no row at all (the eighth column) grows as much.
Azure serves a key range from its index, but the query still reads a row per worker slot
at work on the job, hundreds on Azure, for every look of every scientist watching: the
status row costs the sweep one query per partition of the job and one write a pass,
whoever looks. The job
view reads the status row too, and still the plan row and a page of the failure index
from the job's partition: a bounded number of entities, its time
{figures.get("view_ratio_100k_to_100", "?")}× at 100,000 tasks on Azurite for that query.
"""
    return Part({k: v for k, v in figures.items() if k != "sizes"}, markdown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(json.dumps(measure(args.sizes, args.repeat)))


if __name__ == "__main__":
    main()
