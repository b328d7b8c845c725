"""Stragglers and the monitor: one job of 644 tasks with a known runtime distribution, run
four ways side by side on the local stack — no stragglers; 16% of tasks slowed 4–10× with
the monitor off; the same with the monitor on, revoking past 4× the historical mean (the
ModisAzure rule); and the same revoking past the high quantile mean + 4σ.

    python -m bench.stragglers

Prints the makespans, their ratios to the clean run and the work the kills wasted; the last
line is one JSON object.
"""

from __future__ import annotations

import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bagpipe.azurite import Azurite
from bagpipe.stack import LocalStack
from pipeline import attempts, jobs, runtimes, tasks
from pipeline.clients import Clients

TILES = ["h07v05", "h08v04", "h08v05", "h09v04", "h09v05", "h10v04", "h10v05"]
REQUEST = {"region": {"tiles": TILES}, "start": "2021-01-01", "end": "2022-12-31",
           "products": ["MOD10A2"]}
COMMON = {"stage_modules": "bench.straggler_stage", "monitor_interval_s": 0.5, "kill_floor_s": 1.0,
          "min_samples": 20, "kill_grace_s": 1.0}
SIGMAS = 4.0
NEVER = {"kill_factor": 1000.0, "kill_ceiling_s": 10_000.0}


def run(azurite: Azurite, home: Path, namespace: str, stage: str, overrides: dict[str, Any],
        history: runtimes.Runtime | None) -> dict[str, Any]:
    with LocalStack(home, workers=2, slots=4, connection=azurite.connection_string, namespace=namespace,
                    overrides={**COMMON, **overrides, "lease_seconds": 3, "tile_stage": stage}) as stack:
        clients = Clients(stack.settings)
        table = clients.runtimes
        if history is not None:  # the history earlier requests left for this stage
            table.upsert_entity({"PartitionKey": stage, "RowKey": "MOD10A2", "Count": history.count,
                                 "Mean": history.mean, "M2": history.m2})
        http = httpx.Client(base_url=stack.api_url, timeout=60, headers=stack.headers)
        started = time.monotonic()
        job = http.post("/api/jobs", json=REQUEST).json()["job"]
        shown = 0.0
        # The job row alone (one read): a full status reads every task row and would load
        # the storage the run is measured against.
        while jobs.get(clients, job)["State"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
            if time.monotonic() - shown > 15:
                shown = time.monotonic()
                done = sum(tasks.terminal_counts(clients.tasks, job).values())
                print(f"  {namespace}: {shown - started:.0f} s, {done} tasks terminal", file=sys.stderr)
            time.sleep(0.25)
        makespan = time.monotonic() - started
        status = http.get(f"/api/jobs/{job}").json()
        wasted = sum((a["EndedAt"] - a["StartedAt"]).total_seconds()
                     for a in attempts.list_attempts(clients.tasks, job)
                     if a.get("RevokedBy") == "monitor" and a.get("EndedAt"))
        busy = sum(float(t.get("RuntimeS", 0)) for t in tasks.list_tasks(clients.tasks, job))
        return {"tasks": status["total"], "state": status["state"], "makespan_s": round(makespan, 2),
                "kills": status["monitor_kills"], "wasted_s": round(wasted, 2), "busy_s": round(busy, 2),
                "history": runtimes.read(table, stage, "MOD10A2")}


def main() -> None:
    # A stopped benchmark stops its stacks (workers run in sessions of their own).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory() as tmp:
        azurite = Azurite(Path(tmp) / "azurite").start()
        try:
            clean = run(azurite, Path(tmp) / "a", "clean", "bench_clean", NEVER, None)
            off = run(azurite, Path(tmp) / "b", "off", "bench_straggle", NEVER, None)
            on = run(azurite, Path(tmp) / "c", "on", "bench_straggle", {"kill_factor": 4.0}, clean["history"])
            quantile = run(azurite, Path(tmp) / "d", "quantile", "bench_straggle",
                           {"kill_factor": 4.0, "kill_sigmas": SIGMAS}, clean["history"])
        finally:
            azurite.stop()
    rows = (("clean", clean), ("stragglers, no monitor", off), ("stragglers, monitor 4x", on),
            (f"stragglers, mean+{SIGMAS:g}sd", quantile))
    print(f"{'run':<24} {'tasks':>6} {'makespan s':>11} {'ratio':>6} {'kills':>6} {'wasted s':>9}")
    for name, r in rows:
        print(f"{name:<24} {r['tasks']:>6} {r['makespan_s']:>11} {r['makespan_s'] / clean['makespan_s']:>6.2f}"
              f" {r['kills']:>6} {r['wasted_s']:>9}")
    history = clean["history"]
    print(f"historical runtime {history.mean:.3f} s ± {history.stdev:.3f} over {history.count} runs: "
          f"4x mean = {4 * history.mean:.2f} s, mean+{SIGMAS:g}sd = {history.mean + SIGMAS * history.stdev:.2f} s")
    print(json.dumps({
        "tasks": clean["tasks"],
        "clean_s": clean["makespan_s"],
        "stragglers_no_monitor_s": off["makespan_s"],
        "stragglers_monitor_s": on["makespan_s"],
        "stragglers_no_monitor_ratio": round(off["makespan_s"] / clean["makespan_s"], 3),
        "stragglers_monitor_ratio": round(on["makespan_s"] / clean["makespan_s"], 3),
        "stragglers_quantile_s": quantile["makespan_s"],
        "stragglers_quantile_ratio": round(quantile["makespan_s"] / clean["makespan_s"], 3),
        "kills": on["kills"],
        "wasted_s": on["wasted_s"],
        "wasted_share": round(on["wasted_s"] / max(on["busy_s"], 1e-9), 3),
        "quantile_kills": quantile["kills"],
        "quantile_wasted_s": quantile["wasted_s"],
        "states": [clean["state"], off["state"], on["state"], quantile["state"]],
    }))


if __name__ == "__main__":
    main()
