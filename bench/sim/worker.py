"""The scale model's processes that make storage calls: a worker replica with its slots
(``worker.runner.Worker`` step by step), and the control roles (planner, sweep, finisher,
the local stack's other loops), each with its CPU.

CPU: on a shared machine (``Scenario.cores``) a call's client part holds its process's GIL
and one of the cores; on Azure each replica has its own vCPUs and only its GIL is shared,
placed first-come-first-served without events.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import simpy

from bench.sim.core import AHEAD_BELOW_S, CLAIM, END, FETCH, IDLE_SLEEP_S, QUEUE, TaskKind

if TYPE_CHECKING:
    from bench.sim.model import Model


class Proc:
    """A process that makes calls: worker replica ``index`` ≥ 0, or a control role (< 0)."""

    def __init__(self, model: Model, index: int) -> None:
        self.m, self.index = model, index
        self.gil_free = 0.0
        self.looked = float("-inf")  # when it last read its job's row and counters
        self.unended_seen = float("inf")  # the job's tasks not ended at that look
        self.ahead: list[int] = []  # messages received and not yet handed to a slot
        self.free = 0  # free slots
        self.slot_free: simpy.Event | None = None
        self.recent: float | None = None  # moving mean of its attempts' times
        self.gil = simpy.Resource(model.env, 1) if model.s.cores else None

    def cpu(self, seconds: float) -> Generator[simpy.Event, None, None]:
        """Hold this process's GIL (and a core, on a shared machine) for ``seconds``."""
        env = self.m.env
        if self.gil is not None:
            with self.gil.request() as gil:
                yield gil
                with self.m.cores.request(priority=1) as core:
                    yield core
                    self.m.core_busy += seconds
                    yield env.timeout(seconds)
            return
        start = max(env.now, self.gil_free)
        self.gil_free = start + seconds
        yield env.timeout(self.gil_free - env.now)

    def replica(self, start: float = 0.0, idle_s: float | None = None) -> Generator[simpy.Event, None, None]:
        """Worker.run: receive for the free slots (ahead of them while attempts are short),
        hand messages to slots, wait when every shard is empty, exit when idle long enough."""
        m, env, s = self.m, self.m.env, self.m.s
        born = env.now
        yield env.timeout(start)
        self.free = s.slots
        shard, idle_since, empty = self.index, env.now, 0
        while m.done < m.goal:
            if self.free == 0:
                self.slot_free = env.event()
                yield self.slot_free
                continue
            if len(self.ahead) < self.free:
                extra = s.slots if self.recent is not None and self.recent < AHEAD_BELOW_S else 0
                got = yield from self.receive(shard % s.shards, self.free - len(self.ahead) + extra)
                shard += 1
                empty = 0 if got or self.ahead else empty + 1
                if empty:  # the next shard at once; a wait only once every shard was empty
                    if empty < s.shards:
                        continue
                    empty = 0
                    if self.free == s.slots and idle_s is not None and env.now - idle_since >= idle_s:
                        break
                    yield from self.idle()
                    continue
            while self.free and self.ahead:
                self.free -= 1
                env.process(self.slot(self.ahead.pop(0)))
            idle_since = env.now
        m.replica_seconds += env.now - born
        m.live.discard(self)

    def receive(self, shard: int, count: int) -> Generator[simpy.Event, None, int]:
        m = self.m
        fetch = m.by_phase[FETCH]
        for c in fetch:  # a receive returns at most its row's units (the service's 32)
            count = min(count, int(m.amount(c.units)))
        store = m.stores[shard]
        got = [store.items.pop(0) for _ in range(min(count, len(store.items)))]
        for c in fetch:
            yield from m.call(self, c.op, c.cost, QUEUE, shard, max(1, len(got)))
        self.ahead += got
        return len(got)

    def idle(self) -> Generator[simpy.Event, None, None]:
        """Every shard was empty: the worker polls them all every IDLE_SLEEP_S until a
        message comes. Waited as one event, the polls credited in bulk when it wakes."""
        m, env = self.m, self.m.env
        event = env.event()
        m.waiting.append(event)
        since = env.now
        yield event | env.timeout(60.0)
        if event in m.waiting:
            m.waiting.remove(event)
        polls = (env.now - since) / IDLE_SLEEP_S
        if polls >= 1:
            for shard in range(m.s.shards):
                m.credit(FETCH, shard, polls, units=1.0)
            if m.s.cores:  # on a shared machine the polls took CPU too
                cost = sum(m.s.costs[c.cost].client_s for c in m.by_phase[FETCH])
                yield from self.cpu(cost * polls * m.s.shards)

    def slot(self, task: int) -> Generator[simpy.Event, None, None]:
        """Worker.handle for one message: claim, run the stage, commit, delete, look at the job."""
        m, env, s = self.m, self.m.env, self.m.s
        began = env.now
        kind = self.kind_of(task)
        yield from m.phase(self, CLAIM, task, kind.name)
        if s.task_cpu_s:
            yield from self.cpu(s.task_cpu_s)
        part = task % s.partitions
        m.running[part] += 1
        if s.stage.client_s:
            yield from self.cpu(s.stage.client_s)
        if s.stage.server_s and s.cores:  # the stage process's own CPU: a core, not the GIL
            with m.cores.request(priority=1) as core:
                yield core
                m.core_busy += s.stage.server_s
                yield env.timeout(s.stage.server_s)
        runtime = kind.runtime.draw(m.rng) + s.stage.wait.draw(m.rng)
        yield env.timeout(runtime)
        m.running[part] -= 1
        m.count["run seconds"] += runtime
        m.count[kind.name] += 1
        yield from m.phase(self, END, task, kind.name)
        took = env.now - began
        m.slot_busy += took
        self.recent = took if self.recent is None else 0.8 * self.recent + 0.2 * took
        yield from m.ended(self, task, kind)
        self.free += 1
        if self.slot_free is not None and not self.slot_free.triggered:
            self.slot_free.succeed()

    def kind_of(self, task: int) -> TaskKind:
        """The task's kind: reductions after the tiles; tile kinds mixed by share."""
        kinds = self.m.s.kinds
        if task >= self.m.tiles:
            return next(k for k in kinds if k.reduction)
        tiles = [k for k in kinds if not k.reduction]
        pick = (task * 0.6180339887) % 1.0 * sum(k.share for k in tiles)
        for k in tiles:
            pick -= k.share
            if pick < 0:
                return k
        return tiles[-1]
