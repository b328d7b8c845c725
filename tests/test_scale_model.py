"""The scale model's core (bench.sim.model): a storage target caps the job at its documented rate,
spreading over partitions and accounts lifts the cap, and a model given a system's own
per-call costs reproduces that system's rate. Small runs (a second or two each); the
large ones are the benchmark (``make bench NAME=scale``)."""

from __future__ import annotations

import math

import pytest

from bench.scale import spliced
from bench.sim.core import (
    CLAIM,
    END,
    FETCH,
    QUEUE,
    TASK,
    Call,
    Cost,
    Limits,
    LogNormal,
    Scenario,
    TaskKind,
)
from bench.sim.model import simulate
from bench.sim.scale_calibrate import Measured, fit

SHORT = (TaskKind("short", 1.0, LogNormal(0.01)),)
# a task's calls: one receive per batch of messages, a one-entity claim, a delete
CALLS = (
    Call("receive", "receive", QUEUE, FETCH, 1, 32),
    Call("claim", "txn", TASK, CLAIM),
    Call("delete", "delete", QUEUE, END),
)
QUICK = {"receive": Cost(0.0, wait=LogNormal(0.002)), "txn": Cost(0.0, wait=LogNormal(0.002)),
         "delete": Cost(0.0, wait=LogNormal(0.002))}


def crowd(limits: Limits, partitions: int = 1, accounts: int = 1, tasks: int = 1500) -> Scenario:
    """Many slots, short tasks, a wide window: only a storage target can hold them back."""
    return Scenario("crowd", tasks, replicas=25, slots=4, kinds=SHORT, calls=CALLS, costs=QUICK, limits=limits,
                    partitions=partitions, shards=8, accounts=accounts, window=10_000)


def test_unlimited_storage_lets_every_slot_work() -> None:
    result = simulate(crowd(Limits()))
    # 100 slots, each task 10 ms of stage and three 2 ms calls: far above any target below
    assert result.steady_tasks_per_s > 1_500
    assert result.bottleneck != "table partition"


def test_a_single_partition_saturates_at_its_target() -> None:
    result = simulate(crowd(Limits(partition=100)))
    assert result.steady_tasks_per_s == pytest.approx(100, rel=0.05)
    assert result.utilization["table partition"] > 0.95
    assert result.bottleneck == "table partition"


def test_partitions_lift_the_cap_until_the_account_binds() -> None:
    four = simulate(crowd(Limits(partition=100), partitions=4, tasks=3000))
    assert four.steady_tasks_per_s == pytest.approx(400, rel=0.05)
    # each task loads the account with its entity, its delete and its share of a receive
    account = 600.0
    capped = simulate(crowd(Limits(partition=100, account=account), partitions=4, tasks=3000))
    units_per_task = sum(capped.units.values()) / capped.tasks
    assert capped.bottleneck == "storage account"
    assert capped.steady_tasks_per_s == pytest.approx(account / units_per_task, rel=0.08)
    two_accounts = simulate(crowd(Limits(partition=100, account=account), partitions=4, accounts=2, tasks=3000))
    assert two_accounts.steady_tasks_per_s > 1.4 * capped.steady_tasks_per_s


def test_a_model_given_a_systems_own_costs_reproduces_its_rate() -> None:
    """A system of known per-call costs — measured as bench.sim.scale_calibrate measures them,
    at two sizes for a transaction — whose rate follows in closed form: one worker, one
    slot, one task at a time, so a task takes the sum of its calls and its stage."""
    truth = {"receive": Measured(100, wall=0.004, client=0.001, server=0.001),
             "txn x1": Measured(100, wall=0.006, client=0.002, server=0.001),
             "txn x100": Measured(10, wall=0.105, client=0.050, server=0.030),
             "delete": Measured(100, wall=0.003, client=0.001, server=0.0005)}
    costs = fit({"get": truth["delete"], "update": truth["delete"], "send": truth["delete"],
                 "delete": truth["delete"], "renew": truth["delete"], "txn x1": truth["txn x1"],
                 "txn x100": truth["txn x100"], "query x1": truth["delete"], "query x64": truth["delete"],
                 "receive x1": truth["receive"], "receive x32": truth["receive"]})
    exact = {kind: Cost(c.client_s, c.server_s, LogNormal(c.wait.median), c.client_per_unit, c.server_per_unit,
                        c.wait_per_unit) for kind, c in costs.items()}  # no spread: a closed form to compare
    calls = (Call("receive", "receive", QUEUE, FETCH, 1, 1), Call("claim", "txn", TASK, CLAIM, 1, 4),
             Call("delete", "delete", QUEUE, END))
    stage = 0.005
    s = Scenario("one slot", 400, replicas=1, slots=1, kinds=(TaskKind("t", 1.0, LogNormal(stage)),), calls=calls,
                 costs=exact, cores=2)
    # the transaction of 4 entities, from the line through the two measured sizes
    txn4 = 0.006 + (0.105 - 0.006) * 3 / 99
    per_task = truth["receive"].wall + txn4 + truth["delete"].wall + stage
    assert math.isclose(simulate(s).steady_tasks_per_s, 1 / per_task, rel_tol=0.02)


def test_shared_cores_bound_the_local_stack() -> None:
    """On one machine the workers' CPU is the limit: eight single-slot workers whose
    tasks need 4 ms of CPU each on one core make 250 tasks/s, whatever their waits."""
    cpu = {"receive": Cost(0.0), "txn": Cost(0.002, wait=LogNormal(0.01)), "delete": Cost(0.002)}
    s = Scenario("one core", 2000, replicas=8, slots=1, kinds=(TaskKind("noop", 1.0, LogNormal(0.0)),),
                 calls=CALLS, costs=cpu, window=10_000, cores=1)
    result = simulate(s)
    assert result.steady_tasks_per_s == pytest.approx(250, rel=0.05)
    assert result.bottleneck == "cpu cores"



def test_a_run_of_some_parts_updates_only_their_sections_of_the_document() -> None:
    document = "# Scale\n\nintro\n\n## A\n\nold a\n\n### A's detail\n\nkept\n\n## B\n\nold b\n\n" \
               "_The whole benchmark took 5 s on this machine._\n"
    updated = spliced(document, ["## A\n\nnew a\n", "## C\n\nnew c\n"])
    assert "old a" not in updated and "kept" not in updated  # a section is replaced whole, subsections too
    assert updated.index("new a") < updated.index("old b") < updated.index("new c")  # in place; new ones last
    assert updated.startswith("# Scale\n\nintro") and updated.rstrip().endswith("on this machine._")
