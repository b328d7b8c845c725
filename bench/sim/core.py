"""The vocabulary of the scale model (``bench.sim.model``): durations, what a storage call costs,
the call table's rows, the workload, the platform, a scenario and its result, and the
fixed-rate servers that stand for Azure Storage's scalability targets.

A call-table row (:class:`Call`) says where the code makes a storage call (its phase: per
task before or after the stage, per receive, per heartbeat, per released task, per look at
the job, per sweep pass, per planned task, per task listed at completion), how many per
unit of that phase, how many entities or messages each carries, what it costs (a cost kind
measured on the local stack: ``bench.sim.scale_calibrate``) and what it loads (the task's
partition, every partition of the job, the job row, the runtimes partition, the task's
queue, blob storage). Counts may be numbers or functions of the run's quantities
(``writers``, ``reductions``, ``pending_reductions``, ``tiles_per_reduction``...).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

Count = float | Callable[[Mapping[str, float]], float]
# phases: where the code makes a call, and what its count is per
FETCH, CLAIM, END, LOOK, BEAT, RELEASE, SWEEP, PLAN, FINISH = (
    "per receive", "per task, before the stage", "per task, after the stage", "per look at the job",
    "per heartbeat", "per released task", "per sweep pass", "per planned task", "per task, at completion")
# targets: what a call loads
TASK, ALL, JOB, RUNTIMES, QUEUE, BLOB = (
    "task partition", "every partition", "job row", "runtimes partition", "queue", "blob")
# the code's own constants the model follows (pipeline.lifecycle.progress, worker.runner,
# pipeline.lifecycle.planner, pipeline.lifecycle.dispatch)
AHEAD_BELOW_S = 1.0  # receive ahead of free slots while attempts are shorter than this
IDLE_SLEEP_S = 0.5  # every shard empty: a worker waits this long
RELEASE_CHUNK = 64  # tasks released per move of the cursor


@dataclass(frozen=True)
class LogNormal:
    """A positive duration: ``median`` seconds, spread ``sigma`` (0: always the median)."""

    median: float
    sigma: float = 0.0

    @property
    def mean(self) -> float:
        return self.median * math.exp(self.sigma ** 2 / 2)

    def draw(self, rng: random.Random) -> float:
        return self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0)) if self.sigma else self.median


@dataclass(frozen=True)
class Cost:
    """One storage call of a kind: the caller's CPU, the storage server's CPU (Azurite; zero
    on Azure, whose limits are its targets), each plus a part per entity or message, and the
    rest of the round trip (network, service, I/O), a wait that costs no CPU."""

    client_s: float
    server_s: float = 0.0
    wait: LogNormal = LogNormal(0.0)
    client_per_unit: float = 0.0
    server_per_unit: float = 0.0
    wait_per_unit: float = 0.0


@dataclass(frozen=True)
class Call:
    """One row of the call table: ``per`` requests per unit of ``phase``, each of ``units``
    entities or messages, costed as ``cost``, loading ``target``; only for tasks of
    ``kinds`` if given. ``lanes``: requests made at once (the release's concurrent sends)."""

    op: str
    cost: str
    target: str
    phase: str
    per: Count = 1.0
    units: Count = 1.0
    kinds: tuple[str, ...] = ()
    lanes: int = 1


@dataclass(frozen=True)
class TaskKind:
    name: str
    share: float  # of the job's tasks
    runtime: LogNormal
    reduction: bool = False  # released when its tile tasks have ended


@dataclass(frozen=True)
class Limits:
    """Scalability targets in units (entities, messages, requests) per second."""

    partition: float = math.inf  # entities per table partition
    queue: float = math.inf  # messages per queue
    account: float = math.inf  # requests (an entity or a message each) per storage account


@dataclass(frozen=True)
class ScaleOut:
    """Container Apps Job executions started by KEDA's queue scaler (its default strategy:
    every ``polling_s``, ``ceil(visible messages / queue_length)`` less those running, at
    most ``max_executions``); each takes ``start`` to come up and exits after ``idle_s``
    with nothing to do (infra/bicep/modules/workers.bicep)."""

    polling_s: float = 10.0
    queue_length: int = 2
    max_executions: int = 100
    start: LogNormal = LogNormal(30.0, 0.3)
    idle_s: float = 60.0


@dataclass(frozen=True)
class Background:
    """Other periodic work on the machine (local stack): ``calls`` (cost kind, count) and
    ``cpu_s`` of the control process every ``every_s`` seconds."""

    name: str
    every_s: float
    calls: tuple[tuple[str, int], ...] = ()
    cpu_s: float = 0.0


@dataclass
class Scenario:
    name: str
    tasks: int
    replicas: int  # worker processes (Container Apps executions); with scale_out, the most at once
    slots: int
    kinds: tuple[TaskKind, ...]
    calls: tuple[Call, ...]
    costs: dict[str, Cost]
    limits: Limits = Limits()
    partitions: int = 1  # table partitions per job
    shards: int = 4
    accounts: int = 1
    window: int = 256
    lease_s: float = 30.0
    monitor_interval_s: float = 5.0
    cores: int | None = None  # shared by every process (local stack); None: each replica its own (Azure)
    foreign_cores: float = 0.0  # of those cores, kept busy on average by other processes on the machine
    stage: Cost = Cost(0.0)  # a stage's round trip beyond its runtime: the worker's side, the child's CPU
    task_cpu_s: float = 0.0  # the worker's own Python per task, beyond its storage calls
    background: tuple[Background, ...] = ()
    scale_out: ScaleOut | None = None
    tiles_per_reduction: float = 1.0
    simulate_tasks: int | None = None  # stop after this many, extrapolate the rest at the steady rate
    seed: int = 1
    tasks_per_message: int = 8  # BAGPIPE_TASKS_PER_MESSAGE

    @property
    def mean_runtime(self) -> float:
        return sum(k.share * k.runtime.mean for k in self.kinds)


@dataclass
class Result:
    scenario: str
    tasks: int
    simulated: int
    seconds: float  # the whole job, planning and completion included (extrapolated past ``simulated``)
    steady_tasks_per_s: float  # over the second half of the simulated tasks
    ideal_tasks_per_s: float  # every slot of the most replicas busy, nothing else
    utilization: dict[str, float]  # steady window: busy share of the busiest server of each kind
    requests: Counter[str] = field(default_factory=Counter)  # by operation, the whole job
    units: Counter[str] = field(default_factory=Counter)
    replica_seconds: float = 0.0  # worker executions alive (billed)
    function_seconds: float = 0.0  # planner, sweep passes, completion (billed)
    plan_s: float = 0.0
    finish_s: float = 0.0
    window_bound: bool = False  # the release window was full while slots waited

    @property
    def bottleneck(self) -> str:
        """What saturates first: a storage target (or the machine's CPU) at ≥ 85 % busy (a
        first-come-first-served server that busy already holds its callers back); else the
        workers when their slots are 90 % busy; else the release window or the overhead of
        each task (latency, the worker's own CPU)."""
        name, busy = self.busiest_limit
        if busy >= 0.85:
            return name
        if self.utilization.get("worker slots", 0.0) >= 0.9:
            return "workers"
        return "release window" if self.window_bound else "per-task overhead"

    @property
    def busiest_limit(self) -> tuple[str, float]:
        """The busiest of the servers that are not the workers, and how busy."""
        limits = {k: v for k, v in self.utilization.items() if k != "worker slots"}
        return max(limits.items(), key=lambda kv: kv[1], default=("", 0.0))

    def per_task(self) -> float:
        """Storage requests per task, all phases."""
        return sum(self.requests.values()) / self.tasks


class Server:
    """A first-come-first-served server of ``rate`` units per second; a request arriving now
    is placed at once (its start and end follow from those already placed)."""

    def __init__(self, kind: str, name: str, rate: float) -> None:
        self.kind, self.name, self.rate = kind, name, rate
        self.free_at = 0.0
        self.busy = 0.0

    def serve(self, now: float, units: float) -> float:
        """Place ``units`` arriving at ``now``; return when they are done."""
        if math.isinf(self.rate) or units <= 0:
            return now
        start = max(now, self.free_at)
        self.free_at = start + units / self.rate
        self.busy += units / self.rate
        return self.free_at

    def busy_by(self, now: float) -> float:
        """Seconds of work done by ``now`` (placed work still ahead of it not counted)."""
        return self.busy - max(0.0, self.free_at - now)


def amount(count: Count, quantities: Mapping[str, float]) -> float:
    return count(quantities) if callable(count) else count


def rounded(x: float, rng: random.Random) -> int:
    """``x`` as a whole number whose expectation is ``x``."""
    whole = math.floor(x)
    return whole + (rng.random() < x - whole)
