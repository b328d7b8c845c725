"""Calibration of the scale model on the local stack, and the local run it must predict.

Every figure is measured here, one kind at a time, on an Azurite of its own (as
``bench.throughput`` measures its floor), with the SDK clients the code uses:

- each kind of storage call, one after another: its wall time, the caller's CPU
  (``time.process_time``) and Azurite's CPU (``/proc``), at two sizes where a call carries
  many entities or messages (a transaction of 1 and 100 operations, a query of 1 and 64
  rows, a receive of 1 and 32 messages), fitted to a base and a part per unit;
- a stage's round trip through a warm ``StageProcess`` (no-op): the worker's CPU, the
  stage process's CPU, the rest of its wall time;
- one worker driven in-process (``Worker.run_once``) over no-op tasks, its storage calls
  counted by the SDK's request hook: what a task costs it beyond those calls;
- on the running local stack before its job: the benchmark's own poll of the job list.

Then bagpipe itself runs a no-op job (as ``bench.throughput`` runs it) and the model,
configured with these costs and the machine's cores, predicts its rate.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from azure.data.tables import UpdateMode

from bagpipe.stack import LocalStack
from bench.sim.core import Cost, LogNormal
from bench.throughput import fresh_azurite, kind_of, request_of, submit_and_wait
from pipeline.lifecycle import planner
from pipeline.requests import application
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.storage import clients as clients_module
from pipeline.storage.clients import clients_for

TICK = os.sysconf("SC_CLK_TCK")
PART = "calibration"
STAGES = "tests.stages_for_tests"  # the no-op stage
SPREAD = 0.3  # the spread given to measured waits (lognormal sigma): the medians are what was measured


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and every process under it, now."""
    total, parents = 0.0, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK)
    wanted = {pid}
    changed = True
    while changed:
        grown = wanted | {p for p, (ppid, _) in parents.items() if ppid in wanted}
        changed, wanted = grown != wanted, grown
    for p in wanted:
        total += parents.get(p, (0, 0.0))[1]
    return total


def own_cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` alone (every thread), now."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_cpu() -> float:
    """CPU seconds every core of the machine has been busy, now."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / TICK


def speed_sample() -> float:
    """CPU seconds this thread takes for a fixed piece of pure-Python work: the machine's
    speed now (slower while other processes share its cores' execution units)."""
    started = time.thread_time()
    total = 0
    for i in range(30_000):
        total += i * i
    return time.thread_time() - started


class SpeedProbe:
    """Samples the machine's speed every ``every`` seconds on a thread of its own."""

    def __init__(self, every: float = 0.2) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.samples.append(speed_sample())

    def __enter__(self) -> SpeedProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


@dataclass
class Measured:
    """Per call: wall, caller CPU, storage server CPU (seconds)."""

    calls: int
    wall: float
    client: float
    server: float
    speed: float = 0.0  # the machine's speed sample (speed_sample) just before
    quick: float | None = None  # the quickest tenth's wall time (10th percentile)

    @property
    def wait(self) -> float:
        """The rest of the round trip, no CPU's: from the quickest tenth of the calls, since on
        a shared machine the others also waited for a core, a wait the model makes itself."""
        wall = self.wall if self.quick is None else self.quick
        return max(0.0, wall - self.client - self.server)

    def row(self) -> dict[str, float]:
        return {"calls": self.calls, "wall_ms": round(self.wall * 1e3, 2), "client_cpu_ms": round(self.client * 1e3, 2),
                "azurite_cpu_ms": round(self.server * 1e3, 2), "wait_ms": round(self.wait * 1e3, 2)}


def measure(fn: Callable[[int], Any], n: int, server_pid: int, warm: int = 10) -> Measured:
    """Call ``fn(i)`` ``n`` times one after another (after ``warm`` unmeasured calls)."""
    for i in range(warm):
        fn(n + i)
    speed = statistics.median(speed_sample() for _ in range(5))
    walls: list[float] = []
    wall, cpu, server = time.perf_counter(), time.process_time(), tree_cpu(server_pid)
    for i in range(n):
        began = time.perf_counter()
        fn(i)
        walls.append(time.perf_counter() - began)
    quick = statistics.quantiles(walls, n=10)[0] if n >= 10 else None
    return Measured(n, (time.perf_counter() - wall) / n, (time.process_time() - cpu) / n,
                    (tree_cpu(server_pid) - server) / n, speed, quick)


def settings_for(connection: str, namespace: str, **more: Any) -> Settings:
    return Settings(storage_connection=connection, namespace=namespace, tile_stage="noop", stage_modules=STAGES,
                    window=100_000, max_tasks=100_000, **more)


def per_call(connection: str, server_pid: int, n: int = 200) -> dict[str, Measured]:
    """Each kind of call the code makes, timed alone."""
    clients = clients_for(settings_for(connection, "cal"))
    clients.ensure_resources()
    table, queue = clients.tasks, clients.shard_queues[0]
    keys = [f"{i:09d}" for i in range(2 * n + 200)]
    for first in range(0, len(keys), 100):
        table.submit_transaction([("upsert", {"PartitionKey": PART, "RowKey": k, "Status": "PENDING"})
                                  for k in keys[first:first + 100]])

    def row(i: int, status: str = "QUEUED") -> dict[str, Any]:
        return {"PartitionKey": PART, "RowKey": keys[i % len(keys)], "Status": status}

    def txn(size: int) -> Callable[[int], Any]:
        return lambda i: table.submit_transaction(
            [("upsert", row((i * size + j) % len(keys)), {"mode": UpdateMode.MERGE}) for j in range(size)])

    def query(size: int) -> Callable[[int], Any]:
        def run(i: int) -> list[Any]:
            lo = (i * size) % (len(keys) - size)
            return list(table.query_entities("PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi",
                                             parameters={"pk": PART, "lo": keys[lo], "hi": keys[lo + size]}))
        return run

    found: dict[str, Measured] = {
        "get": measure(lambda i: table.get_entity(PART, keys[i % len(keys)]), n, server_pid),
        "update": measure(lambda i: table.update_entity(row(i, "RUNNING"), mode=UpdateMode.MERGE), n, server_pid),
        "txn x1": measure(txn(1), n, server_pid),
        "txn x4": measure(txn(4), n, server_pid),
        "txn x100": measure(txn(100), n // 10, server_pid, warm=2),
        "query x1": measure(query(1), n, server_pid),
        "query x64": measure(query(64), n // 2, server_pid),
        "send": measure(lambda i: queue.send_message(b'{"job": "x", "task": "000000001", "attempt": 1}'),
                        2 * n, server_pid),
    }
    held: list[Any] = []
    found["receive x1"] = measure(lambda i: held.extend(queue.receive_messages(max_messages=1, messages_per_page=1,
                                                                               visibility_timeout=60)), n, server_pid)
    found["renew"] = measure(lambda i: held.__setitem__(i, _renewed(queue, held[i])), n, server_pid, warm=0)
    found["delete"] = measure(lambda i: queue.delete_message(held[i]), n, server_pid, warm=0)
    found["receive x32"] = measure(lambda i: list(queue.receive_messages(max_messages=32, messages_per_page=32,
                                                                         visibility_timeout=60)), 6, server_pid, warm=0)
    clients.close()
    return found


def _renewed(queue: Any, message: Any) -> Any:
    receipt = queue.update_message(message.id, pop_receipt=message.pop_receipt, visibility_timeout=60)
    message.pop_receipt = receipt.pop_receipt
    return message


def _linear(small: Measured, big: Measured, units: tuple[int, int]) -> Cost:
    """A cost with a per-unit part, from measurements at ``units`` (small, big)."""
    (a, b) = units

    def slope(field: str) -> float:
        return max(0.0, (getattr(big, field) - getattr(small, field)) / (b - a))

    per_client, per_server, per_wait = slope("client"), slope("server"), slope("wait")
    return Cost(max(0.0, small.client - per_client * a), max(0.0, small.server - per_server * a),
                LogNormal(max(1e-5, small.wait - per_wait * a), SPREAD), per_client, per_server, per_wait)


def fit(found: dict[str, Measured]) -> dict[str, Cost]:
    """The model's cost kinds from the measurements."""
    def plain(m: Measured) -> Cost:
        return Cost(m.client, m.server, LogNormal(max(1e-5, m.wait), SPREAD))

    return {"get": plain(found["get"]), "update": plain(found["update"]), "send": plain(found["send"]),
            "delete": plain(found["delete"]), "renew": plain(found["renew"]),
            "txn": _linear(found["txn x1"], found["txn x100"], (1, 100)),
            "query": _linear(found["query x1"], found["query x64"], (1, 64)),
            "receive": _linear(found["receive x1"], found["receive x32"], (1, 32)),
            "blob": Cost(0.0)}


def stage_round_trip(connection: str, n: int = 100) -> Measured:
    """A no-op stage through a warm stage process: the worker's CPU, the stage process's."""
    from worker.child import StageProcess

    process = StageProcess(settings_for(connection, "stage"), tasks=n + 20)
    context = {"job": "j", "part": "j", "task": "000000001", "attempt": 1, "params": {}, "output_prefix": "x/"}

    def once(i: int) -> None:
        process.start("noop", context)
        while process.poll(0.2) is None:
            pass

    try:
        return measure(once, n, process.process.pid)
    finally:
        process.close()


def worker_per_task(connection: str, server_pid: int, costs: dict[str, Cost], n: int = 200,
                    ) -> tuple[Measured, Counter[str], float]:
    """One worker run in-process over ``n`` no-op tasks, one at a time: the whole per-task
    cost, its calls counted by kind, and what it spends beyond them (seconds of its CPU)."""
    from worker.runner import Worker

    counted: Counter[str] = Counter()
    live = {"on": False}

    def hook(request: Any) -> None:
        if live["on"]:
            http = request.http_request
            kind, units = kind_of(http.method, http.url, http.body)
            counted[kind] += 1
            counted[f"{kind} units"] += units

    clients_module.HOOKS["raw_request_hook"] = hook
    try:
        settings = settings_for(connection, "wrk")
        clients = clients_for(settings)
        clients.ensure_resources()
        job = application.submit(clients, JobRequest.model_validate(request_of(n))).job
        planner.plan(clients, job)
        worker = Worker(settings, slots=1)
        worker.warm()
        live["on"] = True
        total = measure(lambda i: worker.run_once(), n, server_pid, warm=0)
        live["on"] = False
        worker.close()
        clients.close()
    finally:
        clients_module.HOOKS.pop("raw_request_hook", None)
    calls = sum(counted[k] / n * (costs[k].client_s + costs[k].client_per_unit * counted[f"{k} units"] / counted[k])
                for k in costs if counted[k])
    return total, counted, calls


def local_run(tmp: Path, tasks: int, workers: int, slots: int, window: int) -> dict[str, Any]:
    """bagpipe's no-op rate, submit to SUCCEEDED (as bench.throughput times it), on an
    Azurite of its own; before the job, the cost of the benchmark's own poll of the job
    list; during it, the CPU each process class spent per task."""
    body = request_of(tasks)
    with fresh_azurite(tmp / "run") as azurite, LocalStack(
            tmp / "run", workers=workers, slots=slots, connection=azurite.connection_string, namespace="scale",
            overrides={"window": window, "tile_stage": "noop", "stage_modules": STAGES, "max_tasks": 100_000}) as stack:
        assert azurite.process is not None
        stack.wait_for_workers()
        http = httpx.Client(base_url=stack.api_url, timeout=60, headers=stack.headers)
        poll = measure(lambda i: http.get("/api/jobs").raise_for_status(), 20, azurite.process.pid, warm=3)
        pids = {"Azurite": azurite.process.pid} | {f"worker {i}": p.pid for i, p in enumerate(stack.worker_processes)}
        before = {name: tree_cpu(pid) for name, pid in pids.items()} | {"benchmark process": own_cpu(os.getpid())}
        machine = machine_cpu()
        with SpeedProbe() as probe:
            total, state, seconds = submit_and_wait(http, body)
        spent = {name: tree_cpu(pid) - before[name] for name, pid in pids.items()}
        spent["benchmark process"] = own_cpu(os.getpid()) - before["benchmark process"]
        foreign = machine_cpu() - machine - sum(spent.values())
        http.close()
    workers_cpu = sum(v for k, v in spent.items() if k.startswith("worker"))
    return {"tasks": total, "workers": workers, "slots": slots, "window": window, "state": state,
            "seconds": round(seconds, 2), "tasks_per_s": round(total / seconds, 1), "poll": poll,
            "cpu_ms_per_task": {"workers": round(1e3 * workers_cpu / total, 2),
                                "benchmark process": round(1e3 * spent["benchmark process"] / total, 2),
                                "Azurite": round(1e3 * spent["Azurite"] / total, 2)},
            "cpu_busy_share": round(sum(spent.values()) / seconds / (os.cpu_count() or 1), 2),
            "foreign_cores": round(max(0.0, foreign) / seconds, 2), "speed": probe.median}

