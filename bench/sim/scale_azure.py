"""``bench.scale``'s Azure part: ModisAzure's workload (200 workers) and ten times larger
(2,000 workers, a 1 M-task job) simulated on Azure Storage's documented targets, with the
platform's scale-out; where each saturates first; the partitions, shards and storage
accounts each needs; throughput curves; and what a million tasks cost."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from typing import Any

from bench.scale_report import Context, Part, hours, plt, save, table
from bench.sim import azure
from bench.sim.azure import LIMITS, MODIS_JOB_TASKS, MODIS_KINDS, SCALE_OUT, TILES_PER_REDUCTION
from bench.sim.calltable import PLANNED, TODAY
from bench.sim.core import ALL, TASK, Call, Cost, LogNormal, Result, Scenario, TaskKind
from bench.sim.model import simulate
from bench.sim.scale_local import local_costs
from pipeline.lifecycle import costs, partitions
from pipeline.lifecycle.costs import SLOTS
from pipeline.lifecycle.rollups import FOLD_IDLE_S
from pipeline.settings import Settings

HEADROOM = 0.5  # size targets so that none runs above half its rate at the job's steady rate
SIMULATED = 12_000  # tasks simulated of a long job (at least 4 a worker); the rest extrapolated
BIG = 1_000_000


def scenario(costs: dict[str, Cost], name: str, tasks: int, workers: int, calls: tuple[Call, ...] = TODAY,
             partitions: int = 1, shards: int = 4, accounts: int = 1, window: int = 256,
             kinds: tuple[TaskKind, ...] = MODIS_KINDS) -> Scenario:
    replicas = workers // SLOTS
    return Scenario(name, tasks, replicas, SLOTS, kinds, calls, costs, LIMITS, partitions, shards, accounts, window,
                    scale_out=replace(SCALE_OUT, max_executions=replicas), tiles_per_reduction=TILES_PER_REDUCTION,
                    simulate_tasks=min(tasks, max(SIMULATED, 4 * workers)))


def code_partitions(window: int, tasks: int) -> int:
    """The partitions the code gives a job of ``tasks`` under a release ``window``."""
    return partitions.buckets_for(Settings(storage_connection="UseDevelopmentStorage=true", window=window), tasks)


def needs(result: Result, s: Scenario) -> dict[str, int]:
    """Partitions, queue shards and storage accounts for none to run above HEADROOM of its
    target when every slot is busy (the load scaled from the simulated rate to that, and
    spread evenly over them)."""
    u, scale = result.utilization, result.ideal_tasks_per_s / max(result.steady_tasks_per_s, 1e-9)
    return {"partitions": max(1, math.ceil(u.get("table partition", 0.0) * scale * s.partitions / HEADROOM)),
            "shards": max(1, math.ceil(u.get("queue", 0.0) * scale * s.shards / HEADROOM)),
            "accounts": max(1, math.ceil(u.get("storage account", 0.0) * scale * s.accounts / HEADROOM))}


def row(r: Result, s: Scenario) -> list[Any]:
    u = r.utilization
    return [r.scenario, f"{s.replicas * s.slots:,}", f"{s.tasks:,}", s.window, s.partitions, s.shards, s.accounts,
            round(r.steady_tasks_per_s, 2), f"{r.steady_tasks_per_s / r.ideal_tasks_per_s:.0%}", hours(r.seconds),
            f"{u.get('table partition', 0):.0%}", f"{u.get('queue', 0):.0%}", f"{u.get('storage account', 0):.0%}",
            f"{u.get('job row', 0):.0%}", f"{u.get('runtimes partition', 0):.0%}", r.bottleneck,
            round(r.per_task(), 1)]


HEADERS = ("scenario", "workers", "tasks", "window", "partitions", "shards", "accounts", "tasks/s", "of ideal",
           "job time", "busiest partition", "busiest queue", "account", "job row", "runtimes partition",
           "saturates first", "storage requests/task")


def part(ctx: Context) -> Part:
    call_costs = azure.azure_costs(local_costs(ctx))
    kinds = {c.op: c.cost for c in (*TODAY, *PLANNED)}
    runs: list[tuple[Result, Scenario]] = []

    def run(s: Scenario) -> Result:
        result = simulate(s)
        print(f"{s.name}: {result.steady_tasks_per_s:.2f} tasks/s, {result.bottleneck}, "
              f"{ {k: round(v, 2) for k, v in result.utilization.items()} }", file=sys.stderr, flush=True)
        runs.append((result, s))
        return result

    big_window = 2 * 2000  # twice the slots: every slot fed, one receive ahead
    modis = run(scenario(call_costs, "ModisAzure (200 workers), today", MODIS_JOB_TASKS, 200,
                         partitions=code_partitions(256, MODIS_JOB_TASKS)))
    big = run(scenario(call_costs, "10× (2,000 workers), today", BIG, 2000, partitions=code_partitions(256, BIG)))
    big_w = run(scenario(call_costs, "10×, today, window 4,096", BIG, 2000, partitions=code_partitions(big_window, BIG),
                         window=big_window))
    probe = scenario(call_costs, "10×, the planned layout, window 4,096", BIG, 2000, PLANNED, window=big_window)
    planned = run(probe)
    sizes = needs(planned, probe)
    sized = scenario(call_costs, "10×, plan, sized", BIG, 2000, PLANNED, sizes["partitions"], sizes["shards"],
                     sizes["accounts"], window=big_window)
    final = run(sized)
    # curves: workers (ModisAzure mix), and partitions for one-second tasks where storage is the limit
    workers = (200, 1000, 2000, 5000)
    by_workers = {label: [simulate(scenario(call_costs, label, BIG, w, calls, parts or code_partitions(2 * w, BIG),
                                            window=2 * w)) for w in workers]
                  for label, calls, parts in (("today", TODAY, 0), ("plan, 1 partition", PLANNED, 1))}
    short = (TaskKind("one-second task", 1.0, LogNormal(1.0, 0.3)),)
    parts = (1, 2, 4, 8, 16)
    by_parts = {label: [simulate(scenario(call_costs, label, 200_000, 2000, calls, p, shards=max(4, p), accounts=a,
                                          window=4000, kinds=short)) for p in parts]
                for label, calls, a in (("plan, 1 account", PLANNED, 1), ("plan, 4 accounts", PLANNED, 4))}
    image = plot(ctx, workers, by_workers, parts, by_parts)
    cost_md, per_million = costs_section(final, kinds, "plan, sized")
    cost_today, _ = costs_section(big_w, kinds, "today, window 4,096")
    figures = {
        "modis_200_job_hours": round(modis.seconds / 3600, 1), "modis_200_saturates": modis.bottleneck,
        "x10_2000_job_hours_today": round(big.seconds / 3600, 1), "x10_2000_saturates_today": big.bottleneck,
        "x10_2000_job_hours_plan": round(final.seconds / 3600, 1), "x10_2000_saturates_plan": final.bottleneck,
        "x10_partitions_needed": sizes["partitions"], "x10_shards_needed": sizes["shards"],
        "x10_accounts_needed": sizes["accounts"], "x10_partitions_today": runs[2][1].partitions,
        "usd_per_million_tasks": round(per_million, 0),
    }
    markdown = f"""
## Azure: ModisAzure's workload, and ten times larger

The workload is ModisAzure's ({azure.PAPER}): up to 200 instances; of its
{azure.MODIS[0].value:,.0f} task executions (Table 2) {azure.MODIS[2].value} % reprojections and
{azure.MODIS[3].value} % reductions (source downloads, 4.57 %, are part of a bagpipe tile task);
a reprojection "several minutes" on a small instance, a normal execution "within 10 min". As
tasks here: a tile task (collection + reprojection) lognormal, median 4.5 min (mean
{MODIS_KINDS[0].runtime.mean / 60:.1f} min); a reduction median 2.75 min (mean
{MODIS_KINDS[1].runtime.mean / 60:.1f} min: see the sources below), depending on
{TILES_PER_REDUCTION:.2f} tile tasks (Table 2's ratio). A worker is a slot: a Container Apps
Job execution of {costs.REPLICA_VCPU:g} vCPU and {costs.REPLICA_GIB:g} GiB runs {SLOTS} (the
deployment's defaults), started by KEDA (polling every {SCALE_OUT.polling_s:g} s, one execution per
{SCALE_OUT.queue_length} visible messages, up to the scenario's workers), each up in a median
{SCALE_OUT.start.median:g} s (assumed). ModisAzure's job is the continental US over ten years:
585 K source files (ten years of the continental US) at 3–4 a tile task, {MODIS_JOB_TASKS:,} tasks with the reductions;
the larger one is a 1 M-task job on 2,000 workers. Long jobs are simulated for
{max(SIMULATED, 4 * 2000):,} tasks and extrapolated at the steady rate (the second half of those).
The caller's CPU per call is the local stack's (the same SDK code); the storage targets are
Azure's; call latencies are assumed (below).

{table(HEADERS, [row(r, s) for r, s in runs])}

What saturates first (the busiest server of each kind in the steady window: a storage target
at 85 % or more holds its callers back; otherwise the workers, when every slot is busy), the
first storage target to saturate as the workers grow (at how many times these workers, every
slot busy), and what loads the job's table partition(s), entities a task:

{chr(10).join(verdict(r, s) for r, s in runs)}

Sized for none to run above {HEADROOM:.0%} of its target with every slot busy, the planned layout
(`PLANNED` in `bench/sim/calltable.py`: counts from a bounded rollup, dependencies as counters,
claims and commits grouped per worker; a what-if, not code) needs **{sizes['partitions']}
partition(s), {sizes['shards']} queue shard(s) and {sizes['accounts']} storage account(s)** for
the 1 M-task job on 2,000 workers, and then takes **{hours(final.seconds)}**. The code as it is
spreads that job over **{runs[2][1].partitions} partitions** (as many as its peak needs, at most
its shard queues: `pipeline/lifecycle/partitions.py`), yet its busiest partition runs at
{runs[2][0].busiest_limit[1]:.0%} (what loads it: the verdicts above). A look at the job reads,
in every partition, the folded row and a row per writer that wrote there in the last
{FOLD_IDLE_S + runs[2][1].monitor_interval_s:g} s (the sweep folds the others: `rollups.fold`). While tasks take
minutes, few of 2,000 slots have written a given partition that lately; while they take a second, every
slot has, and the look reads a row per slot in every partition again, a load more partitions
do not spread: there the planned layout's bounded rollup is what is left.

The curves: throughput against workers for the ModisAzure mix (the window twice the slots),
and, where storage can be the limit — one-second tasks on 2,000 workers, the planned layout —
against table partitions per job (as many queue shards as partitions, at least 4):

{chr(10).join(f"- {label}: " + ", ".join(f"{p} → {r.steady_tasks_per_s:,.0f} tasks/s ({r.bottleneck})"
                                         for p, r in zip(parts, results, strict=True))
              for label, results in by_parts.items())}
- ModisAzure mix, by workers: {"; ".join(f"{label}: " + ", ".join(
    f"{w:,} → {r.steady_tasks_per_s:.2f} ({r.bottleneck})" for w, r in zip(workers, results, strict=True))
    for label, results in by_workers.items())}

{image}

{cost_md}

{cost_today}

{sources()}
"""
    return Part(figures, markdown)


def first_target(r: Result) -> tuple[str, float]:
    """The storage target that saturates first as workers are added, and at how many times
    the scenario's workers (its load scaled from the simulated rate to every slot busy)."""
    name, busy = r.busiest_limit
    at_full = busy * r.ideal_tasks_per_s / max(r.steady_tasks_per_s, 1e-9)
    return name, (1 / at_full if at_full else math.inf)


def partition_load(r: Result, s: Scenario, top: int = 3) -> str:
    """The calls that load the job's table partitions most: entities a task, and their share."""
    per = {c.op: r.units[c.op] / r.tasks for c in s.calls if c.target in (TASK, ALL) and r.units.get(c.op)}
    total = sum(per.values()) or 1.0
    best = sorted(per.items(), key=lambda kv: -kv[1])[:top]
    return "; ".join(f"{op} {n:,.1f} ({n / total:.0%})" for op, n in best)


def verdict(r: Result, s: Scenario) -> str:
    name, times = first_target(r)
    return (f"- **{r.scenario}**: saturates first: **{r.bottleneck}** — {r.steady_tasks_per_s:.2f} tasks/s, "
            f"{r.steady_tasks_per_s / r.ideal_tasks_per_s:.0%} of every slot busy; the job takes "
            f"{hours(r.seconds)}. First storage target: {name}, "
            f"{'saturated' if times <= 1.0 else f'at {times:,.1f}× these workers'}. Partition load: "
            f"{partition_load(r, s)}.")


def plot(ctx: Context, workers: tuple[int, ...], by_workers: dict[str, list[Result]], parts: tuple[int, ...],
         by_parts: dict[str, list[Result]]) -> str:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for label, results in by_workers.items():
        left.plot(workers, [r.steady_tasks_per_s for r in results], marker="o", label=label)
    first = next(iter(by_workers.values()))  # every slot busy with the mix: the same for every label
    left.plot(workers, [r.ideal_tasks_per_s for r in first], "k:", label="every slot busy")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xticks(list(workers), [f"{w:,}" for w in workers])
    left.minorticks_off()
    left.set_xlabel("workers (slots)")
    left.set_ylabel("tasks/s")
    left.set_title("ModisAzure mix (minutes per task)", fontsize=9)
    left.legend(fontsize=8)
    for label, results in by_parts.items():
        right.plot(parts, [r.steady_tasks_per_s for r in results], marker="o", label=label)
    right.set_xscale("log", base=2)
    right.set_xlabel("table partitions per job")
    right.set_ylabel("tasks/s")
    right.set_title("2,000 workers, one-second tasks", fontsize=9)
    right.legend(fontsize=8)
    return save(fig, ctx.docs, "scale-curves")


def costs_section(result: Result, kinds: dict[str, str], label: str) -> tuple[str, float]:
    """The cost of the 1 M-task job in storage transactions and compute, at public prices."""
    per_entity = azure.storage_cost(result, kinds, units_billed=True)
    per_request = azure.storage_cost(result, kinds, units_billed=False)
    executions = result.seconds / 5.0 * 2 + 3  # a sweep pass each monitor interval (orchestration + activity)
    compute = azure.compute_cost(result, executions)
    total = sum(per_entity.values()) + sum(compute.values())
    rows = [[f"storage: {k}", f"{v:,.2f}", f"{per_request[k]:,.2f}"] for k, v in per_entity.items()]
    rows += [[k, f"{v:,.2f}", f"{v:,.2f}"] for k, v in compute.items()]
    rows.append(["**total**", f"**{total:,.0f}**", f"**{sum(per_request.values()) + sum(compute.values()):,.0f}**"])
    md = f"""### What a million tasks cost ({label})

USD for the 1 M-task job as simulated ({hours(result.seconds)}, {result.replica_seconds / 3600:,.0f}
execution-hours of workers, {result.per_task():.1f} storage requests a task, where a job's estimate
assumes at most {costs.STORAGE_CALLS_PER_TASK}: `pipeline.lifecycle.costs.STORAGE_CALLS_PER_TASK`), at the prices
below; a transaction billed per entity, or per request (see the sources):

{table(("item", "USD (transactions per entity)", "USD (per request)"), rows)}

Compute is almost all of it: {MODIS_KINDS[0].runtime.mean / 60:.1f} minutes of a slot per tile task
is {costs.REPLICA_VCPU / SLOTS:g} vCPU and {costs.REPLICA_GIB / SLOTS:g} GiB for that long; the
storage transactions of a task cost a small fraction of a cent. Not counted: blob capacity
(GB-months of sources and tiles), egress, the free grants."""
    return md, total


def sources() -> str:
    figures = [*azure.TARGETS, *azure.ASSUMED, *costs.PRICES.values(), azure.FREE_GRANTS, azure.EGT_BILLING,
               *azure.MODIS]
    rows = [[f.what, f"{f.value:,g} {f.unit}".strip() if f.value else "", f.source,
             "yes" if f.confirmed else "**no**"] for f in figures]
    return f"""### Figures and their sources

{table(("figure", "value", "source", "confirmed on a stored page"), rows)}

Price list: {costs.PRICE_LIST}. This machine cannot reach Azure, so each rate was read in a
dated public copy of that list (named above); the queue price is derived from
pricing-calculator exports, not read; whether an
entity-group transaction is billed once or per entity is not confirmed on a Microsoft page."""
