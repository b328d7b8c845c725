"""Throughput of the local stack against the floor Azurite sets, side by side in one run.

The floor: the least storage work a task needs, done as bagpipe batches it (task rows
created 100 to a transaction, one message sent, received 32 at a time, deleted, one row
update; no more messages in the queue than bagpipe's window, as its release keeps it) by
eight threads (Azurite serves on one core: more only queue up), for the smaller job size.
Then bagpipe, submit to SUCCEEDED, for jobs of no-op tasks (``tile_stage=noop``) of about
1,000 and 10,000 tasks with 1, 2, 4 and 8 worker processes. Then the storage calls a task
costs, amortized: the smaller job run again on the local stack's pieces in one process (the
control loop and two workers of ``--slots`` slots), every storage request it makes from
submission to SUCCEEDED counted by the SDK clients' request hook — the planner's, the
workers', the sweep's and the completion's — and divided by its tasks. Last line: one JSON
object with every figure, ``ratio_to_floor`` (bagpipe's best rate for the smaller job ÷ the
floor), ``ratio_10k_to_1k`` and ``calls_per_task`` (the fewest of the ``--tasks-per-message``
measured, with its calls by kind, and each one's).

    python -m bench.throughput [--sizes 1000 10000] [--workers 1 2 4 8] [--slots 4] [--window 256]
        [--partitions 0] [--tasks-per-message 8]
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import date, timedelta
from pathlib import Path

import httpx
from azure.core.exceptions import ResourceNotFoundError, ServiceRequestError, ServiceResponseError
from azure.data.tables import TableServiceClient, UpdateMode
from azure.storage.queue import QueueServiceClient

from bagpipe import control
from bagpipe.azurite import Azurite
from bagpipe.stack import LocalStack
from pipeline.lifecycle import jobs
from pipeline.requests import application
from pipeline.requests.expansion import expand
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.storage import clients as clients_module
from pipeline.storage.clients import Clients
from worker.runner import Worker

_TABLE_KEY = re.compile(r"\(PartitionKey='[^']*',RowKey='[^']*'\)")


def kind_of(method: str, url: str, body: bytes | str | None) -> tuple[str, int]:
    """A storage request as the model's cost kind, with its units (a transaction's operations)."""
    path = url.split("?")[0]
    if "/messages" in path:
        return {"POST": "send", "GET": "receive", "DELETE": "delete", "PUT": "renew"}.get(method, method), 1
    if path.endswith("$batch"):
        text = body.decode(errors="replace") if isinstance(body, bytes) else (body or "")
        return "txn", max(1, text.count("Content-ID:"))
    if method == "GET":
        return ("get" if _TABLE_KEY.search(path) else "query"), 1
    return "update", 1


STAGES = "tests.stages_for_tests"  # the no-op stage, with the tests' other stand-ins
FLOOR_RUNS = 3  # the floor is the fastest of these: one run of ten seconds varies by a third

TILES = ["h08v04", "h08v05", "h09v04", "h09v05", "h10v04", "h10v05", "h11v04", "h11v05", "h12v04", "h12v05"]


def request_of(tasks: int) -> dict:
    """A MOD10A2 request over the ten tiles with at least ``tasks`` tasks (8-day periods)."""
    end = date(2001, 1, 1)
    while True:
        body = {"region": {"tiles": TILES}, "products": ["MOD10A2"], "start": "2001-01-01",
                "end": end.isoformat(), "email": "bench@example.org"}
        if len(expand(JobRequest.model_validate(body), 10**6)) >= tasks:
            return body
        end += timedelta(days=8)


def floor(connection: str, tasks: int, threads: int, window: int) -> dict:
    """Seconds for the minimal storage work of ``tasks`` tasks, as bagpipe batches it: rows
    created 100 to a transaction; at most ``window`` messages in the queue, as bagpipe's
    release keeps it (Azurite slows as a queue deepens), each drained one sending the next."""
    tables = TableServiceClient.from_connection_string(connection)
    queues = QueueServiceClient.from_connection_string(connection)
    table = tables.create_table(f"floor{tasks}")
    queue = queues.create_queue(f"floor{tasks}")
    keys = [f"{i:09d}" for i in range(tasks)]
    started = time.monotonic()
    for first in range(0, tasks, 100):
        table.submit_transaction([("create", {"PartitionKey": "job", "RowKey": k, "Status": "PENDING"})
                                  for k in keys[first:first + 100]])
    unsent = iter(keys[window:])
    lock = threading.Lock()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(queue.send_message, keys[:window], chunksize=16))

    def send_next() -> None:
        with lock:
            key = next(unsent, None)
        if key is not None:
            queue.send_message(key)

    def drain() -> int:
        done = 0
        while True:
            batch = list(queue.receive_messages(messages_per_page=32, max_messages=32, visibility_timeout=60))
            if not batch:
                with lock:
                    if unsent.__length_hint__() == 0:
                        return done
                time.sleep(0.05)  # the window is in other threads' hands
                continue
            for message in batch:
                for attempt in range(5):  # Azurite at full load resets the odd connection
                    try:
                        queue.delete_message(message)
                        table.update_entity({"PartitionKey": "job", "RowKey": message.content,
                                             "Status": "SUCCEEDED"}, mode=UpdateMode.MERGE)
                        break
                    except (ServiceResponseError, ServiceRequestError):
                        time.sleep(0.1 * 2**attempt)
                    except ResourceNotFoundError:
                        break  # deleted by the try whose answer was lost
                send_next()
                done += 1

    with ThreadPoolExecutor(threads) as pool:
        done = sum(pool.map(lambda _: drain(), range(threads)))
    seconds = time.monotonic() - started
    assert done == tasks, f"the floor run lost messages: {done} of {tasks}"
    return {"tasks": tasks, "threads": threads, "window": window, "seconds": round(seconds, 2),
            "tasks_per_s": round(tasks / seconds, 1)}


def submit_and_wait(http: httpx.Client, body: dict) -> tuple[int, str, float]:
    """Submit a job and poll until it ends: its task count, final state, and seconds from
    submit to its end. It polls the job list, not the job's status, which would weigh on
    the run."""
    started = time.monotonic()
    created = http.post("/api/jobs", json=body)
    created.raise_for_status()
    job, total = created.json()["job"], created.json()["total"]
    while (state := next(j["state"] for j in http.get("/api/jobs").json() if j["job"] == job)) not in (
            "SUCCEEDED", "FAILED", "CANCELLED"):
        time.sleep(0.2)
    return total, state, time.monotonic() - started


def bagpipe(azurite: Azurite, home: Path, body: dict, workers: int, slots: int, namespace: str, window: int,
            partitions: int = 0, per_message: int = 1) -> dict:
    with LocalStack(home, workers=workers, slots=slots, connection=azurite.connection_string, namespace=namespace,
                    overrides={"window": window, "tile_stage": "noop", "stage_modules": STAGES, "max_tasks": 100_000,
                               "partitions": partitions, "tasks_per_message": per_message}) as stack:
        stack.wait_for_workers()
        http = httpx.Client(base_url=stack.api_url, timeout=60, headers=stack.headers)
        total, state, seconds = submit_and_wait(http, body)
    return {"tasks": total, "workers": workers, "slots": slots, "partitions": partitions or "sized",
            "tasks_per_message": per_message, "state": state,
            "seconds": round(seconds, 2), "tasks_per_s": round(total / seconds, 1),
            "slot_ms_per_task": round(1000 * seconds * workers * slots / total, 1)}


@contextmanager
def running(settings: Settings, workers: int, slots: int, idle_sleep: float | None = None,
            sweep_every: float | None = None) -> Iterator[list[Worker]]:
    """The control loop and ``workers`` workers of ``slots`` slots on threads of this process
    while the block runs (idle and sweeping as deployed unless told otherwise)."""
    stop = threading.Event()
    idle = {} if idle_sleep is None else {"idle_sleep": idle_sleep}
    started = [Worker(settings, slots=slots, **idle) for _ in range(workers)]
    threads = [threading.Thread(target=control.run, args=(settings, stop), daemon=True,
                                kwargs=idle | ({} if sweep_every is None else {"sweep_every": sweep_every}))]
    threads += [threading.Thread(target=w.run, daemon=True) for w in started]
    for thread in threads:
        thread.start()
    try:
        yield started
    finally:
        stop.set()
        for worker in started:
            worker.stopping.set()
        for thread in threads:
            thread.join(60)


def calls_per_task(azurite: Azurite, body: dict, slots: int, window: int, per_message: int) -> dict:
    """Every storage request of one job, submission to SUCCEEDED, per task: the control loop
    and two workers in this process, each request counted by kind (``kind_of``)."""
    counted: Counter[str] = Counter()
    lock = threading.Lock()
    watching = threading.local()  # this thread's polls of the job are the benchmark's, not the job's

    def hook(request: object) -> None:
        if getattr(watching, "on", False):
            return
        http = request.http_request  # type: ignore[attr-defined]
        with lock:
            counted[kind_of(http.method, http.url, http.body)[0]] += 1

    settings = Settings(storage_connection=azurite.connection_string, namespace="calls", tile_stage="noop",
                        stage_modules=STAGES, window=window, max_tasks=100_000, tasks_per_message=per_message)
    Clients(settings).ensure_resources()
    clients_module.HOOKS["raw_request_hook"] = hook
    try:
        clients = Clients(settings)
        with running(settings, 2, slots):  # idle as deployed: a worker polls every 0.5 s
            counted.clear()
            job = application.submit(clients, JobRequest.model_validate(body)).job
            watching.on = True
            while not (state := jobs.get(clients, job).state).finished:
                time.sleep(0.2)
            with lock:
                found = dict(counted)
            total = jobs.get(clients, job).total
    finally:
        clients_module.HOOKS.pop("raw_request_hook", None)
    return {"tasks": total, "tasks_per_message": per_message, "state": state.value, "calls": sum(found.values()),
            "calls_per_task": round(sum(found.values()) / total, 2),
            "by_kind": {kind: round(n / total, 2) for kind, n in sorted(found.items())}}


@contextmanager
def fresh_azurite(home: Path) -> Iterator[Azurite]:
    azurite = Azurite(home / "azurite").start()
    try:
        yield azurite
    finally:
        azurite.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--window", type=int, default=256, help="BAGPIPE_WINDOW, and the floor's queue depth")
    parser.add_argument("--floor-threads", type=int, default=8, help="more only queue up on Azurite's one core")
    parser.add_argument("--partitions", type=int, nargs="+", default=[0],
                        help="BAGPIPE_PARTITIONS of each run (0: sized for the job's peak), side by side")
    parser.add_argument("--tasks-per-message", type=int, nargs="+", default=[Settings.tasks_per_message],
                        help="BAGPIPE_TASKS_PER_MESSAGE of each run, side by side (and its calls a task)")
    args = parser.parse_args()
    # Each measurement on an Azurite of its own, empty, as the floor's: in disk mode Azurite
    # rewrites every table it holds every five seconds, so one run's rows would slow the next.
    with tempfile.TemporaryDirectory() as tmp:
        floors = []
        for n in range(FLOOR_RUNS):
            with fresh_azurite(Path(tmp) / f"floor{n}") as azurite:
                floors.append(floor(azurite.connection_string, min(args.sizes), args.floor_threads, args.window))
        base = max(floors, key=lambda f: f["tasks_per_s"])
        print(f"floor: {base} (best of {[f['tasks_per_s'] for f in floors]})", flush=True)
        runs = []
        for size in args.sizes:
            body = request_of(size)
            for workers in args.workers:
                for parts in args.partitions:
                    for per in args.tasks_per_message:
                        name = f"s{size}w{workers}p{parts}m{per}"
                        with fresh_azurite(Path(tmp) / name) as azurite:
                            run = bagpipe(azurite, Path(tmp) / name, body, workers, args.slots, f"b{name}",
                                          args.window, parts, per)
                        print(f"{run['tasks']:>6} tasks {workers} workers × {args.slots}, partitions "
                              f"{run['partitions']}, {per} a message: {run['seconds']:>7} s {run['tasks_per_s']:>6} "
                              f"tasks/s  {run['slot_ms_per_task']:>6} slot-ms/task", flush=True)
                        runs.append(run)
        counted = []
        for per in args.tasks_per_message:
            with fresh_azurite(Path(tmp) / f"calls{per}") as azurite:
                counted.append(calls_per_task(azurite, request_of(min(args.sizes)), args.slots, args.window, per))
            print(f"{counted[-1]['tasks']:>6} tasks, {per} a message, every storage request counted: "
                  f"{counted[-1]['calls_per_task']} a task {counted[-1]['by_kind']}", flush=True)
        calls = min(counted, key=lambda c: c["calls_per_task"])
    best = {size: max(r["tasks_per_s"] for r in runs if abs(r["tasks"] - size) < 100) for size in args.sizes}
    small, large = min(args.sizes), max(args.sizes)
    print(json.dumps({
        "floor": base, "floor_runs": [f["tasks_per_s"] for f in floors], "runs": runs, "best_tasks_per_s": best,
        "ratio_to_floor": round(best[small] / base["tasks_per_s"], 2),
        "ratio_10k_to_1k": round(best[large] / best[small], 2),
        "overhead_ms_per_task": min(r["slot_ms_per_task"] for r in runs),
        "calls_per_task": calls["calls_per_task"], "calls_by_kind": calls["by_kind"],
        "calls_tasks_per_message": calls["tasks_per_message"],
        "calls_by_tasks_per_message": {str(c["tasks_per_message"]): c["calls_per_task"] for c in counted},
        "best_by_tasks_per_message": {str(m): max(r["tasks_per_s"] for r in runs if r["tasks_per_message"] == m)
                                      for m in args.tasks_per_message},
        "best_by_partitions": {str(p or "sized"): max(r["tasks_per_s"] for r in runs
                                                      if r["partitions"] == (p or "sized")) for p in args.partitions},
    }))


if __name__ == "__main__":
    main()
