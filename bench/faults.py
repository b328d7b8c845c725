"""Systematic fault injection: every storage call of a small run failed in turn, three ways.

The SDK's own per-request hooks (``raw_request_hook``/``raw_response_hook``, installed through
``pipeline.storage.clients.HOOKS``) number every storage request the run's components make — the
API's, the planner's, the workers', the monitor's and the finisher's alike — and at call
``k`` do one of:

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
one manifest and one email (a resend after a crash must carry the same Message-ID), no index
rows and no cache markers left.

    python -m bench.faults [--kinds refuse,drop,crash] [--stride 1] [--limit N] [--jobs N] [--operation OP]

``--operation`` faults the first call of one operation wherever it comes, once per kind: a
call whose place varies from run to run (the repeat's settle comes once its first job has
ended) is missed by the numbered points.

Most of a run's time is waiting (leases expiring, components restarting), not CPU, so
``--jobs N`` sweeps N shards side by side, each in a process of its own with its own Azurite
(``--shard i/N``: every N-th point from the i-th), and adds their figures up.

Last line: JSON with ``fault_points``, ``lost``, ``duplicates``, ``extra_emails``,
``stuck_jobs`` (and ``leftovers``, ``coverage``).
"""

from __future__ import annotations

import argparse
import json
import os
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
from bench import fault_run, fault_stage
from bench.fault_plan import KINDS
from bench.fault_run import run_one, warm_fork_server
from pipeline.lifecycle import rollups


def points(clean_calls: list[str], kinds: tuple[str, ...], stride: int = 1,
           distinct: bool = False, window: tuple[int, int] | None = None) -> list[tuple[int, str]]:
    """The (call, kind) points to fault: every ``stride``-th call of the clean run, or only
    the first call of each distinct operation (``distinct``: the fast subset), or every
    call of a ``window`` of it (first, last: the calls a change makes, which may share
    their operation's name with earlier calls)."""
    if window:
        numbers = list(range(window[0], min(window[1], len(clean_calls)) + 1))
    elif distinct:
        seen: dict[str, int] = {}
        for number, call in enumerate(clean_calls, 1):
            seen.setdefault(call, number)
        numbers = sorted(seen.values())
    else:
        numbers = list(range(1, len(clean_calls) + 1, stride))
    return [(k, kind) for k in numbers for kind in kinds]


# what every run's check counts, added up over the sweep (and over its shards, with the points)
COUNTS = ("lost", "duplicates", "extra_emails", "stuck_jobs", "leftovers", "failed_jobs", "missing_emails",
          "resent_emails")
SUMMED = ("fault_points", *COUNTS)


def sweep_points(azurite: Azurite, workdir: Path, chosen: list[tuple[int, str]],
                 report: Callable[[dict[str, Any]], None] = lambda r: None, operation: str = "") -> dict[str, Any]:
    totals: Counter[str] = Counter()
    covered: set[str] = set()
    failures = []
    for k, kind in chosen:
        result = run_one(azurite, workdir, k, kind, operation)
        report(result)
        if result["hit"]:
            covered.add(f"{kind} {result['hit']}")
        totals.update(result["counts"])
        if result["problems"]:
            failures.append({"k": k, "kind": kind, "hit": result["hit"], "problems": result["problems"][:5]})
    return {"fault_points": len(chosen), **{key: totals[key] for key in COUNTS},
            "coverage": len(covered), "covered": sorted(covered), "failures": failures}


def sweep_shards(jobs: int, argv: list[str]) -> dict[str, Any]:
    """Run ``jobs`` shards of the sweep as processes of their own, echo their lines, add up
    their last-line figures."""
    # each shard its own folder of scripted hangs (one shard's must never look like another's)
    env = {k: v for k, v in os.environ.items() if k != fault_stage.HANGS_ENV}
    children = [subprocess.Popen([sys.executable, "-m", "bench.faults", *argv, "--shard", f"{i}/{jobs}"],
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
    summary: dict[str, Any] = {key: sum(part[key] for part in parts) for key in SUMMED}
    covered = sorted(set().union(*(part["covered"] for part in parts)))
    summary.update(coverage=len(covered), covered=covered,
                   failures=[failure for part in parts for failure in part["failures"]],
                   clean_calls=sorted({part["clean_calls"] for part in parts}))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--stride", type=int, default=1, help="fault every n-th call of the clean run")
    parser.add_argument("--distinct", action="store_true", help="only the first call of each operation")
    parser.add_argument("--limit", type=int, default=0, help="at most this many points")
    parser.add_argument("--operation", default="", help="fault the first call of this operation (as the runs name "
                        "it, e.g. 'POST $batch [CACHED,QUEUED]'), wherever it comes, once per kind")
    parser.add_argument("--calls", default="", help="FIRST-LAST: every call of the clean run from FIRST to LAST "
                        "(print the clean run's calls with --list)")
    parser.add_argument("--list", action="store_true", help="print the clean run's calls, numbered, and stop")
    parser.add_argument("--jobs", type=int, default=1, help="shards swept side by side")
    parser.add_argument("--task-queues", type=int, default=fault_run.TASK_QUEUES,
                        help="the scenario's BAGPIPE_SHARDS: 2, its jobs over two partitions; 1, in one, "
                        "a message naming several attempts")
    parser.add_argument("--fold-always", action="store_true",
                        help="every sweep pass folds every writer's rollup row (rollups.fold): its calls faulted, "
                        "and the writers' writes into rows folded under them")
    parser.add_argument("--shard", default="0/1", help="i/N: this process sweeps every N-th point from the i-th")
    args = parser.parse_args()
    fault_run.TASK_QUEUES = args.task_queues
    if args.fold_always:
        rollups.FOLD_IDLE_S, rollups.FOLD_AT = -60.0, 1
    kinds = tuple(k for k in args.kinds.split(",") if k)
    if args.jobs > 1 and not args.list:  # (a listing is of the one clean run)
        started = time.monotonic()
        own = ["--kinds", args.kinds, "--stride", str(args.stride), "--limit", str(args.limit), "--calls", args.calls,
               "--task-queues", str(args.task_queues), *(["--fold-always"] if args.fold_always else [])]
        summary = sweep_shards(args.jobs, own + (["--distinct"] if args.distinct else []))
        summary["seconds"] = round(time.monotonic() - started, 1)
        summary["jobs"] = args.jobs
        print(json.dumps({key: value for key, value in summary.items() if key != "covered"}))
        sys.exit(0)
    shard, shards = (int(part) for part in args.shard.split("/"))
    with tempfile.TemporaryDirectory(prefix="bagpipe-faults-") as top:
        azurite = Azurite(Path(top, "azurite")).start()
        try:
            warm_fork_server()
            started = time.monotonic()
            clean = run_one(azurite, Path(top), 0, "")
            print(f"clean run: {len(clean['calls'])} storage calls, {clean['steps']} steps, "
                  f"{time.monotonic() - started:.1f} s, {clean['counts'].get('settled', 0)} tasks settled at planning, "
                  f"problems: {clean['problems']}", flush=True)
            if args.list:
                for number, call in enumerate(clean["calls"], 1):
                    print(f"{number:5d} {call}")
                return
            first, _, last = args.calls.partition("-")
            window = (int(first), int(last)) if args.calls else None
            chosen = [(k, kind) for k, kind in enumerate(kinds, 1)] if args.operation else \
                points(clean["calls"], kinds, args.stride, args.distinct, window)
            if args.limit:
                chosen = chosen[: args.limit]
            chosen = chosen[shard::shards]

            def report(result: dict[str, Any]) -> None:
                mark = "FAIL " + "; ".join(result["problems"][:3]) if result["problems"] else "ok"
                print(f"k={result['k']:4d} {result['kind']:7s} {result['hit'] or '(not reached)':60.60s} "
                      f"restarts={result['restarts']} {mark}", flush=True)

            summary = sweep_points(azurite, Path(top), chosen, report, args.operation)
        finally:
            azurite.stop()
    summary["clean_calls"] = len(clean["calls"])
    summary["seconds"] = round(time.monotonic() - started, 1)
    if shards == 1:
        del summary["covered"]
    print(json.dumps(summary))
    sys.exit(0)


if __name__ == "__main__":
    main()
