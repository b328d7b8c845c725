"""What the portal's job page shows: the target tiles with their lon/lat bounds and task
states, a histogram of task runtimes with the monitor's kill threshold, the newest failed
and revoked attempts with links to their logs, an estimate of the time left from the
runtime history, and (once finished) the quick-looks.

All of it from the job's rollups, its plan row and one page of its failure index
(``pipeline.lifecycle.rollups``): a bounded number of rows whatever the job's size, never a read of
its task or attempt rows."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pipeline.lifecycle import jobs, policy, results, rollups, runtimes, snapshots
from pipeline.lifecycle.status import ENDED_WELL, JobState, TaskStatus
from pipeline.modis import layout
from pipeline.modis.targets import lonlat_bounds
from pipeline.storage import names
from pipeline.storage.clients import Clients

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


def histogram(seconds: list[float] | Counter[float], threshold: float | None) -> dict[str, Any]:
    """Bars of equal width from 0 to past the longest runtime; the threshold is on the axis
    when it is near (else ``threshold_beyond``: drawn at the edge, so the bars stay readable).
    ``seconds``: the runtimes, or how many ran for each duration."""
    runs = seconds if isinstance(seconds, Counter) else Counter(seconds)
    longest = max(runs, default=0.0)
    beyond = threshold is not None and longest > 0 and threshold > 3 * longest
    top = max(longest * 1.25 if beyond or threshold is None else max(longest, threshold) * 1.05, 1e-3)
    width = top / BINS
    bars = [0] * BINS
    for s, n in runs.items():
        bars[min(BINS - 1, int(s / width))] += n
    return {"width_s": width, "bars": bars, "count": sum(runs.values()), "threshold_s": threshold,
            "threshold_beyond": beyond}


def view(clients: Clients, job: str) -> dict[str, Any]:
    """The job's status with its tiles, runtimes, failures and time left."""
    row = jobs.get(clients, job)
    rollup, as_of = snapshots.look(clients, job, row.parts, row.state.finished)
    status = jobs.status(clients, job, rollup, row, as_of)
    plan = rollups.read_plan(clients.tasks, job)
    tiles = []
    for tile, (crs, bounds, total) in (plan.tiles.items() if plan else ()):
        counts = +rollup.tiles.get(tile, Counter())
        pending = total - sum(counts.values())
        if pending > 0:  # of a job cancelled while it was being planned: never planned, so cancelled
            counts[(TaskStatus.CANCELLED if row.cancelled else TaskStatus.PENDING).value] = pending
        tiles.append({"tile": tile, "bounds": lonlat_bounds(crs, bounds) if bounds else None,
                      "state": tile_state(counts), "counts": dict(counts)})

    failures = []
    for attempt in rollups.newest_failures(clients.tasks, row.parts, FAILURES_SHOWN):  # links for these only
        task, number, stage = attempt.task, attempt.attempt, attempt.stage
        failures.append({
            "task": task, "attempt": number, "stage": stage, "class": attempt.failure_class,
            "revoked_by": attempt.revoked_by or None, "error": attempt.error,
            "ended": attempt.ended_at.isoformat() if attempt.ended_at else None,
            "runtime_s": attempt.seconds(),
            "logs": {name: results.sas_url(clients, clients.logs.container_name,
                                           names.log_prefix(job, task, number) + name)
                     for name in LOG_FILES} if stage == "reduce" else {},
        })

    stages: dict[str, Any] = {}
    remaining_s = 0.0
    for stage, (total, key, work) in sorted(plan.stages.items() if plan else ()):
        history = runtimes.read(clients.runtimes, stage, key)
        threshold = policy.kill_after(policy.limits_for(clients.settings, stage), history, work=work)
        ended = sum(n for s, n in rollup.stages.get(stage, Counter()).items() if TaskStatus(s).terminal)
        left = 0 if row.cancelled else max(0, total - ended)
        remaining_s += left * (history.mean * work if history.count else threshold / clients.settings.kill_factor)
        ran = Counter({rollups.bin_seconds(b): n for b, n in rollup.runtimes.get(stage, Counter()).items()})
        stages[stage] = {"mean_s": history.mean * work, "runs": history.count, "left": left,
                         "histogram": histogram(ran, threshold)}
    running = status["counts"][TaskStatus.RUNNING.value]
    finished = JobState(status["state"]).finished
    return status | {
        "tiles": tiles,
        "stages": stages,
        "failed_attempts": failures,
        # the work left (runtime history) spread over the slots busy now
        "eta_s": None if finished or not remaining_s else remaining_s / max(1, running),
    }


def quicklooks(clients: Clients, job: str) -> list[dict[str, Any]]:
    """A finished job's pictures with links and where they go on the map: its overviews
    (``kind`` "overview": the region per layer and date, with legend) and the PNG outputs of
    its tasks (``kind`` "output") whose rasters have no overview: a program's own picture of
    what an overview shows would colour one quantity twice, each its own way (its PNG is
    still among the job's files)."""
    found = results.manifest(clients, job)
    if found is None:
        return []
    container = clients.products.container_name
    shown = [{"kind": "overview", "tile": "region", "product": o["product"], "layer": o["layer"],
              "date": o["date"], "last": o["last"], "bounds": o["bounds"], "legend": o["legend"], "unit": o["unit"],
              "name": f"{o['product']} {o['layer']} {o['date']}{'…' + o['last'] if o['last'] else ''}",
              "url": results.sas_url(clients, container, o["map"]),
              "picture": results.sas_url(clients, container, o["picture"])} for o in found.get("overviews", [])]
    drawn = {(o["product"], o["date"], o["last"]) for o in found.get("overviews", [])}
    for task in found["tasks"]:
        if layout.waits(task) and (layout.folder(task), *(d.isoformat() for d in layout.dates(task))) in drawn:
            continue
        for output in task["outputs"]:
            if output.endswith(".png"):
                shown.append({"kind": "output", "tile": task["tile"], "task": task["task"],
                              "name": output.rsplit("/", 1)[-1],
                              "bounds": lonlat_bounds(task["crs"], task["bounds"]),
                              "url": results.sas_url(clients, *results.locate(clients, output))})
    return shown
