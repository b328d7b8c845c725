"""A discrete-event model (simpy) of bagpipe running one job: its planner, releases, workers,
heartbeats, sweep and completion, their storage calls, and what bounds them — Azure
Storage's scalability targets in the cloud, one machine's CPU on the local stack.

What a task costs in storage is not written into the model's logic: it is the call table
(``bench.sim.calltable``; rows of ``bench.sim.core.Call``). The model runs each phase's rows
where the code runs them (a slot's claim and commit, a worker's look at its job, a
releaser's chunk, the lease's heartbeats, the sweep's pass, the planner, the finisher), so
that cutting or batching a row changes the prediction. Every storage target — a table
partition, a queue, a storage account — is a first-come-first-served server of its target
rate; calls that outrun it wait, as Azure's 503s and the SDK's back-off make them wait.

Long jobs stop after ``Scenario.simulate_tasks`` tasks and extrapolate the rest from the
steady rate; heartbeats and idle polling are credited to their targets in bulk. So a
2,000-worker job simulates in seconds. ``simulate(scenario)`` returns a ``Result``.
"""

from __future__ import annotations

import math
import random
from collections import Counter, defaultdict
from collections.abc import Generator

import simpy

from bench.sim.core import (
    ALL,
    BEAT,
    BLOB,
    FINISH,
    IDLE_SLEEP_S,
    JOB,
    LOOK,
    PLAN,
    QUEUE,
    RELEASE,
    RELEASE_CHUNK,
    RUNTIMES,
    SWEEP,
    TASK,
    Background,
    Call,
    Count,
    Result,
    Scenario,
    Server,
    amount,
    rounded,
)
from bench.sim.worker import Proc
from pipeline.lifecycle.progress import JOB_CHECK_S, NEAR_END
from pipeline.lifecycle.rollups import FOLD_IDLE_S

SEQUENTIAL_BATCH = 50  # calls made one after another are simulated this many per event (fewer if large)


class Model:
    """One run of a scenario."""

    def __init__(self, s: Scenario) -> None:
        self.s, self.env, self.rng = s, simpy.Environment(), random.Random(s.seed)
        self.accounts = [Server("storage account", f"account {a}", s.limits.account) for a in range(s.accounts)]
        self.parts = [Server("table partition", f"partition {p}", s.limits.partition) for p in range(s.partitions)]
        self.queues = [Server("queue", f"queue {q}", s.limits.queue) for q in range(s.shards)]
        self.singles = {t: Server(t, t, s.limits.partition) for t in (JOB, RUNTIMES)}
        self.by_phase: dict[str, list[Call]] = defaultdict(list)
        for call in s.calls:
            self.by_phase[call.phase].append(call)
        self.requests: Counter[str] = Counter()
        self.units: Counter[str] = Counter()
        self.stores = [simpy.Store(self.env) for _ in range(s.shards)]
        reductions = round(s.tasks * sum(k.share for k in s.kinds if k.reduction))
        self.tiles = s.tasks - reductions
        self.deps_left = [max(1, round(s.tiles_per_reduction))] * reductions
        self.released = self.done = self.reductions_released = self.replicas_started = 0
        self.releasing = self.window_full = self.finishing = False
        self.running = [0] * s.partitions  # attempts running per partition (they heartbeat)
        self.goal = min(s.tasks, s.simulate_tasks or s.tasks)
        self.finished = self.env.event()
        self.marks: list[tuple[float, int, dict[str, float], Counter[str], Counter[str], Counter[str]]] = []
        self.at_goal: tuple[float, float, int, float] = (0.0, 0.0, 0, 0.0)
        self.waiting: list[simpy.Event] = []  # idle workers waiting for a message
        self.live: set[Proc] = set()
        self.born: dict[Proc, float] = {}
        self.replica_seconds = self.function_seconds = self.plan_s = self.finish_s = 0.0
        self.core_busy = self.server_busy = self.slot_busy = 0.0
        self.count: Counter[str] = Counter()  # tasks ended per kind, released, seconds run: per-phase denominators
        self.phase_of = {c.op: c for c in s.calls}
        self.whole = {c.op for c in s.calls if c.phase in (PLAN, FINISH)}  # made for every task, even past the goal
        if s.cores:
            self.cores = simpy.PriorityResource(self.env, s.cores)  # others' processes first: they got their share
            self.server_thread = simpy.Resource(self.env, 1)
        self.control = Proc(self, -1)  # planner, sweep, finisher (and locally the API and control loop)

    # --- the call table ---------------------------------------------------------------------
    def quantities(self) -> dict[str, float]:
        s = self.s
        return {"writers": max(s.replicas, self.replicas_started) * s.slots + 2, "partitions": s.partitions,
                "tasks": s.tasks, "reductions": len(self.deps_left), "tiles_per_reduction": s.tiles_per_reduction,
                "pending_reductions": len(self.deps_left) - self.reductions_released, "slots": s.slots,
                "worker_tasks_per_s": s.slots / (s.mean_runtime + 0.03), "shards": s.shards,
                "tasks_per_message": s.tasks_per_message, "fold_window_s": FOLD_IDLE_S + s.monitor_interval_s}

    def amount(self, count: Count) -> float:
        return amount(count, self.quantities())

    def targets(self, target: str, task: int, units: float) -> list[tuple[Server, float]]:
        """The servers a call of ``units`` about ``task`` loads, with their share of it."""
        s = self.s
        if target == TASK:
            return [(self.parts[task % s.partitions], units), (self.accounts[task % s.partitions % s.accounts], units)]
        if target == ALL:
            share = units / s.partitions
            return [x for p, part in enumerate(self.parts)
                    for x in ((part, share), (self.accounts[p % s.accounts], share))]
        if target == QUEUE:
            return [(self.queues[task % s.shards], units), (self.accounts[task % s.shards % s.accounts], units)]
        if target == BLOB:
            return [(self.accounts[task % s.accounts], units)]
        return [(self.singles[target], units), (self.accounts[0], units)]

    def call(self, proc: Proc, op: str, cost_kind: str, target: str, task: int, units: float,
             repeat: int = 1, at_once: bool = False) -> Generator[simpy.Event, None, None]:
        """``repeat`` requests of ``units`` each by ``proc``: one after another, or at once."""
        cost = self.s.costs[cost_kind]
        self.requests[op] += repeat
        self.units[op] += units * repeat
        client = (cost.client_s + cost.client_per_unit * units) * repeat
        server = (cost.server_s + cost.server_per_unit * units) * repeat
        now = self.env.now
        if client and proc.gil is None:  # its own vCPUs: the GIL placed at once, no event
            proc.gil_free = max(now, proc.gil_free) + client
            done = proc.gil_free
        else:
            if client:
                yield from proc.cpu(client)
            now = done = self.env.now
        for srv, share in self.targets(target, task, units * repeat):
            done = max(done, srv.serve(now, share))
        if server and self.s.cores:
            with self.server_thread.request() as thread:
                yield thread
                with self.cores.request(priority=1) as core:
                    yield core
                    self.server_busy += server
                    self.core_busy += server
                    yield self.env.timeout(server)
        waits = 1 if at_once else repeat
        wait = (cost.wait.draw(self.rng) if waits == 1 else cost.wait.mean * waits) + cost.wait_per_unit * units * waits
        delay = max(0.0, done - self.env.now) + wait
        if delay > 0:
            yield self.env.timeout(delay)

    def phase(self, proc: Proc, phase: str, task: int, kind: str = "", times: float = 1.0,
              ) -> Generator[simpy.Event, None, None]:
        """Make the calls of ``phase`` (``times`` units of it) about ``task``."""
        for c in self.by_phase[phase]:
            if c.kinds and kind not in c.kinds:
                continue
            n = rounded(self.amount(c.per) * times, self.rng)
            units = self.amount(c.units)
            step = c.lanes if c.lanes > 1 else max(1, min(SEQUENTIAL_BATCH, int(SEQUENTIAL_BATCH * 20 / units)))
            for first in range(0, n, step):
                yield from self.call(proc, c.op, c.cost, c.target, task + first, units, min(step, n - first),
                                     at_once=c.lanes > 1)

    def credit(self, phase: str, task: int, times: float, units: float | None = None) -> None:
        """Count ``times`` units of ``phase`` and load their targets now, without waiting on
        them (heartbeats, idle polls: nobody waits for their answers); ``units`` per request
        if not the rows' own (an empty receive: 1)."""
        for c in self.by_phase[phase]:
            n = self.amount(c.per) * times
            units = self.amount(c.units) if units is None else units
            self.requests[c.op] += n
            self.units[c.op] += n * units
            for srv, share in self.targets(c.target, task, n * units):
                srv.serve(self.env.now, share)

    # --- the job ------------------------------------------------------------------------------
    def run(self) -> Result:
        s, env = self.s, self.env
        env.process(self.lifecycle())
        env.process(self.beats())
        if s.scale_out:
            env.process(self.keda())
        else:
            for r in range(s.replicas):
                self.start_replica(r, 0.0, None)
        for bg in s.background:
            env.process(self.background(bg))
        hogs = math.ceil(s.foreign_cores) if s.cores else 0
        for _ in range(hogs):
            env.process(self.foreign(s.foreign_cores / hogs))
        env.run(until=self.finished)
        return self.result()

    def start_replica(self, index: int, start: float, idle_s: float | None) -> None:
        proc = Proc(self, index)
        self.live.add(proc)
        self.born[proc] = self.env.now
        self.replicas_started += 1
        self.env.process(proc.replica(start, idle_s))

    def lifecycle(self) -> Generator[simpy.Event, None, None]:
        """The planner: rows created 100 to a transaction, one after another; then the first
        release; then the sweep every monitor interval."""
        started = self.env.now
        for first in range(0, self.s.tasks, 100):
            yield from self.phase(self.control, PLAN, first, times=min(100, self.s.tasks - first))
        self.plan_s = self.env.now - started
        self.function_seconds += self.plan_s
        yield from self.release(self.control)
        while self.done < self.goal:
            yield self.env.timeout(self.s.monitor_interval_s)
            started = self.env.now
            yield from self.phase(self.control, SWEEP, 0)
            yield from self.release(self.control)
            self.function_seconds += self.env.now - started

    def release(self, proc: Proc, min_room: float = 0.0) -> Generator[simpy.Event, None, None]:
        """planner.release: chunks of up to 64 tile tasks while the window has room; one
        releaser at a time (the others find its lease and go)."""
        if self.releasing:
            return
        self.releasing = True
        while self.released < self.tiles:
            room = self.s.window - (self.released - self.done)
            if room <= 0 or room < self.s.window * min_room:
                self.window_full = self.window_full or room <= 0
                break
            chunk = min(room, self.tiles - self.released, RELEASE_CHUNK)
            first = self.released
            yield from self.phase(proc, RELEASE, first, times=chunk)
            for task in range(first, first + chunk):
                self.put(task)
            self.released += chunk
            self.count["released"] += chunk
            min_room = 0.0
        self.releasing = False

    def put(self, task: int) -> None:
        self.stores[task % self.s.shards].put(task)
        if self.waiting:  # an idle worker finds it at its next poll
            self.env.process(self.wake(self.waiting.pop(0)))

    def wake(self, event: simpy.Event) -> Generator[simpy.Event, None, None]:
        yield self.env.timeout(self.rng.uniform(0.0, IDLE_SLEEP_S))
        if not event.triggered:
            event.succeed()

    def ended(self, proc: Proc, task: int, kind: object) -> Generator[simpy.Event, None, None]:
        """progress.Watch.task_ended: the task counted; its reduction released if it was the
        reduction's last tile; the job looked at (at most every second, after every task
        once all are released and its last look saw no more than NEAR_END unended) and its
        window topped up."""
        self.done += 1
        if self.done in (self.goal // 2, self.goal):
            self.marks.append((self.env.now, self.done, self.snapshot(), Counter(self.requests), Counter(self.units),
                               Counter(self.count)))
        if self.done >= self.goal and not self.finishing:
            self.finishing = True
            alive = self.replica_seconds + sum(self.env.now - self.born[p] for p in self.live)
            self.at_goal = (self.env.now, alive, len(self.live), self.function_seconds - self.plan_s)
            self.env.process(self.finish())
        if self.deps_left and task < self.tiles:
            group = min(int(task // max(1.0, self.s.tiles_per_reduction)), len(self.deps_left) - 1)
            self.deps_left[group] -= 1
            if self.deps_left[group] == 0:
                yield from self.phase(proc, RELEASE, self.tiles + group)
                self.reductions_released += 1
                self.count["released"] += 1
                self.put(self.tiles + group)
        all_released = self.released >= self.tiles
        if (all_released and proc.unended_seen <= NEAR_END) or self.env.now - proc.looked >= JOB_CHECK_S:
            proc.looked, proc.unended_seen = self.env.now, self.s.tasks - self.done
            yield from self.phase(proc, LOOK, task)
            if not all_released:
                yield from self.release(proc, min_room=0.25)

    def finish(self) -> Generator[simpy.Event, None, None]:
        """The finisher lists every task row (the manifest) and writes its blobs."""
        started = self.env.now
        for first in range(0, self.s.tasks, 1000):
            yield from self.phase(self.control, FINISH, first, times=min(1000, self.s.tasks - first))
        self.finish_s = self.env.now - started
        self.function_seconds += self.finish_s
        self.finished.succeed()

    def beats(self) -> Generator[simpy.Event, None, None]:
        """Every running attempt heartbeats every third of the lease (worker.lease), credited
        each second to the partitions its tasks live in."""
        every = self.s.lease_s / 3
        while self.done < self.goal:
            yield self.env.timeout(1.0)
            for p, running in enumerate(self.running):
                if running:
                    self.credit(BEAT, p, running / every)

    def keda(self) -> Generator[simpy.Event, None, None]:
        scale = self.s.scale_out
        assert scale is not None
        while self.done < self.goal:
            visible = sum(len(store.items) for store in self.stores)
            wanted = min(scale.max_executions, self.s.replicas, math.ceil(visible / scale.queue_length))
            for _ in range(max(0, wanted - len(self.live))):
                self.start_replica(self.replicas_started, scale.start.draw(self.rng), scale.idle_s)
            yield self.env.timeout(scale.polling_s)

    def background(self, bg: Background) -> Generator[simpy.Event, None, None]:
        while self.done < self.goal:
            if bg.cpu_s:
                yield from self.control.cpu(bg.cpu_s)
            for kind, n in bg.calls:
                yield from self.call(self.control, bg.name, kind, JOB, 0, 1.0, n)
            yield self.env.timeout(bg.every_s)

    def foreign(self, share: float, tick: float = 0.01) -> Generator[simpy.Event, None, None]:
        """Another process on the machine, busy ``share`` of one core (as it was measured to
        be, contention and all), in bursts."""
        while self.done < self.goal:
            began = self.env.now
            with self.cores.request(priority=0) as core:
                yield core
                self.core_busy += tick * share
                yield self.env.timeout(tick * share)
            yield self.env.timeout(max(0.0, began + tick - self.env.now))

    # --- what it found ------------------------------------------------------------------------
    def snapshot(self) -> dict[str, float]:
        servers = [*self.parts, *self.queues, *self.accounts, *self.singles.values()]
        busy = {f"{srv.kind}|{srv.name}": srv.busy_by(self.env.now) for srv in servers}
        alive = self.replica_seconds + sum(self.env.now - self.born[p] for p in self.live)
        return busy | {"worker slots|all": self.slot_busy, "cpu cores|all": self.core_busy,
                       "Azurite|thread": self.server_busy, "slot seconds": alive * self.s.slots}

    def result(self) -> Result:
        s = self.s
        empty: Counter[str] = Counter()
        (t0, n0, b0, r0, u0, c0) = self.marks[0] if len(self.marks) > 1 else (0.0, 0, {}, empty, empty, empty)
        (t1, n1, b1, r1, u1, c1) = self.marks[-1]
        span = max(t1 - t0, 1e-9)
        rate = (n1 - n0) / span
        capacity = {"worker slots": (b1["slot seconds"] - b0.get("slot seconds", 0.0)) / span,
                    "cpu cores": float(s.cores or 1), "Azurite": 1.0}
        util: dict[str, float] = {}
        for key, busy in b1.items():
            kind = key.split("|")[0]
            if kind == "slot seconds":
                continue
            util[kind] = max(util.get(kind, 0.0), (busy - b0.get(key, 0.0)) / span / capacity.get(kind, 1.0))
        if not s.cores:
            util.pop("cpu cores", None)
            util.pop("Azurite", None)
        t_goal, alive, live, sweeps = self.at_goal
        left = s.tasks - self.goal
        extra_s = left / rate if left else 0.0
        seconds = t_goal + extra_s + self.finish_s
        grow, grow_units = Counter(self.requests), Counter(self.units)
        if left:  # the whole job makes what the steady window made per unit of each call's phase
            whole_job = {"": s.tasks, RELEASE: s.tasks, BEAT: s.tasks * s.mean_runtime, "time": seconds}
            window = {"": n1 - n0, RELEASE: c1["released"] - c0["released"],
                      BEAT: c1["run seconds"] - c0["run seconds"], "time": t1 - t0}
            for kind in s.kinds:
                whole_job[kind.name] = s.tasks * kind.share
                window[kind.name] = c1[kind.name] - c0[kind.name]
            for op in r1:
                if op not in self.whole:
                    call = self.phase_of.get(op)
                    per = ("time" if call is None or call.phase == SWEEP else
                           call.kinds[0] if call.kinds else call.phase if call.phase in (RELEASE, BEAT) else "")
                    scale = whole_job[per] / max(window[per], 1e-9)
                    grow[op], grow_units[op] = (r1[op] - r0[op]) * scale, (u1[op] - u0[op]) * scale
        ideal = s.replicas * s.slots / s.mean_runtime if s.mean_runtime else math.inf
        function_s = self.plan_s + self.finish_s + sweeps * (t_goal + extra_s) / max(t_goal, 1e-9)
        return Result(s.name, s.tasks, self.goal, seconds, rate, ideal, util, grow, grow_units,
                      alive + extra_s * live, function_s, self.plan_s, self.finish_s, self.window_full)


def simulate(scenario: Scenario) -> Result:
    return Model(scenario).run()
