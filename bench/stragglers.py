"""Stragglers and what bagpipe does about them, on the local stack, two models side by side,
each run three ways: no stragglers; stragglers with the monitor off; stragglers under
bagpipe's policy (``POLICY``: revoke past 4× the historical mean or mean + 4σ, whichever
comes first; slow workers drained and replaced; at the job's tail, a backup copy of an
attempt past the 95th percentile of its history).

- **per machine** (the ModisAzure paper's stragglers were VMs): 6 workers × 2 slots, one job
  of 49 tasks of 5–9 s of work (about four waves, as its jobs on 200 instances had); from
  a few seconds after the job starts to its end, two of the six workers run 10× slower —
  their whole process trees duty-cycled with SIGSTOP/SIGCONT (run 1/10 of every half
  second), so that work advances only while the "VM" runs and the task cannot tell.
- **per task**: 2 workers × 4 slots, 644 tasks of 1.0–1.8 s, 16% of them 4–10× slower on
  their first attempt, wherever they run.

    python -m bench.stragglers [--model machine|task|both]

Prints makespans, their ratios to the clean run, kills, drained attempts, backups and the
work wasted (slot-seconds of attempts that did not commit, as a share of the clean run's busy
slot-seconds); the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bagpipe.azurite import Azurite
from bagpipe.stack import LocalStack
from pipeline.lifecycle import attempts, jobs, runtimes, tasks
from pipeline.storage.clients import Clients

TILES = ["h07v05", "h08v04", "h08v05", "h09v04", "h09v05", "h10v04", "h10v05"]
COMMON = {"stage_modules": "bench.straggler_stage", "monitor_interval_s": 0.5, "kill_floor_s": 1.0,
          "min_samples": 20, "kill_grace_s": 1.0}
NEVER = {"kill_factor": 1000.0, "kill_ceiling_s": 10_000.0, "slow_ratio": 0.0, "speculate_share": 0.0}  # off
POLICY = {"kill_factor": 4.0, "kill_sigmas": 4.0}  # and speculation and worker health at their defaults
DUTY_PERIOD_S = 0.5


@dataclass(frozen=True)
class Model:
    name: str
    request: dict[str, Any]
    clean_stage: str
    slow_stage: str
    workers: int
    slots: int
    slow_workers: dict[int, float] = field(default_factory=dict)  # worker index -> slowdown
    slow_after_s: float = 0.0  # the slow stretch starts this long after the job is submitted


MACHINE = Model("machine", {"region": {"tiles": TILES}, "start": "2022-01-01", "end": "2022-02-18",
                            "products": ["MOD10A2"]},
                "bench_work", "bench_work", workers=6, slots=2, slow_workers={0: 10.0, 1: 10.0}, slow_after_s=4.0)
TASK = Model("task", {"region": {"tiles": TILES}, "start": "2021-01-01", "end": "2022-12-31", "products": ["MOD10A2"]},
             "bench_clean", "bench_straggle", workers=2, slots=4)


def process_tree(root: int) -> list[int]:
    """Every process of the session ``root`` leads: a worker, its fork server and its
    slots' stage processes (each in a process group of its own, all in its session)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[3]) == root:  # the session id
            found.append(int(entry))
    return found


class DutyCycle(threading.Thread):
    """Makes the process trees of some workers ``factor`` times slower: each runs 1/factor
    of every DUTY_PERIOD_S and is stopped the rest, until :meth:`end`, which lets them all
    run again. A process started later in a slowed session (a new stage process) is
    caught at the next period; a replaced worker is a new session, a healthy machine."""

    def __init__(self, roots: dict[int, float]) -> None:
        super().__init__(daemon=True, name="duty-cycle")
        self.roots = roots
        self.ended = threading.Event()

    def _signal(self, root: int, sig: signal.Signals) -> None:
        for pid in process_tree(root):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def run(self) -> None:
        try:
            while not self.ended.is_set():
                for root in self.roots:
                    self._signal(root, signal.SIGCONT)
                started = time.monotonic()
                for root, factor in sorted(self.roots.items(), key=lambda item: -item[1]):
                    self.ended.wait(max(0.0, DUTY_PERIOD_S / factor - (time.monotonic() - started)))
                    self._signal(root, signal.SIGSTOP)
                self.ended.wait(max(0.0, DUTY_PERIOD_S - (time.monotonic() - started)))
        finally:
            for root in self.roots:
                self._signal(root, signal.SIGCONT)

    def end(self) -> None:
        self.ended.set()
        self.join()


def wasted_seconds(clients: Clients, job: str) -> float:
    """Slot-seconds of the job's attempts (backups included) that did not commit: revoked,
    given up, or beaten by their backup or their original (their slot was busy until their
    worker threw the work away)."""
    wasted = 0.0
    for a in attempts.list_attempts(clients.tasks, jobs.get(clients, job).parts):
        end = a.discarded_at or a.ended_at
        if end and a.started_at and a.outcome not in ("SUCCEEDED", "CACHED", "NO_DATA"):
            wasted += (end - a.started_at).total_seconds()
    return wasted


def run(azurite: Azurite, home: Path, namespace: str, model: Model, stage: str, overrides: dict[str, Any],
        history: runtimes.Runtime | None, slowed: bool) -> dict[str, Any]:
    with LocalStack(home, workers=model.workers, slots=model.slots, connection=azurite.connection_string,
                    namespace=namespace,
                    overrides={**COMMON, **overrides, "lease_seconds": 3, "tile_stage": stage}) as stack:
        stack.wait_for_workers()
        clients = Clients(stack.settings)
        table = clients.runtimes
        if history is not None:  # the history earlier requests left for this stage
            runtimes.merge(table, stage, "MOD10A2", history)
        http = httpx.Client(base_url=stack.api_url, timeout=60, headers=stack.headers)
        started = time.monotonic()
        job = http.post("/api/jobs", json=model.request).json()["job"]
        slow = DutyCycle({stack.worker_processes[i].pid: f for i, f in model.slow_workers.items()}) if slowed else None
        shown = 0.0
        try:
            # The job row alone (one read): a full status reads every task row and would load
            # the storage the run is measured against.
            while not jobs.get(clients, job).state.finished:
                if slow is not None and not slow.is_alive() and time.monotonic() - started >= model.slow_after_s:
                    slow.start()
                if time.monotonic() - shown > 15:
                    shown = time.monotonic()
                    done = sum(tasks.terminal_counts(clients.tasks, jobs.get(clients, job).parts).values())
                    print(f"  {namespace}: {shown - started:.0f} s, {done} tasks terminal", file=sys.stderr)
                time.sleep(0.25)
            makespan = time.monotonic() - started
        finally:
            if slow is not None and slow.is_alive():
                slow.end()
        status = http.get(f"/api/jobs/{job}").json()
        busy = sum(t.runtime_s or 0.0 for t in tasks.list_tasks(clients.tasks, jobs.get(clients, job).parts))
        return {"tasks": status["total"], "state": status["state"], "makespan_s": round(makespan, 2),
                "kills": status["monitor_kills"], "drained": status["failures"].get("worker_slow", 0),
                "backups": status["speculative_attempts"],
                "wasted_s": round(wasted_seconds(clients, job), 2), "busy_s": round(busy, 2),
                "history": runtimes.read(table, stage, "MOD10A2")}


def compare(azurite: Azurite, tmp: Path, model: Model) -> dict[str, Any]:
    """The model's three runs and their figures."""
    slowed = bool(model.slow_workers)
    clean = run(azurite, tmp / f"{model.name}-clean", f"{model.name}clean", model, model.clean_stage, NEVER,
                None, False)
    off = run(azurite, tmp / f"{model.name}-off", f"{model.name}off", model, model.slow_stage, NEVER, None, slowed)
    policy = run(azurite, tmp / f"{model.name}-policy", f"{model.name}policy", model, model.slow_stage, POLICY,
                 clean["history"], slowed)
    print(f"{model.name} model: {'run':<22} {'tasks':>6} {'makespan s':>11} {'ratio':>6} {'kills':>6}"
          f" {'drained':>8} {'backups':>8} {'wasted s':>9}")
    for name, r in (("clean", clean), ("stragglers, no monitor", off), ("stragglers, policy", policy)):
        print(f"{'':<{len(model.name) + 8}}{name:<22} {r['tasks']:>6} {r['makespan_s']:>11}"
              f" {r['makespan_s'] / clean['makespan_s']:>6.2f} {r['kills']:>6} {r['drained']:>8} {r['backups']:>8}"
              f" {r['wasted_s']:>9}")
    return {"clean": clean, "off": off, "policy": policy,
            "ratio": round(policy["makespan_s"] / clean["makespan_s"], 3),
            "no_monitor_ratio": round(off["makespan_s"] / clean["makespan_s"], 3),
            "wasted_share": round(policy["wasted_s"] / max(clean["busy_s"], 1e-9), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("machine", "task", "both"), default="both")
    args = parser.parse_args()
    # A stopped benchmark stops its stacks (workers run in sessions of their own).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    found: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        azurite = Azurite(Path(tmp) / "azurite").start()
        try:
            for model in (MACHINE, TASK):
                if args.model in (model.name, "both"):
                    found[model.name] = compare(azurite, Path(tmp), model)
        finally:
            azurite.stop()
    figures: dict[str, Any] = {}
    for name in ("machine", "task"):
        result = found.get(name)
        figures |= {f"{name}_ratio": result and result["ratio"],
                    f"{name}_no_monitor_ratio": result and result["no_monitor_ratio"],
                    f"{name}_wasted_share": result and result["wasted_share"]}
        if result:
            figures |= {f"{name}_{run}_s": result[run]["makespan_s"] for run in ("clean", "off", "policy")}
            figures |= {f"{name}_kills": result["policy"]["kills"], f"{name}_drained": result["policy"]["drained"],
                        f"{name}_backups": result["policy"]["backups"],
                        f"{name}_states": [result[run]["state"] for run in ("clean", "off", "policy")]}
    shares = [s for s in (figures["machine_wasted_share"], figures["task_wasted_share"]) if s is not None]
    figures["wasted_share"] = max(shares) if shares else None
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
