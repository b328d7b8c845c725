"""A job's status at constant cost: rollups the transitions keep beside the task rows.

Reading a job's status must cost the same at 100 tasks and at a million, so nothing that
shows it reads task or attempt rows. Every transition (``pipeline.lifecycle.transitions``) writes,
in the entity-group transaction that moves its task row, what the move changes in its
writer's own *rollup row* of the task's partition (RK ``~count~{writer}``; one per worker
slot, releaser, monitor or canceller, so they never contend): the number of tasks in each
state the writer moved them into or out of (net), per target tile and per stage as well, the
runtimes of the attempts it committed as a histogram of logarithmic bins, and the
failure classes of the attempts it failed or revoked. A failed or revoked attempt also
gets an entry in the job's *failure index* (RK ``~failure~{inverted ms}-…``, newest
first) in the same transaction. At planning, one row (``~tiles``) names the job's target
tiles (their grid and bounds) and the tasks each has, and each stage's total.

PENDING is never counted: it is what is planned and not yet moved. FAILED and TIMED_OUT
are never stored (a failed attempt moves its task straight on, to QUEUED or DEAD). Being
written in the same transactions as the rows they sum, the rollups are exact; their sum
over writers is read with one key-range query per partition of the job, the failure index
with one bounded query per partition (``pipeline.lifecycle.partitions``). The sweep folds
the rows of writers gone quiet into one row per partition (:func:`fold`), so a look reads
a row per writer at work lately and the folded rows, whatever the job's size and however
many workers it has had. A row's counts per tile grow with the tiles its writer moved, so
a row that would outgrow what one entity holds (:func:`fits`) goes on in a new row of the
same writer (``~count~{writer}!{n}``; the folded row as ``~count~~folded!{n}``): every row
is summed alike, and none is ever refused for its size, whatever the job's size. A look at
a job reads their sum as the sweep last wrote it, in one row (``pipeline.lifecycle.snapshots``),
while that is fresh.
"""

from __future__ import annotations

import json
import math
import threading
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableClient, TableEntity, TableTransactionError, UpdateMode

from pipeline import planning
from pipeline.lifecycle import partitions
from pipeline.lifecycle.attempts import AttemptRow
from pipeline.lifecycle.status import ENDED_WELL, TaskStatus
from pipeline.planning import TaskPlan
from pipeline.storage import names

UNCOUNTED = frozenset({TaskStatus.PENDING, TaskStatus.FAILED, TaskStatus.TIMED_OUT})
DETAIL = "Detail"  # JSON: per stage its states, its runtimes' bins; the failure classes
KILLS = "Kills"  # attempts revoked by the monitor
BACKUPS = "Backups"  # backup attempts the monitor asked for (``pipeline.lifecycle.speculation``)
TILE_SHARDS = 16  # per-tile counts are spread over this many properties (64 KiB each at most)
PER_DECADE = 10  # runtime bins: ten per factor of ten (each 26% wide)
SHORTEST_S = 0.01  # bin 0 holds every runtime below this
LAST_BIN = 100  # 0.01 s × 10^10: nothing runs longer
PART_CHARS = 30_000  # a string property holds 64 KiB of UTF-16
ROW_CHARS = 400_000  # an entity holds 1 MiB: a rollup row past this goes on in a new one (``fits``)
PLAN_PARTS = 16  # the plan row's JSON, cut into parts: at most about 1 MiB in all
FOLD_IDLE_S = 30.0  # a writer's rollup row untouched this long is folded (``fold``)
FOLD_AT = 8  # quiet writers' rows in a partition before they are folded
FOLD_MAX = 99  # rows folded in one transaction (with the folded row: the service's 100 operations)
WORKER_SHARDS = 8  # a folded row's per-worker figures, spread over this many properties (about 9,000 workers)


def runtime_bin(seconds: float) -> int:
    """The histogram bin of a runtime."""
    if seconds < SHORTEST_S:
        return 0
    return min(LAST_BIN, 1 + int(PER_DECADE * math.log10(seconds / SHORTEST_S)))


def bin_seconds(index: int) -> float:
    """The runtime a bin stands for: its geometric middle."""
    return SHORTEST_S / 2 if index == 0 else SHORTEST_S * 10 ** ((index - 0.5) / PER_DECADE)


def tile_property(tile: str) -> str:
    return f"Tiles{zlib.crc32(tile.encode()) % TILE_SHARDS:02d}"


@dataclass
class Moves:
    """What one transaction changes in its writer's rollup row."""

    counts: Counter[str] = field(default_factory=Counter)
    tiles: dict[str, Counter[str]] = field(default_factory=dict)
    stages: dict[str, Counter[str]] = field(default_factory=dict)
    runtimes: dict[str, Counter[str]] = field(default_factory=dict)
    failures: Counter[str] = field(default_factory=Counter)
    kills: int = 0
    backups: int = 0

    def move(self, stage: str, tile: str, old: TaskStatus | str, new: TaskStatus | str) -> Moves:
        """One task of ``stage`` on ``tile`` (a task of several places names them all, and
        counts in each: ``planning.places_of``) went from ``old`` to ``new``."""
        for status, delta in ((TaskStatus(old), -1), (TaskStatus(new), 1)):
            if status not in UNCOUNTED:
                self.counts[status.value] += delta
                for place in planning.places_of(tile):
                    self.tiles.setdefault(place, Counter())[status.value] += delta
                self.stages.setdefault(stage, Counter())[status.value] += delta
        return self

    def ran(self, stage: str, seconds: float) -> Moves:
        self.runtimes.setdefault(stage, Counter())[str(runtime_bin(seconds))] += 1
        return self

    def failed(self, failure: str, revoked: bool = False) -> Moves:
        self.failures[failure] += 1
        self.kills += revoked
        return self

    def backed_up(self) -> Moves:
        """A backup attempt was asked for."""
        self.backups += 1
        return self

    def merged(self, other: Moves) -> Moves:
        """These moves and ``other``'s together (neither changed)."""
        # (Counter's + would drop the negative counts)
        both = Moves(kills=self.kills + other.kills, backups=self.backups + other.backups)
        for counts in (self.counts, other.counts):
            both.counts.update(counts)
        both.failures.update(self.failures)
        both.failures.update(other.failures)
        for part in ("tiles", "stages", "runtimes"):
            into: dict[str, Counter[str]] = getattr(both, part)
            for source in (getattr(self, part), getattr(other, part)):
                for key, counts in source.items():
                    into.setdefault(key, Counter()).update(counts)
        return both


def _add(into: dict[str, int], deltas: Counter[str]) -> None:
    for key, delta in deltas.items():
        value = into.get(key, 0) + delta
        if value:
            into[key] = value
        else:
            into.pop(key, None)


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def apply(props: dict[str, Any], moves: Moves) -> dict[str, Any]:
    """The properties of a rollup row (``props``) that ``moves`` change, with their new values."""
    changed: dict[str, Any] = {}
    for status, delta in moves.counts.items():
        if delta:
            changed[status] = int(props.get(status, 0)) + delta
    if moves.kills:
        changed[KILLS] = int(props.get(KILLS, 0)) + moves.kills
    if moves.backups:
        changed[BACKUPS] = int(props.get(BACKUPS, 0)) + moves.backups
    if moves.stages or moves.runtimes or moves.failures:
        detail = json.loads(props.get(DETAIL) or "{}")
        for part, deltas in (("stages", moves.stages), ("runtimes", moves.runtimes)):
            for stage, counts in deltas.items():
                _add(detail.setdefault(part, {}).setdefault(stage, {}), counts)
        _add(detail.setdefault("failures", {}), moves.failures)
        changed[DETAIL] = _compact(detail)
    shards: dict[str, dict[str, dict[str, int]]] = {}
    for tile, counts in moves.tiles.items():
        name = tile_property(tile)
        if name not in shards:
            shards[name] = json.loads(props.get(name) or "{}")
        _add(shards[name].setdefault(tile, {}), counts)
        if not shards[name][tile]:
            del shards[name][tile]
    changed |= {name: _compact(tiles) for name, tiles in shards.items()}
    return changed


@dataclass
class Rollup:
    """A job's rollups summed over their writers."""

    counts: Counter[str] = field(default_factory=Counter)
    tiles: dict[str, Counter[str]] = field(default_factory=dict)
    stages: dict[str, Counter[str]] = field(default_factory=dict)
    runtimes: dict[str, Counter[int]] = field(default_factory=dict)
    failures: Counter[str] = field(default_factory=Counter)
    kills: int = 0
    backups: int = 0
    rows: int = 0  # rollup rows read (one per writer not folded yet, and the folded rows)
    workers: dict[str, Counter[str]] = field(default_factory=dict)  # per worker: committed, failed, running


def moves_of(row: Mapping[str, Any]) -> Moves:
    """What a rollup row holds, as the moves that would make it from nothing."""
    detail = json.loads(row.get(DETAIL) or "{}")
    moves = Moves(counts=Counter({s.value: int(row[s.value]) for s in TaskStatus if row.get(s.value)}),
                  failures=Counter(detail.get("failures", {})), kills=int(row.get(KILLS) or 0),
                  backups=int(row.get(BACKUPS) or 0))
    moves.stages = {stage: Counter(counts) for stage, counts in detail.get("stages", {}).items()}
    moves.runtimes = {stage: Counter(bins) for stage, bins in detail.get("runtimes", {}).items()}
    for shard in range(TILE_SHARDS):
        tiles = json.loads(row.get(f"Tiles{shard:02d}") or "{}")
        moves.tiles |= {tile: Counter(counts) for tile, counts in tiles.items()}
    return moves


def workers_of(row: Mapping[str, Any], moves: Moves) -> dict[str, Counter[str]]:
    """What the rollup ``row`` (read as ``moves``) says of the workers, for the job's worker
    table, per worker: attempts committed, failed, and its net claims still running. A
    folded row keeps them per worker; a worker slot's row is its worker's; any other
    writer's (a releaser, the monitor) says nothing of them."""
    first = names.spill_of(row["RowKey"])[0]
    if first == names.FOLDED_ROW:
        return folded_workers(row)
    worker = names.worker_of(first.removeprefix(names.COUNTER_PREFIX))
    if worker is None:
        return {}
    committed = sum(moves.counts.get(status.value, 0) for status in ENDED_WELL)
    return {worker: Counter(committed=committed, failed=sum(moves.failures.values()),
                            running=moves.counts.get(TaskStatus.RUNNING.value, 0))}


def folded_workers(row: Mapping[str, Any]) -> dict[str, Counter[str]]:
    """The worker table's figures a folded row keeps, per worker."""
    found: dict[str, Counter[str]] = {}
    for shard in range(WORKER_SHARDS):
        for worker, (committed, failed, running) in json.loads(row.get(f"Workers{shard}") or "{}").items():
            found[worker] = Counter(committed=committed, failed=failed, running=running)
    return found


def rows(tasks: TableClient, parts: list[str], select: list[str] | None = None) -> Iterator[TableEntity]:
    """The rollup rows of the partitions ``parts`` (``select``: these properties only): one
    key-range query each."""
    return partitions.query(tasks, parts, "RowKey ge @lo and RowKey lt @hi",
                            {"lo": names.COUNTER_PREFIX, "hi": names.COUNTER_PREFIX + "\U0010ffff"}, select=select)


def read(tasks: TableClient, parts: list[str], tiles: bool = True) -> Rollup:
    """The rollups of a job (its partitions ``parts``): one key-range query per partition, a
    row per writer there not folded yet and the folded row (``tiles``: with the counts per
    tile, which grow with the job's area; without, a few hundred bytes a row)."""
    select = None if tiles else ["RowKey", *(s.value for s in TaskStatus), KILLS, BACKUPS, DETAIL,
                                 *(f"Workers{shard}" for shard in range(WORKER_SHARDS))]
    return summed(rows(tasks, parts, select))


def summed(found_rows: Iterable[Mapping[str, Any]]) -> Rollup:
    """The sum of rollup rows (those ``read`` queries, or that ``fold`` read: folding moves
    sums between rows, so a partition's rows read before it sum to what they do after)."""
    found = Rollup()
    for row in found_rows:
        found.rows += 1
        moves = moves_of(row)
        found.counts.update(moves.counts)
        found.kills += moves.kills
        found.backups += moves.backups
        found.failures.update(moves.failures)
        for into, part in ((found.stages, moves.stages), (found.tiles, moves.tiles)):
            for key, counts in part.items():
                into.setdefault(key, Counter()).update(counts)
        for stage, bins in moves.runtimes.items():
            found.runtimes.setdefault(stage, Counter()).update({int(b): n for b, n in bins.items()})
        for worker, figures in workers_of(row, moves).items():
            found.workers.setdefault(worker, Counter()).update(figures)
    found.counts = +found.counts
    return found


# --- the writers: a row each, moved in the transaction of every move ----------------------------
class RollupWriter:
    """One writer's rollup row per partition of a job: the tasks it moved into and out of
    each state (per tile and stage too), the runtimes it committed, the failures it recorded.

    Each writer (a worker slot, a releaser, the monitor, a canceller) owns its own row, so
    the rows never contend; their sum over the job's partitions is the job's. The row is
    updated in the same transaction as every move it counts.
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._rows: dict[str, tuple[str, str | None, dict[str, Any]]] = {}  # per partition: key, ETag, properties
        self._lock = threading.Lock()

    def _load(self, tasks: TableClient, part: str) -> tuple[str, str | None, dict[str, Any]]:
        """This writer's latest row of ``part`` (one key-range query for the row it started
        with and its continuations), or the key of a new one."""
        first = names.counter_key(self.owner)
        found = max(tasks.query_entities("PartitionKey eq @pk and RowKey ge @lo and RowKey lt @hi", parameters={
            "pk": part, "lo": first, "hi": first + chr(ord(names.SPILL_MARK) + 1)}),
            key=lambda row: names.spill_of(row["RowKey"])[1], default=None)
        if found is None:
            return first, None, {}
        return found["RowKey"], found.metadata["etag"], {k: v for k, v in found.items()
                                                          if k not in ("PartitionKey", "RowKey")}

    def _row(self, tasks: TableClient, part: str) -> tuple[str, str | None, dict[str, Any]]:
        """This writer's row of ``part`` as last written (read if not known): key, ETag,
        properties."""
        if part not in self._rows:
            self._rows[part] = self._load(tasks, part)
        return self._rows[part]

    def write(self, tasks: TableClient, part: str, changes: list[tuple[str, dict[str, Any], dict[str, Any]]],
              added: dict[str, int] | Moves) -> list[dict[str, Any]]:
        """Submit task-row ``changes`` (all in partition ``part``) with this writer's row of
        that partition moved by ``added`` (counts per state, or a move's moves), in one
        transaction. Raises TableTransactionError if any task row changed meanwhile. A
        transaction refused because the sweep folded this writer's row meanwhile
        (``fold`` deletes it; a row quiet for that long is not one this write just
        moved) is made again once, with a new row: nothing of the first applied."""
        moves = added if isinstance(added, Moves) else Moves(counts=Counter(added))
        with self._lock:
            known = self._row(tasks, part)[1]
            try:
                return self._submit(tasks, part, changes, moves)
            except TableTransactionError:
                # read again: still there, a task row changed (or this writer's own last write
                # applied with its answer lost, the client's retry refused): the caller's to settle
                if known is None or self._row(tasks, part)[1] is not None:
                    raise
            return self._submit(tasks, part, changes, moves)  # folded meanwhile: gone, written anew

    def _submit(self, tasks: TableClient, part: str, changes: list[tuple[str, dict[str, Any], dict[str, Any]]],
                moves: Moves) -> list[dict[str, Any]]:
        key, etag, props = self._row(tasks, part)
        changed = apply(props, moves)
        if not changed:
            return [dict(answer) for answer in tasks.submit_transaction(changes)] if changes else []
        if etag is not None and not fits(props | changed):  # full: its moves go on in a new row
            first, n = names.spill_of(key)
            key, etag, props = names.spilled(first, n + 1), None, {}
            changed = apply(props, moves)
        keys = {"PartitionKey": part, "RowKey": key}
        op = ("create", keys | props | changed) if etag is None else (
            "update", keys | changed, {"mode": UpdateMode.MERGE, "etag": etag,
                                       "match_condition": MatchConditions.IfNotModified})
        try:
            result = tasks.submit_transaction([*changes, op])
        except Exception:
            del self._rows[part]  # read again next time: the row may be what failed, or
            raise  # the transaction may have been applied before the connection broke
        self._rows[part] = (key, result[-1]["etag"], props | changed)
        return [dict(answer) for answer in result[:-1]]


def fits(props: Mapping[str, Any]) -> bool:
    """Whether a rollup row of these properties is within what one entity holds: no string
    property past :data:`PART_CHARS`, all of them within :data:`ROW_CHARS`."""
    texts = [len(value) for value in props.values() if isinstance(value, str)]
    return max(texts, default=0) <= PART_CHARS and sum(texts) <= ROW_CHARS


# the rollup row of this process's moves made without a writer of their own (releases, settles)
MOVER = RollupWriter(f"mover-{uuid.uuid4().hex[:12]}")


# --- folding: the rows of quiet writers, one row per partition -------------------------------
def fold(tasks: TableClient, part: str, found: list[TableEntity] | None = None) -> int:
    """Fold the rollup rows of partition ``part`` whose writers have written nothing for
    :data:`FOLD_IDLE_S` into its folded row (``names.FOLDED_ROW``; a new one of its own once
    it is full: ``fits``), once there are :data:`FOLD_AT` of them, so that a look at the job
    reads a row per writer at work lately, not per writer that ever was. One transaction: the folded row moved by their
    sums, and each row deleted, each fenced on the ETag it was read with; a writer that
    wrote meanwhile fails it whole (the next pass folds again), and a writer whose row was
    folded writes its next moves into a new one (:class:`RollupWriter`). Returns how
    many rows it folded. ``found``: the partition's rollup rows, if the caller has just read
    them (``rows``, every property)."""
    quiet_since = datetime.now(UTC) - timedelta(seconds=FOLD_IDLE_S)
    found = list(rows(tasks, [part])) if found is None else found
    folded = [row for row in found if names.spill_of(row["RowKey"])[0] == names.FOLDED_ROW]
    into = max(folded, key=lambda row: names.spill_of(row["RowKey"])[1], default=None)
    quiet = [row for row in found if names.spill_of(row["RowKey"])[0] != names.FOLDED_ROW
             and (row.metadata["timestamp"] or quiet_since) < quiet_since][:FOLD_MAX]
    if len(quiet) < FOLD_AT:
        return 0
    props: dict[str, Any] = {k: v for k, v in (into or {}).items() if k not in ("PartitionKey", "RowKey")}
    key = into["RowKey"] if into is not None else names.FOLDED_ROW
    moves, workers, folding, changed = Moves(), dict[str, Counter[str]](), list[TableEntity](), dict[str, Any]()
    for row in quiet:  # as many as the folded row holds (``fits``); a full one goes on in a new row
        its, theirs = moves_of(row), workers_of(row, moves_of(row))
        trial = _folded(props, moves.merged(its), _added(workers, theirs))
        if not fits(props | trial):
            if folding:
                break  # the next pass folds the rest
            key, props, into = names.spilled(names.FOLDED_ROW, names.spill_of(key)[1] + 1), {}, None
            trial = _folded(props, its, theirs)
        moves, workers, changed = moves.merged(its), _added(workers, theirs), trial
        folding.append(row)
    keys = {"PartitionKey": part, "RowKey": key}
    write = ("create", keys | props | changed) if into is None else (
        "update", keys | changed, {"mode": UpdateMode.MERGE, "etag": into.metadata["etag"],
                                   "match_condition": MatchConditions.IfNotModified})
    deletes = [("delete", {"PartitionKey": part, "RowKey": row["RowKey"]},
                {"etag": row.metadata["etag"], "match_condition": MatchConditions.IfNotModified}) for row in folding]
    try:
        tasks.submit_transaction([write, *deletes])
    except TableTransactionError:
        return 0  # a writer wrote meanwhile, or another pass folded first: the next pass looks again
    return len(folding)


def _added(workers: dict[str, Counter[str]], more: dict[str, Counter[str]]) -> dict[str, Counter[str]]:
    """The worker table's figures of ``workers`` and ``more`` together (neither changed; a
    net count of running claims may be negative, which Counter's + would drop)."""
    both = {worker: Counter(figures) for worker, figures in workers.items()}
    for worker, figures in more.items():
        both.setdefault(worker, Counter()).update(figures)
    return both


def _folded(props: dict[str, Any], moves: Moves, workers: dict[str, Counter[str]]) -> dict[str, Any]:
    """The properties of a folded row (``props``) that folding ``moves`` and the figures of
    ``workers`` into it change, with their new values."""
    changed = apply(props, moves)
    every = _added(folded_workers(props), workers)
    shards: dict[str, dict[str, list[int]]] = {f"Workers{shard}": {} for shard in range(WORKER_SHARDS)}
    for worker, figures in every.items():
        shard = f"Workers{zlib.crc32(worker.encode()) % WORKER_SHARDS}"
        shards[shard][worker] = [figures["committed"], figures["failed"], figures["running"]]
    return changed | {name: _compact(found) for name, found in shards.items() if found or props.get(name)}


# --- the plan: tiles and totals, written once ------------------------------------------------
@dataclass
class Plan:
    """What a job was planned as: per target tile its grid, bounds and task count; per
    stage its task count, the key of its runtime history and each task's work (the unit
    its history is kept in: ``planning.TaskPlan.work``)."""

    tiles: dict[str, tuple[str, str, int]]
    stages: dict[str, tuple[int, str, float]]  # count, runtime history key, work per task


def plan_row(job: str, plan: list[TaskPlan]) -> dict[str, Any]:
    """The ``~tiles`` row of a job planned as ``plan``: its places (a task's ``tile``, with
    the ``crs`` and ``bounds`` its parameters give; a task of several places counts in
    each). A job of more tiles than the row holds keeps their totals only (no bounds: the
    map leaves them out)."""
    tiles: dict[str, list[Any]] = {}
    stages: dict[str, list[Any]] = {}
    for task in plan:
        for place in planning.places(task.params):
            tile = place.get("tile", "")
            if tile not in tiles:
                tiles[tile] = [place.get("crs", ""), place.get("bounds", ""), 0]
            tiles[tile][2] += 1
        if task.stage not in stages:  # a job's tasks of one stage share its grid: one size of work
            stages[task.stage] = [0, task.history, task.work]
        stages[task.stage][0] += 1
    text = _compact({"tiles": tiles, "stages": stages})
    if len(text) > PART_CHARS * PLAN_PARTS:
        text = _compact({"tiles": {t: ["", "", v[2]] for t, v in tiles.items()}, "stages": stages})
    parts = [text[i:i + PART_CHARS] for i in range(0, len(text), PART_CHARS)][:PLAN_PARTS]
    return {"PartitionKey": job, "RowKey": names.TILES_ROW, **{f"Part{i:02d}": p for i, p in enumerate(parts)}}


def read_plan(tasks: TableClient, job: str) -> Plan | None:
    """The job's plan row, or None (a job planned before the rollups were kept)."""
    try:
        row = tasks.get_entity(job, names.TILES_ROW)
    except ResourceNotFoundError:
        return None
    try:
        found = json.loads("".join(row[f"Part{i:02d}"] for i in range(PLAN_PARTS) if f"Part{i:02d}" in row))
    except ValueError:
        return None  # cut short: more tiles than any job has
    return Plan({t: (crs, bounds, int(n)) for t, (crs, bounds, n) in found["tiles"].items()},
                {s: (int(v[0]), v[1], float(v[2]) if len(v) > 2 else 1.0) for s, v in found["stages"].items()})


# --- the failure index -----------------------------------------------------------------------
def failure_op(part: str, task: str, attempt: int, stage: str, failure: str, error: str,
               started: datetime | None, ended: datetime, revoked_by: str = "") -> tuple[Any, ...]:
    """The failure index's entry of one failed (or revoked) attempt, in its task's partition."""
    key = names.failure_key(int(ended.timestamp() * 1000), task, attempt)
    row = AttemptRow.as_stored(part=part, key=key, task=task, attempt=attempt, stage=stage, failure_class=failure,
                               error=error, revoked_by=revoked_by, ended_at=ended,
                               **({"started_at": started} if started else {}))
    return ("upsert", row, {"mode": UpdateMode.REPLACE})


def newest_failures(tasks: TableClient, parts: list[str], limit: int) -> list[AttemptRow]:
    """The ``limit`` newest failed or revoked attempts of a job (its partitions ``parts``),
    as their attempt rows were when they ended: one page of one key range per partition,
    newest first."""
    low, high = names.FAILURE_PREFIX, names.FAILURE_PREFIX + "\U0010ffff"
    rows = partitions.query(tasks, parts, "RowKey ge @lo and RowKey lt @hi", {"lo": low, "hi": high}, limit=limit)
    return sorted((AttemptRow.from_entity(row) for row in rows), key=lambda row: row.key)[:limit]
