"""Systematic fault injection: every storage call of a small run failed in turn, three ways,
and random pairs of faults.

The SDK's own per-request hooks (``raw_request_hook``/``raw_response_hook``, installed through
``pipeline.storage.clients.HOOKS``) name every storage request the run's components make —
the API's, the planner's, the workers', the monitor's and the finisher's alike — by what it
does (``tests.harness.fault_plan.describe``: who calls, the method, the table, queue or
container, the kind of row or blob, the statuses a write sets), and number the calls of each
name: a point, ``name#n``, is hit again in the next run wherever the calls around it have
moved. At a point, a fault is one of:

- ``refuse``: fail it before it reaches storage, and every retry the SDK makes of it (a
  storage outage longer than the SDK's retries);
- ``drop``: let storage apply it, then lose the answer (a connection reset): the SDK retries
  it if it retries such a request, else the caller sees the error;
- ``crash``: end the component right after the call returns (a killed container), and start
  it again, as Container Apps and the Functions host do.

A driver runs the components in one thread, one step at a time, so that their calls come in
one order: the API submits a job of tile tasks and reductions (one tile's worker is lost
mid-attempt on purpose, so every run has a monitor revocation) and a second job it then
cancels; the control loop plans, completes and sweeps; two workers take turns. Then, from
storage alone: every task terminal, one committed attempt per task, every job finished with
one manifest and exactly one email (the same email sent twice, even under one Message-ID,
fails the run), no index rows and no cache markers left.

    python -m tests.harness.faults [--kinds refuse,drop,crash] [--distinct | --stride N | --calls A-B]
        [--double RUNS --seed S] [--fault 'KIND POINT' ...] [--list] [--jobs N]

A clean run first gives the points. ``--distinct`` faults the first call of each name (the
fast subset), the default every call, ``--stride N`` every N-th, ``--calls A-B`` the clean
run's calls A to B; each of them once per kind. ``--double RUNS`` makes RUNS runs of two
faults each, drawn at random (points and kinds) from the clean run with ``--seed``: the same
seed draws the same runs. ``--fault 'KIND POINT'`` (repeatable) makes one run with those
faults together: a failure printed by a sweep is run again so. ``--list`` prints the clean
run's points.

``--jobs N`` sweeps N shards side by side, each in a process of its own with its own Azurite,
every N-th run from the i-th of the one list the first clean run drew, and adds their figures.
A run is bound by CPU (about 6 s of it, its own, Azurite's and its stage processes'), not by
the scenario's waits: shards shorten a sweep only as far as the machine has cores to spare.

Last line: JSON with ``runs``, ``lost``, ``duplicates``, ``extra_emails``, ``resent_emails``,
``stuck_jobs``, ``leftovers``, ``failed_jobs``, ``missing_emails``, ``coverage``, ``failures``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bagpipe.azurite import Azurite
from pipeline.lifecycle import rollups
from tests.harness import fault_run, fault_stage
from tests.harness.fault_plan import KINDS
from tests.harness.fault_run import run_one, warm_fork_server

Faults = list[tuple[str, str]]  # one run's faults: (kind, point), each point faulted once


def points(clean_calls: list[str], kinds: tuple[str, ...], stride: int = 1, distinct: bool = False,
           window: tuple[int, int] | None = None) -> list[Faults]:
    """The runs of one fault each: every ``stride``-th call of the clean run, or only the first
    call of each name (``distinct``: the fast subset), or every call of a ``window`` of it
    (first, last: the calls a change makes, which may share their name with earlier calls);
    each once per kind."""
    if window:
        chosen = clean_calls[window[0] - 1:window[1]]
    elif distinct:
        chosen = [point for point in clean_calls if point.endswith("#1")]
    else:
        chosen = clean_calls[::stride]
    return [[(kind, point)] for point in chosen for kind in kinds]


def doubles(clean_calls: list[str], kinds: tuple[str, ...], runs: int, seed: int) -> list[Faults]:
    """``runs`` runs of two faults each at two different calls of the clean run, their points
    and kinds drawn with ``seed``."""
    draw = random.Random(seed)
    return [[(draw.choice(kinds), point) for point in sorted(draw.sample(clean_calls, 2), key=clean_calls.index)]
            for _ in range(runs)]


# what every run's check counts, added up over the sweep (and over its shards)
COUNTS = ("lost", "duplicates", "extra_emails", "resent_emails", "stuck_jobs", "leftovers", "failed_jobs",
          "missing_emails")


def sweep(azurite: Azurite, workdir: Path, chosen: list[Faults],
          report: Callable[[dict[str, Any]], None] = lambda r: None) -> dict[str, Any]:
    """Make each run of ``chosen``; add up what their checks found."""
    totals: Counter[str] = Counter()
    covered: set[str] = set()
    failures = []
    for number, faults in enumerate(chosen):
        result = run_one(azurite, workdir, {point: kind for kind, point in faults}, name=str(number))
        report(result)
        covered.update(result["hits"])
        totals.update(result["counts"])
        if result["problems"]:
            failures.append({"faults": faults, "hits": result["hits"], "problems": result["problems"][:5]})
    return {"runs": len(chosen), **{key: totals[key] for key in COUNTS}, "coverage": len(covered),
            "covered": sorted(covered), "failures": failures}


def shards(jobs: int, chosen_file: Path, argv: list[str]) -> dict[str, Any]:
    """Run ``jobs`` shards of the sweep as processes of their own, each every ``jobs``-th run
    of ``chosen_file``; echo their lines, add up their last-line figures."""
    # each shard its own folder of scripted hangs (one shard's must never look like another's)
    env = {k: v for k, v in os.environ.items() if k != fault_stage.HANGS_ENV}
    children = [subprocess.Popen([sys.executable, "-m", "tests.harness.faults", *argv, "--runs-file",
                                  str(chosen_file), "--shard", f"{i}/{jobs}"],
                                 stdout=subprocess.PIPE, text=True, env=env) for i in range(jobs)]
    lasts: list[str] = [""] * jobs

    def echo(i: int, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lasts[i] = line
            if not line.startswith("{"):
                print(f"[{i}] {line}", end="", flush=True)

    threads = [threading.Thread(target=echo, args=(i, c)) for i, c in enumerate(children)]
    for thread in threads:
        thread.start()
    for thread, child in zip(threads, children, strict=True):
        thread.join()
        if child.wait() != 0:
            raise SystemExit(f"a shard of the sweep ended with {child.returncode}")
    parts = [json.loads(last) for last in lasts]
    summary: dict[str, Any] = {key: sum(part[key] for part in parts) for key in ("runs", *COUNTS)}
    covered = sorted(set().union(*(part["covered"] for part in parts)))
    summary.update(coverage=len(covered), failures=[failure for part in parts for failure in part["failures"]])
    return summary


def _report(result: dict[str, Any]) -> None:
    mark = "FAIL " + "; ".join(result["problems"][:3]) if result["problems"] else "ok"
    asked = " + ".join(f"{kind} {point}" for point, kind in result["faults"].items())
    missed = "" if len(result["hits"]) == len(result["faults"]) else f" (hit {len(result['hits'])})"
    print(f"{asked[:110]:110s}{missed} restarts={result['restarts']} {mark}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--stride", type=int, default=1, help="fault every n-th call of the clean run")
    parser.add_argument("--distinct", action="store_true", help="only the first call of each name")
    parser.add_argument("--calls", default="", help="FIRST-LAST: the clean run's calls FIRST to LAST (see --list)")
    parser.add_argument("--double", type=int, default=0, help="RUNS: runs of two random faults each")
    parser.add_argument("--seed", type=int, default=1, help="the seed of --double's draws")
    parser.add_argument("--fault", action="append", default=[], help="'KIND POINT': one run with these faults")
    parser.add_argument("--limit", type=int, default=0, help="at most this many runs")
    parser.add_argument("--list", action="store_true", help="print the clean run's points, numbered, and stop")
    parser.add_argument("--jobs", type=int, default=1, help="shards swept side by side")
    parser.add_argument("--task-queues", type=int, default=fault_run.TASK_QUEUES,
                        help="the scenario's BAGPIPE_SHARDS: 2, its jobs over two partitions; 1, in one, "
                        "a message naming several attempts")
    parser.add_argument("--fold-always", action="store_true",
                        help="every sweep pass folds every writer's rollup row (rollups.fold): its calls faulted, "
                        "and the writers' writes into rows folded under them")
    parser.add_argument("--runs-file", default="", help=argparse.SUPPRESS)  # a shard's runs, drawn by its parent
    parser.add_argument("--shard", default="0/1", help=argparse.SUPPRESS)
    args = parser.parse_args()
    fault_run.TASK_QUEUES = args.task_queues
    if args.fold_always:
        rollups.FOLD_IDLE_S, rollups.FOLD_AT = -60.0, 1
    kinds = tuple(k for k in args.kinds.split(",") if k)
    shard, of = (int(part) for part in args.shard.split("/"))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bagpipe-faults-") as top:
        azurite = Azurite(Path(top, "azurite")).start()
        try:
            warm_fork_server()
            if args.runs_file:
                chosen: list[Faults] = [[(k, p) for k, p in faults] for faults in
                                        json.loads(Path(args.runs_file).read_text())][shard::of]
                clean_calls = 0
            else:
                clean = run_one(azurite, Path(top), {}, name="clean")
                clean_calls = len(clean["calls"])
                print(f"clean run: {clean_calls} storage calls ({len(set(clean['calls']))} points, "
                      f"{sum(p.endswith('#1') for p in clean['calls'])} names), {clean['steps']} steps, "
                      f"{time.monotonic() - started:.1f} s, {clean['counts'].get('settled', 0)} tasks settled at "
                      f"planning, problems: {clean['problems']}", flush=True)
                if args.list:
                    for number, call in enumerate(clean["calls"], 1):
                        print(f"{number:5d} {call}")
                    return
                first, _, last = args.calls.partition("-")
                if args.fault:
                    chosen = [[(item.split(" ", 1)[0], item.split(" ", 1)[1]) for item in args.fault]]
                elif args.double:
                    chosen = doubles(clean["calls"], kinds, args.double, args.seed)
                else:
                    chosen = points(clean["calls"], kinds, args.stride, args.distinct,
                                    (int(first), int(last)) if args.calls else None)
                if args.limit:
                    chosen = chosen[: args.limit]
                if args.jobs > 1:
                    runs_file = Path(top, "runs.json")
                    runs_file.write_text(json.dumps(chosen))
                    summary = shards(args.jobs, runs_file, ["--task-queues", str(args.task_queues),
                                                            *(["--fold-always"] if args.fold_always else [])])
                    summary |= {"clean_calls": clean_calls, "jobs": args.jobs,
                                "seconds": round(time.monotonic() - started, 1)}
                    print(json.dumps(summary))
                    return
            summary = sweep(azurite, Path(top), chosen, _report)
        finally:
            azurite.stop()
    summary |= {"clean_calls": clean_calls, "seconds": round(time.monotonic() - started, 1)}
    if of == 1 and not args.runs_file:
        del summary["covered"]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
