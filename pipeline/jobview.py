"""What the portal's job page shows, in one read of the job's tasks and attempts: the
target tiles with their lon/lat bounds and task states, a histogram of task runtimes with
the monitor's kill threshold, the failed and revoked attempts with links to their logs, an
estimate of the time left from the runtime history, and (once finished) the quick-looks."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from typing import Any

from pipeline import attempts, jobs, names, policy, results, runtimes, tasks
from pipeline.clients import Clients
from pipeline.status import ENDED_WELL, JobState, TaskStatus
from pipeline.targets import lonlat_bounds

BINS = 20  # histogram bars
FAILURES_SHOWN = 100  # newest failed attempts listed
LOG_FILES = ("stdout.txt", "stderr.txt")  # what a reduction attempt leaves in logs


def tile_state(counts: Counter[str]) -> str:
    """One colour per target tile: failed if any task died, no data when the catalog had
    none of its sources, done when all ended well, running while any runs, else waiting
    (or cancelled)."""
    if counts[TaskStatus.DEAD.value]:
        return "failed"
    if counts[TaskStatus.CANCELLED.value]:
        return "cancelled"
    ended_well = sum(counts[s.value] for s in ENDED_WELL)
    if sum(counts.values()) == counts[TaskStatus.NO_DATA.value]:
        return "nodata"
    if sum(counts.values()) == ended_well:
        return "done"
    if counts[TaskStatus.RUNNING.value] or ended_well:
        return "running"
    return "waiting"


def histogram(seconds: list[float], threshold: float | None) -> dict[str, Any]:
    """Bars of equal width from 0 to past the longest runtime; the threshold is on the axis
    when it is near (else ``threshold_beyond``: drawn at the edge, so the bars stay readable)."""
    longest = max(seconds, default=0.0)
    beyond = threshold is not None and longest > 0 and threshold > 3 * longest
    top = max(longest * 1.25 if beyond or threshold is None else max(longest, threshold) * 1.05, 1e-3)
    width = top / BINS
    bars = [0] * BINS
    for s in seconds:
        bars[min(BINS - 1, int(s / width))] += 1
    return {"width_s": width, "bars": bars, "count": len(seconds), "threshold_s": threshold,
            "threshold_beyond": beyond}


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return (end - start).total_seconds() if start and end else None


def view(clients: Clients, job: str) -> dict[str, Any]:
    """The job's status with its tiles, runtimes, failures and time left."""
    rows = tasks.list_tasks(clients.tasks, job)
    attempt_rows = attempts.list_attempts(clients.tasks, job)
    status = jobs.status(clients, job, rows, attempt_rows)
    tiles: dict[str, dict[str, Any]] = {}
    by_tile: dict[str, Counter[str]] = {}
    stage_of: dict[str, tuple[str, dict[str, str]]] = {}
    for row in rows:
        params = json.loads(row["Params"])
        stage_of[row["RowKey"]] = (row["Stage"], params)
        tile = params.get("tile", "")
        if tile not in tiles:
            tiles[tile] = {"tile": tile, "bounds": lonlat_bounds(params["crs"], params["bounds"])}
            by_tile[tile] = Counter()
        by_tile[tile][row["Status"]] += 1
    for tile, counts in by_tile.items():
        tiles[tile] |= {"state": tile_state(counts), "counts": dict(counts)}

    durations: dict[str, list[float]] = {}
    failures = []
    for attempt in attempt_rows:
        task, number = attempt["Task"], attempt["Attempt"]
        stage = stage_of.get(task, ("", {}))[0]
        if attempt.get("RuntimeS") is not None:
            durations.setdefault(stage, []).append(float(attempt["RuntimeS"]))
        if attempt.get("FailureClass"):
            failures.append({
                "task": task, "attempt": int(number), "stage": stage, "class": attempt["FailureClass"],
                "revoked_by": attempt.get("RevokedBy") or None, "error": attempt.get("Error") or "",
                "ended": attempt["EndedAt"].isoformat() if attempt.get("EndedAt") else None,
                "runtime_s": _seconds(attempt.get("StartedAt"), attempt.get("EndedAt")),
                "logs": {name: results.sas_url(clients, clients.logs.container_name,
                                               names.log_prefix(job, task, int(number)) + name)
                         for name in LOG_FILES} if stage == "reduce" else {},
            })
    failures.sort(key=lambda f: f["ended"] or "", reverse=True)

    stages: dict[str, Any] = {}
    remaining_s = 0.0
    for stage in sorted({s for s, _ in stage_of.values()}):
        params = next(p for s, p in stage_of.values() if s == stage)
        history = runtimes.read(clients.runtimes, stage, runtimes.history_key(params))
        work = runtimes.work_of(params)  # a job's tasks of one stage share its grid: one size
        threshold = policy.kill_after(policy.limits_for(clients.settings, stage), history, work=work)
        left = sum(1 for row in rows if row["Stage"] == stage and not TaskStatus(row["Status"]).terminal)
        remaining_s += left * (history.mean * work if history.count else threshold / clients.settings.kill_factor)
        stages[stage] = {"mean_s": history.mean * work, "runs": history.count, "left": left,
                         "histogram": histogram(durations.get(stage, []), threshold)}
    running = status["counts"][TaskStatus.RUNNING.value]
    finished = JobState(status["state"]).finished
    return status | {
        "tiles": list(tiles.values()),
        "stages": stages,
        "failed_attempts": failures[:FAILURES_SHOWN],
        # the work left (runtime history) spread over the slots busy now
        "eta_s": None if finished or not remaining_s else remaining_s / max(1, running),
    }


def quicklooks(clients: Clients, job: str) -> list[dict[str, Any]]:
    """A finished job's pictures with links and where they go on the map: its overviews
    (``kind`` "overview": the region per layer and date, with legend) and the PNG outputs of
    its tasks (``kind`` "output")."""
    found = results.manifest(clients, job)
    if found is None:
        return []
    container = clients.products.container_name
    shown = [{"kind": "overview", "tile": "region", "product": o["product"], "layer": o["layer"],
              "date": o["date"], "last": o["last"], "bounds": o["bounds"], "legend": o["legend"], "unit": o["unit"],
              "name": f"{o['product']} {o['layer']} {o['date']}{'…' + o['last'] if o['last'] else ''}",
              "url": results.sas_url(clients, container, o["map"]),
              "picture": results.sas_url(clients, container, o["picture"])} for o in found.get("overviews", [])]
    for task in found["tasks"]:
        for output in task["outputs"]:
            if output.endswith(".png"):
                shown.append({"kind": "output", "tile": task["tile"], "task": task["task"],
                              "name": output.rsplit("/", 1)[-1],
                              "bounds": lonlat_bounds(task["crs"], task["bounds"]),
                              "url": results.sas_url(clients, *results.locate(clients, output))})
    return shown
