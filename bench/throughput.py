"""Throughput of the local stack against the floor Azurite sets, side by side in one run.

The floor: the least storage work a task needs, done as bagpipe batches it (task rows
created 100 to a transaction, one message sent, received 32 at a time, deleted, one row
update; no more messages in the queue than bagpipe's window, as its release keeps it) by
eight threads (Azurite serves on one core: more only queue up), for the smaller job size.
Then bagpipe, submit to SUCCEEDED, for jobs of no-op tasks (``tile_stage=noop``) of about
1,000 and 10,000 tasks with 1, 2, 4 and 8 worker processes. Last line: one JSON object with
every figure, ``ratio_to_floor`` (bagpipe's best rate for the smaller job ÷ the floor) and
``ratio_10k_to_1k``.

    python -m bench.throughput [--sizes 1000 10000] [--workers 1 2 4 8] [--slots 4] [--window 256]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import date, timedelta
from pathlib import Path

import httpx
from azure.core.exceptions import ResourceNotFoundError, ServiceRequestError, ServiceResponseError
from azure.data.tables import TableServiceClient, UpdateMode
from azure.storage.queue import QueueServiceClient

from bagpipe.azurite import Azurite
from bagpipe.stack import LocalStack
from pipeline.lifecycle.request import JobRequest, expand

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


def bagpipe(azurite: Azurite, home: Path, body: dict, workers: int, slots: int, namespace: str, window: int) -> dict:
    with LocalStack(home, workers=workers, slots=slots, connection=azurite.connection_string, namespace=namespace,
                    overrides={"window": window, "tile_stage": "noop", "max_tasks": 100_000}) as stack:
        stack.wait_for_workers()
        http = httpx.Client(base_url=stack.api_url, timeout=60, headers=stack.headers)
        total, state, seconds = submit_and_wait(http, body)
    return {"tasks": total, "workers": workers, "slots": slots, "state": state,
            "seconds": round(seconds, 2), "tasks_per_s": round(total / seconds, 1),
            "slot_ms_per_task": round(1000 * seconds * workers * slots / total, 1)}


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
                with fresh_azurite(Path(tmp) / f"s{size}w{workers}") as azurite:
                    run = bagpipe(azurite, Path(tmp) / f"s{size}w{workers}", body, workers, args.slots,
                                  f"b{size}w{workers}", args.window)
                print(f"{run['tasks']:>6} tasks {workers} workers × {args.slots}: {run['seconds']:>7} s "
                      f"{run['tasks_per_s']:>6} tasks/s  {run['slot_ms_per_task']:>6} slot-ms/task", flush=True)
                runs.append(run)
    best = {size: max(r["tasks_per_s"] for r in runs if abs(r["tasks"] - size) < 100) for size in args.sizes}
    small, large = min(args.sizes), max(args.sizes)
    print(json.dumps({
        "floor": base, "floor_runs": [f["tasks_per_s"] for f in floors], "runs": runs, "best_tasks_per_s": best,
        "ratio_to_floor": round(best[small] / base["tasks_per_s"], 2),
        "ratio_10k_to_1k": round(best[large] / best[small], 2),
        "overhead_ms_per_task": min(r["slot_ms_per_task"] for r in runs),
    }))


if __name__ == "__main__":
    main()
