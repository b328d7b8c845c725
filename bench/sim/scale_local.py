"""``bench.scale``'s calibration part: the model configured with the costs measured on the
local stack (``bench.sim.scale_calibrate``) predicts bagpipe's no-op rate there, measured in the
same benchmark run; ``sim_vs_local`` = predicted ÷ measured.

This machine is shared (others' test runs come and go), so two things of the moment are
measured with the run and given to the model: the CPU other processes keep busy
(``/proc/stat`` less this run's processes), and the machine's speed — the CPU time a fixed
piece of Python takes, sampled while each cost was measured and during the run (two
threads of a core slow each other down) — by which the costs are scaled to the run's.
"""

from __future__ import annotations

import os
import statistics
import sys
from dataclasses import replace
from typing import Any

from bench.scale_report import COST_HEADERS, Context, Part, cost_rows, plt, save, table
from bench.sim.calltable import TODAY
from bench.sim.core import Background, Cost, LogNormal, Scenario, TaskKind
from bench.sim.model import simulate
from bench.sim.scale_calibrate import (
    SPREAD,
    Measured,
    fit,
    local_run,
    per_call,
    stage_round_trip,
    worker_per_task,
)
from bench.throughput import fresh_azurite


def local_costs(ctx: Context) -> dict[str, Cost]:
    """The per-call costs, measured once per benchmark run (the parts share them)."""
    if "costs" not in ctx.shared:
        with fresh_azurite(ctx.tmp / "calls") as azurite:
            assert azurite.process is not None
            ctx.shared["measured"] = per_call(azurite.connection_string, azurite.process.pid)
            ctx.shared["costs"] = fit(ctx.shared["measured"])
    return dict(ctx.shared["costs"])


def at_speed(cost: Cost, factor: float) -> Cost:
    """``cost`` with its CPU parts scaled by ``factor`` (the machine slower by that much)."""
    return replace(cost, client_s=cost.client_s * factor, server_s=cost.server_s * factor,
                   client_per_unit=cost.client_per_unit * factor, server_per_unit=cost.server_per_unit * factor)


def local_scenario(run: dict[str, Any], costs: dict[str, Cost], stage: Cost, task_cpu_s: float) -> Scenario:
    """The local run as the model sees it: the machine's cores shared by the workers, the
    benchmark's process (API, planner, sweep, finisher, its job-list poll every 0.2 s, the
    control loop's poll of the plan and done queues every 0.2 s), Azurite and the machine's
    other processes."""
    poll: Measured = run["poll"]
    costs = costs | {"job list": Cost(poll.client, poll.server, LogNormal(max(1e-5, poll.wait), SPREAD))}
    return Scenario(
        "local no-op", run["tasks"], run["workers"], run["slots"], (TaskKind("noop", 1.0, LogNormal(0.0)),),
        TODAY, costs, window=run["window"], cores=os.cpu_count() or 1, foreign_cores=run["foreign_cores"],
        stage=stage, task_cpu_s=task_cpu_s,
        background=(Background("control loop: plan and done queues", 0.2, (("receive", 2),)),
                    Background("benchmark: job list", 0.2, (("job list", 1),))))


def part(ctx: Context) -> Part:
    args = ctx.args
    costs = local_costs(ctx)
    found: dict[str, Measured] = ctx.shared["measured"]
    with fresh_azurite(ctx.tmp / "worker") as azurite:
        assert azurite.process is not None
        stage = stage_round_trip(azurite.connection_string)
        whole, counted, calls_cpu = worker_per_task(azurite.connection_string, azurite.process.pid, costs)
    calls_speed = statistics.median(m.speed for m in found.values())
    # the worker's own Python: its per-task CPU less its calls' (at the speed it ran at) and the stage's
    own = max(0.0, whole.client - calls_cpu * whole.speed / calls_speed - stage.client)
    runs, predictions = [], []
    for n in range(args.local_runs):  # each predicted with its own moment's load and speed
        run = local_run(ctx.tmp / f"run{n}", args.tasks, args.workers, args.slots, args.window)
        at_run = {kind: at_speed(c, run["speed"] / calls_speed) for kind, c in costs.items()}
        stage_cost = at_speed(Cost(stage.client, stage.server, LogNormal(max(1e-5, stage.wait), SPREAD)),
                              run["speed"] / stage.speed)
        result = simulate(local_scenario(run, at_run, stage_cost, own * run["speed"] / whole.speed))
        runs.append(run)
        predictions.append(run["tasks"] / result.seconds)
        print(f"local run {n + 1}: {({k: v for k, v in run.items() if k != 'poll'})}; predicted "
              f"{predictions[-1]:.1f} tasks/s", file=sys.stderr, flush=True)
    measured = statistics.mean(r["tasks_per_s"] for r in runs)
    predicted = statistics.mean(predictions)
    ratio = predicted / measured
    print(f"per call {({k: m.row() for k, m in found.items()})}; stage {stage.row()}; worker per task "
          f"{whole.row()}, its own {own * 1e3:.2f} ms; speed: calls {calls_speed * 1e3:.2f} ms, worker "
          f"{whole.speed * 1e3:.2f}", file=sys.stderr)
    print(f"predicted {predicted:.1f} tasks/s, measured {measured:.1f}: sim_vs_local {ratio:.2f}",
          file=sys.stderr, flush=True)
    image = plot(ctx, found, runs, predictions)
    per_task = {k: round(counted[k] / whole.calls, 2) for k in ("receive", "get", "query", "txn", "delete")}
    util = ", ".join(f"{k} {v:.0%} busy" for k, v in sorted(result.utilization.items(), key=lambda kv: -kv[1])
                     if v > 0.01)
    cores = os.cpu_count()
    markdown = f"""
## Calibration: the local stack, predicted

Each kind of storage call the code makes, made {found['get'].calls} times one after another
against an Azurite of its own (the SDK clients of `pipeline.storage.clients`; transactions on the
lean wire format of `pipeline.storage.transactions`): wall time, the caller's CPU, Azurite's CPU
(from `/proc`), and the rest of the round trip — taken from the quickest tenth of the calls
(their 10th-percentile wall time less the CPU), because on this shared machine the slower
calls also waited for a core, and the model makes that wait itself from the cores, their
other users and every process's CPU. Where a call carries many entities or messages it is
measured at two sizes and fitted to a base and a part per unit.

{table(('call', 'calls', 'wall ms', 'caller CPU ms', 'Azurite CPU ms', 'other wait ms'),
       [[k, m.calls, *list(m.row().values())[1:]] for k, m in found.items()])}

The model's cost kinds, fitted (at the speed the machine had then):

{table(COST_HEADERS, cost_rows(costs))}

A no-op stage's round trip through a warm stage process: {stage.wall * 1e3:.2f} ms
({stage.client * 1e3:.2f} ms of the worker's CPU, {stage.server * 1e3:.2f} ms of the stage
process's). One worker driven in-process over {whole.calls} no-op tasks, one at a time:
{whole.wall * 1e3:.1f} ms a task, {whole.client * 1e3:.1f} ms of its CPU and
{whole.server * 1e3:.1f} ms of Azurite's; the SDK's request hook counted per task
{', '.join(f'{v} {k}' for k, v in per_task.items())}; beyond those calls and the stage, the
worker's own Python costs {own * 1e3:.2f} ms a task. The benchmark's poll of the job list
(every 0.2 s while it waits): {run['poll'].client * 1e3:.1f} ms of its process's CPU and
{run['poll'].server * 1e3:.1f} ms of Azurite's.

Then bagpipe ran a job of {runs[0]['tasks']} no-op tasks (`tile_stage=noop`) on the local
stack, {args.workers} workers × {args.slots} slots, window {args.window}, timed from submission
to SUCCEEDED as `bench.throughput` times it, {len(runs)} times, each on an Azurite of its own.
This machine is shared (others' test runs come and go): during each run the CPU other
processes took (`/proc/stat` less this run's processes) and the machine's speed (the CPU
time of a fixed piece of Python, against {calls_speed * 1e3:.2f} ms while the calls were
measured and {whole.speed * 1e3:.2f} ms while the worker was; the costs are scaled by the
ratio) were measured, and the model was given them with the {cores} cores.

{table(('run', 'measured tasks/s', 'model tasks/s', 'model ÷ measured', 'workers CPU ms/task',
        'benchmark process ms/task', 'Azurite ms/task', 'other processes (cores)', 'speed probe ms'),
       [[n + 1, r['tasks_per_s'], round(p, 1), round(p / r['tasks_per_s'], 2), r['cpu_ms_per_task']['workers'],
         r['cpu_ms_per_task']['benchmark process'], r['cpu_ms_per_task']['Azurite'], r['foreign_cores'],
         round(r['speed'] * 1e3, 2)] for n, (r, p) in enumerate(zip(runs, predictions, strict=True))])}

Measured **{measured:.1f} tasks/s**, predicted **{predicted:.1f} tasks/s**: `sim_vs_local` =
**{ratio:.2f}** (predicted ÷ measured, means of the runs). In the model of the last run
**{result.bottleneck}** saturate(s) first ({util}): the workers' calls, Azurite's single
thread, the benchmark's own polling and the machine's other processes compete for the cores.

{image}
"""
    return Part({"sim_vs_local": round(ratio, 3), "sim_local_tasks_per_s": round(predicted, 1),
                 "local_tasks_per_s": round(measured, 1)}, markdown)


def plot(ctx: Context, found: dict[str, Measured], runs: list[dict[str, Any]], predictions: list[float]) -> str:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    kinds = list(found)
    client = [found[k].client * 1e3 for k in kinds]
    server = [found[k].server * 1e3 for k in kinds]
    left.barh(kinds, client, label="caller CPU")
    left.barh(kinds, server, left=client, label="Azurite CPU")
    left.barh(kinds, [found[k].wait * 1e3 for k in kinds], left=[a + b for a, b in zip(client, server, strict=True)],
              label="other wait")
    left.set_xlabel("ms per call, one at a time")
    left.legend(fontsize=8)
    labels = [f"run {n + 1}" for n in range(len(runs))]
    x = range(len(runs))
    right.bar([i - 0.2 for i in x], [r["tasks_per_s"] for r in runs], 0.4, label="measured", color="tab:gray")
    right.bar([i + 0.2 for i in x], predictions, 0.4, label="model", color="tab:blue")
    right.set_xticks(list(x), labels)
    right.set_ylabel("no-op tasks/s")
    right.legend(fontsize=8)
    right.set_title(f"{runs[0]['tasks']} tasks, {runs[0]['workers']}×{runs[0]['slots']} slots", fontsize=9)
    return save(fig, ctx.docs, "scale-calibration")
