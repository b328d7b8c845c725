"""A slot's stage process: kept warm from attempt to attempt, replaced when an attempt
fails, when it is killed and when its service is over."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from pipeline.failures import FailureClass
from pipeline.settings import Settings
from pipeline.storage import names
from pipeline.storage.clients import Clients
from tests.conftest import descriptors_past_select, wait_for
from worker.child import Outcome, StageProcess
from worker.slot import Slot


def run(process: StageProcess, **params: str) -> Outcome:
    process.start("whoami", {"job": "j", "part": "j", "task": "000000001", "attempt": 1, "params": params,
                             "output_prefix": "j/tasks/000000001/a001/"})
    while (outcome := process.poll(1.0)) is None:
        pass
    return outcome


def test_a_slot_keeps_its_stage_process_and_replaces_it_when_it_failed_or_is_spent(settings: Settings) -> None:
    settings = settings.with_(stage_modules="tests.stages_for_tests")
    slot = Slot(writer=None)  # type: ignore[arg-type]
    first = slot.stage_process(settings)
    pids = [run(slot.stage_process(settings)).outputs for _ in range(3)]
    assert pids[0] == pids[1] == pids[2] and pids[0] != [str(os.getpid())], "one warm process, not the worker"
    assert os.getpgid(int(pids[0][0])) == int(pids[0][0]), "in a process group of its own"
    failed = run(slot.stage_process(settings), fail="yes")
    assert failed.failure is FailureClass.USER_CODE and "asked to fail" in failed.error
    assert slot.stage_process(settings) is not first, "a failed attempt's process is not reused"
    after = run(slot.stage_process(settings)).outputs
    assert after != pids[0]
    slot.close()

    spent = StageProcess(settings, tasks=2)
    assert run(spent).outputs == run(spent).outputs
    assert not spent.usable(), "its service is over after two attempts"
    spent.process.join(5)
    assert spent.process.exitcode == 0
    spent.close()


def test_a_worker_with_descriptors_past_1024_still_runs_and_reaps_its_stage_processes(settings: Settings) -> None:
    """A long-lived worker may hold more than 1,024 descriptors (its connection pools); the
    status pipe of a stage process it starts then lies past what select() takes."""
    settings = settings.with_(stage_modules="tests.stages_for_tests")
    with descriptors_past_select():
        process = StageProcess(settings, tasks=1)
        assert process.usable()
        (pid,) = run(process).outputs
        assert int(pid) != os.getpid()
        process.process.join(5)
        assert process.process.exitcode == 0, "reaped and its code read"
        process.close()


def test_a_killed_stage_process_takes_its_group_with_it(settings: Settings) -> None:
    settings = settings.with_(stage_modules="tests.stages_for_tests")
    process = StageProcess(settings)
    (pid,) = run(process).outputs
    process.kill(grace=1.0)
    assert not process.usable()
    assert process.process.exitcode is not None
    try:
        os.killpg(int(pid), 0)
        group_left = True
    except ProcessLookupError:
        group_left = False
    assert not group_left


def test_a_stopped_stage_unwinds_and_leaves_no_cache_marker(settings: Settings, clients: Clients) -> None:
    """A revoked or cancelled attempt is stopped with SIGTERM: the stage unwinds in its grace
    period, so the marker of the tile it was making goes with it (a cancelled task has no
    retry to tidy it up)."""
    settings = settings.with_(stage_modules="tests.stages_for_tests")
    name = f"00/{uuid.uuid4().hex}/MOD10A2.x.tif"
    marker = clients.tiles.get_blob_client(names.marker_blob(name))
    process = StageProcess(settings)
    process.start("slow_maker", {"job": "j", "part": "j", "task": "000000001", "attempt": 1, "params": {"name": name},
                                 "output_prefix": "j/tasks/000000001/a001/"})
    wait_for(marker.exists, 30, "the stage to take the tile's marker")
    process.kill(grace=10.0)
    assert process.process.exitcode == 0, "it unwound and ended on its own: not by a signal"
    assert not marker.exists()
    assert not clients.tiles.get_blob_client(name).exists()


def test_a_stopped_stage_finishes_tidying_up_however_long_its_finally_handles_errors(
        settings: Settings, tmp_path: Path) -> None:
    """SIGTERM is sent again to a stage process until it has taken: once the stage unwinds,
    the signals sent again meanwhile leave its ``finally`` alone, errors it handles there
    included."""
    note = tmp_path / "note"
    process = StageProcess(settings.with_(stage_modules="tests.stages_for_tests"))
    process.start("slow_tidy", {"job": "j", "part": "j", "task": "000000001", "attempt": 1,
                                "params": {"note": str(note)}, "output_prefix": "j/tasks/000000001/a001/"})
    # "started" is in the note once the stage is in its ``try``: the file exists, empty, a
    # moment earlier, and a stop then would find no ``finally`` to run.
    wait_for(lambda: note.exists() and note.read_text() == "started", 30, "the stage to start")
    process.kill(grace=10.0)
    assert process.process.exitcode == 0, "it unwound and ended on its own: not by a signal"
    assert note.read_text() == "tidied"

