"""A job's status as of the sweep's last pass: its rollups summed into one row, read by key.

Summing a job's rollups (``rollups.read``) takes a key-range query of its writers' rows: a
row per worker slot at work on the job (hundreds, on Azure), and on Azurite, which filters
every row of a table for every query, a query that slows as the job grows
(docs/scale.md). A scientist's portal and ``bagpipe watch`` ask for the status every few
seconds, as many of them as watch. So the sweep, once a pass, writes the sum into the job's
status row (jobs table, PK = job id, RK = ``names.STATUS_ROW``), and a look at the job reads
that row by key while it is fresh: until the time the pass wrote in it, two of its passes
later (:data:`FRESH_PASSES`: intervals and the pass's own length, which grows with the jobs
it sweeps), so its figures are at most that old (the status's ``as_of`` says when they were
summed). With none fresh (the sweep stopped, or has not passed yet), a look sums the
rollups itself.

A finished job's rollups no longer change: its row is written a last time, marked final,
by the finisher before the job row says finished, or by the first look that finds it
missing or not final (a sweep pass that read the rollups before the finish may write after
it), and is then its status for good. A sum too large for one entity is not written: its
job's looks sum the rollups.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables import UpdateMode

from pipeline.lifecycle import rollups
from pipeline.lifecycle.tasks import now
from pipeline.redact import redact
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients

log = logging.getLogger(__name__)
FRESH_PASSES = 2  # a row is read instead of the rollups for this many sweep passes (interval and length)
PARTS = 7  # each of a row's two sums in at most this many properties of rollups.PART_CHARS (an entity: 1 MiB)
SUMMARY, TILES = "Summary", "Tiles"  # the property names' stems: the sum without its tiles; the tiles'


@dataclass(frozen=True)
class Snapshot:
    """A job's rollups as summed at ``at``, to be read until ``until``; ``final``: after
    every task had ended (then for good)."""

    at: datetime
    until: datetime
    final: bool
    rollup: rollups.Rollup


def _parts(stem: str, text: str) -> dict[str, str] | None:
    size = rollups.PART_CHARS
    if len(text) > PARTS * size:
        return None
    return {f"{stem}{i}": text[start:start + size] for i, start in enumerate(range(0, len(text), size))}


def write(clients: Clients, job: str, rollup: rollups.Rollup, at: datetime,
          fresh_for: timedelta = timedelta(0), final: bool = False) -> bool:
    """Write ``rollup``, summed at ``at`` (its rows' read begun then), as the job's status
    row, to be read for ``fresh_for`` from now (replacing the row there). False, writing
    nothing, if it does not fit in one entity."""
    summary = {"counts": rollup.counts, "stages": rollup.stages, "runtimes": rollup.runtimes,
               "failures": rollup.failures, "kills": rollup.kills, "backups": rollup.backups,
               "workers": rollup.workers, "rows": rollup.rows}
    first = _parts(SUMMARY, json.dumps(summary, separators=(",", ":")))
    second = _parts(TILES, json.dumps(rollup.tiles, separators=(",", ":")))
    if first is None or second is None:
        log.info("job %s: its rollups' sum does not fit in a status row; its looks sum them", job)
        return False
    clients.jobs.upsert_entity({"PartitionKey": job, "RowKey": names.STATUS_ROW, "At": at,
                                "Until": now() + fresh_for, "Final": final, **first, **second},
                               mode=UpdateMode.REPLACE)
    return True


def read(clients: Clients, job: str, tiles: bool = True) -> Snapshot | None:
    """The job's status row (``tiles``: with the counts per tile), or None (none there, or
    one this version cannot read: then its looks sum the rollups until the sweep's next)."""
    select = None if tiles else ["At", "Until", "Final", *(f"{SUMMARY}{i}" for i in range(PARTS))]
    try:
        row = clients.jobs.get_entity(job, names.STATUS_ROW, select=select)
    except ResourceNotFoundError:
        return None
    try:
        return _parsed(row, tiles)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("job %s: its status row is not readable (%s); its looks sum the rollups", job, exc)
        return None


def _parsed(row: dict[str, Any], tiles: bool) -> Snapshot:
    summary = json.loads(_joined(row, SUMMARY))
    rollup = rollups.Rollup(
        counts=Counter(summary["counts"]), failures=Counter(summary["failures"]), kills=summary["kills"],
        backups=summary["backups"], rows=summary["rows"],
        stages={stage: Counter(counts) for stage, counts in summary["stages"].items()},
        runtimes={stage: Counter({int(b): n for b, n in bins.items()}) for stage, bins in summary["runtimes"].items()},
        workers={worker: Counter(figures) for worker, figures in summary["workers"].items()},
        tiles={tile: Counter(counts) for tile, counts in json.loads(_joined(row, TILES) or "{}").items()}
        if tiles else {})
    return Snapshot(row["At"], row["Until"], bool(row["Final"]), rollup)


def final(clients: Clients, job: str, parts: list[str], summed: rollups.Rollup | None = None,
          began: datetime | None = None) -> None:
    """Write the job's final row, every task of it ended: its rollups ``summed`` at
    ``began`` (by a look), or summed here (by the finisher, its last step before the job row
    says finished). A failure is logged and left to the next look."""
    began = began or now()
    try:
        write(clients, job, rollups.read(clients.tasks, parts) if summed is None else summed, began, final=True)
    except AzureError as exc:
        log.warning("job %s: its final status row not written: %s", job, redact(str(exc)))


def fresh_for(settings: Settings, pass_s: float) -> timedelta:
    """How long a row the sweep writes is read: :data:`FRESH_PASSES` passes, each an
    interval and (about) the length of the pass writing it, ``pass_s``."""
    return timedelta(seconds=FRESH_PASSES * (settings.monitor_interval_s + pass_s))


def _joined(row: dict[str, Any], stem: str) -> str:
    return "".join(row.get(f"{stem}{i}") or "" for i in range(PARTS))


def look(clients: Clients, job: str, parts: list[str], finished: bool,
         tiles: bool = True) -> tuple[rollups.Rollup, datetime | None]:
    """The job's rollups for a look at it, and when they were summed (None: now). Its
    status row if that is fresh, or final for a finished job; else the rollups, summed here
    (and, the job finished, written as its final row)."""
    found = read(clients, job, tiles)
    if found is not None and (found.final if finished else now() <= found.until):
        return found.rollup, found.at
    began = now()
    summed = rollups.read(clients.tasks, parts, tiles=tiles or finished)
    if finished:
        final(clients, job, parts, summed, began)  # failing, the look has its figures all the same
    return summed, None
