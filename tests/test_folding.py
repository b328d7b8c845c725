"""The rollup rows of writers gone quiet, folded by the sweep into one row per partition: a
job's status the same before and after, a look reading a row per partition once its writers
are folded, a writer whose row was folded writing into a new one, and a fold beaten by a
writer's write changing nothing."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from pipeline.lifecycle import jobs, rollups, sweep, tasks
from pipeline.lifecycle.status import JobState
from pipeline.requests import application
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import running_control, running_workers, small_request, wait_for, with_stage

BUCKETS = 3
PART = "j20261125-000000-f01d00"


@pytest.fixture
def eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every writer counts as quiet, and two quiet rows are enough to fold."""
    monkeypatch.setattr(rollups, "FOLD_IDLE_S", -60.0)
    monkeypatch.setattr(rollups, "FOLD_AT", 2)


def everything(clients: Clients, job: str) -> dict[str, Any]:
    """All a job's rollups say: its status (with the worker table) and its counts per tile,
    per stage and per runtime bin."""
    row = jobs.get(clients, job)
    found = rollups.read(clients.tasks, row.parts)
    status = jobs.status(clients, job)
    return {"status": {k: status[k] for k in ("counts", "failures", "monitor_kills", "speculative_attempts")},
            "workers": {w["worker"]: (w["attempts"], w["committed"]) for w in status["workers"]},
            "tiles": found.tiles, "stages": found.stages, "runtimes": found.runtimes}


def finished_job(settings: Settings) -> tuple[Clients, str]:
    """A job of 24 tasks over three partitions, one of them retried after a lost connection,
    run to its end by two workers of two slots, with the control loop and its sweep."""
    settings = with_stage(settings.with_(partitions=BUCKETS, shards=BUCKETS), "flaky")
    clients = Clients(settings)
    clients.ensure_resources()
    with running_control(settings), running_workers(settings, count=2):
        job = application.submit(clients, small_request(start="2022-01-01", end="2022-03-31")).job
        wait_for(lambda: jobs.get(clients, job).state.finished, 120, "the job to end")
    assert jobs.get(clients, job).state is JobState.SUCCEEDED
    return clients, job


def test_folding_keeps_a_job_s_status_whole_and_a_look_then_reads_a_row_per_partition(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    clients, job = finished_job(settings)
    parts = jobs.get(clients, job).parts
    before = everything(clients, job)
    assert before["status"]["failures"] == {"connection_failure": 1} and len(before["workers"]) == 2
    rows_before = rollups.read(clients.tasks, parts).rows
    assert rows_before > 2 * BUCKETS, "several writers in each partition"
    monkeypatch.setattr(rollups, "FOLD_IDLE_S", -60.0)
    monkeypatch.setattr(rollups, "FOLD_AT", 2)
    assert sum(rollups.fold(clients.tasks, part) for part in parts) == rows_before
    assert rollups.read(clients.tasks, parts).rows == BUCKETS
    assert everything(clients, job) == before
    assert sum(rollups.fold(clients.tasks, part) for part in parts) == 0, "nothing left to fold"


def test_a_job_whose_writers_are_folded_as_it_runs_ends_with_every_count_right(
        settings: Settings, eager: None) -> None:
    clients, job = finished_job(settings)  # the sweep folds every writer's row at each pass
    status = jobs.status(clients, job)
    assert status["counts"]["SUCCEEDED"] == 24 and status["failures"] == {"connection_failure": 1}
    assert sorted(status["counts"].values()) == [0] * (len(status["counts"]) - 1) + [24]
    assert (sum(w["attempts"] for w in status["workers"]), sum(w["committed"] for w in status["workers"])) == (25, 24)
    folded = [part for part in jobs.get(clients, job).parts if rollups.folded_workers(
        clients.tasks.get_entity(part, names.FOLDED_ROW))]
    assert folded, "the sweep folded the workers' rows while the job ran"


def counts(clients: Clients) -> Counter[str]:
    return tasks.state_counts(clients.tasks, [PART])


def test_a_writer_whose_row_was_folded_writes_into_a_new_one(clients: Clients, eager: None) -> None:
    writers = [rollups.RollupWriter(f"w{i}~0") for i in range(3)]
    for writer in writers:
        writer.write(clients.tasks, PART, [], {"SUCCEEDED": 1})
    assert rollups.fold(clients.tasks, PART) == 3
    writers[0].write(clients.tasks, PART, [], {"SUCCEEDED": 1})  # its row gone: written anew
    writers[0].write(clients.tasks, PART, [], {"DEAD": 1})
    assert counts(clients) == Counter(SUCCEEDED=4, DEAD=1)
    found = rollups.read(clients.tasks, [PART])
    assert found.rows == 2 and found.workers["w0"] == Counter(committed=2, failed=0, running=0)
    assert rollups.fold(clients.tasks, PART) == 0, "one quiet row is not enough"


def test_a_fold_beaten_by_a_writer_changes_nothing_and_the_next_one_folds(
        clients: Clients, eager: None, monkeypatch: pytest.MonkeyPatch) -> None:
    writers = [rollups.RollupWriter(f"w{i}~0") for i in range(3)]
    for writer in writers:
        writer.write(clients.tasks, PART, [], {"SUCCEEDED": 1})
    real = rollups.apply
    raced: list[bool] = []

    def apply(props: dict[str, Any], moves: rollups.Moves) -> dict[str, Any]:
        if not raced:
            raced.append(True)  # between the fold's read and its write, a writer writes
            writers[1].write(clients.tasks, PART, [], {"SUCCEEDED": 1})
        return real(props, moves)

    monkeypatch.setattr(rollups, "apply", apply)
    assert rollups.fold(clients.tasks, PART) == 0 and raced
    monkeypatch.undo()
    assert counts(clients) == Counter(SUCCEEDED=4) and rollups.read(clients.tasks, [PART]).rows == 3
    monkeypatch.setattr(rollups, "FOLD_IDLE_S", -60.0)
    monkeypatch.setattr(rollups, "FOLD_AT", 2)
    assert rollups.fold(clients.tasks, PART) == 3
    assert counts(clients) == Counter(SUCCEEDED=4)
    assert rollups.read(clients.tasks, [PART]).workers["w1"]["committed"] == 2


def test_the_sweep_folds_the_quiet_writers_of_a_running_job(settings: Settings, eager: None) -> None:
    clients = Clients(settings.with_(partitions=BUCKETS, shards=BUCKETS))
    clients.ensure_resources()
    job = application.submit(clients, small_request(start="2022-01-01", end="2022-03-31")).job
    sweep.handle_plan(clients, f'{{"job": "{job}"}}'.encode())  # released: a mover's row in each partition
    parts = jobs.get(clients, job).parts
    other = rollups.RollupWriter("other")
    for part in parts:
        other.write(clients.tasks, part, [], {"DEAD": 1})
    before = rollups.read(clients.tasks, parts, tiles=False).counts
    assert sweep.sweep(clients)["folded"] == 2 * BUCKETS
    after = rollups.read(clients.tasks, parts, tiles=False)
    assert after.counts == before and after.rows == BUCKETS


def test_a_rollup_row_stays_within_an_entity_whatever_the_tiles_it_counts(clients: Clients, eager: None) -> None:
    """A writer's counts per tile grow with the tiles it moved (a slot of a 50,000-task job
    reached 22,000 of a property's 32,000 characters): its row goes on in a new one before
    any property, or the row, outgrows what one entity holds, and so does the folded row."""
    tiles = [f"h{n // 36:02d}v{n % 36:02d}-{n:05d}" for n in range(30_000)]
    writers = [rollups.RollupWriter(f"w{i}~0") for i in range(2)]
    for writer in writers:
        for first in range(0, len(tiles), 1_000):
            moves = rollups.Moves()
            for tile in tiles[first:first + 1_000]:
                moves.move("digest", tile, "RUNNING", "SUCCEEDED")
            writer.write(clients.tasks, PART, [], moves)

    def within() -> list[str]:
        rows = list(rollups.rows(clients.tasks, [PART]))
        for row in rows:
            texts = [len(v) for k, v in row.items() if isinstance(v, str) and k not in ("PartitionKey", "RowKey")]
            assert max(texts) <= rollups.PART_CHARS and sum(texts) <= rollups.ROW_CHARS, row["RowKey"]
        return [row["RowKey"] for row in rows]

    keys = within()
    assert len(keys) > len(writers), "each writer went on in rows of its own"
    found = rollups.read(clients.tasks, [PART])
    assert found.tiles == {tile: Counter(RUNNING=-2, SUCCEEDED=2) for tile in tiles}  # every row summed
    assert found.workers["w0"] == Counter(committed=30_000, failed=0, running=-30_000)
    rollups.FOLD_AT = 1
    while rollups.fold(clients.tasks, PART):
        pass
    assert all(names.spill_of(key)[0] == names.FOLDED_ROW for key in within())
    folded = rollups.read(clients.tasks, [PART])
    assert (folded.tiles, folded.workers, folded.counts) == (found.tiles, found.workers, found.counts)
