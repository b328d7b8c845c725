"""Systematic fault injection, the fast subset: the storage calls where a lost answer or a
killed process once left a task or a job stuck (bench.faults sweeps every call of the run,
``make bench NAME=faults``). Each run is checked from storage alone: every task terminal,
one committed attempt per task, every job finished with one manifest and one email, no
index row and no cache marker left."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bagpipe.azurite import Azurite
from bench import fault_run

# (kind, the operation faulted: its first call in the clean run) — what each stands for
POINTS = [
    ("crash", "POST jobs"),  # the API dies after storing the job, before its plan message
    ("refuse", "POST plan/messages"),  # the plan message cannot be sent
    ("crash", "POST $batch [QUEUED]"),  # a releaser dies after queueing tasks, before their messages
    ("refuse", "POST tasks-N/messages"),  # a task's message cannot be sent, the release goes on
    ("drop", "POST $batch [RUNNING]"),  # a claim lands, its answer is lost
    ("crash", "POST $batch [SUCCEEDED]"),  # a worker dies right after its commit
    ("crash", "PUT products/blob"),  # a finisher dies while writing the job's outputs
]


@pytest.fixture(scope="module")
def clean(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Azurite, Path, list[str]]]:
    fault_run.warm_fork_server()
    workdir = tmp_path_factory.mktemp("faults")
    run = fault_run.run_one(azurite, workdir, 0, "")
    assert run["problems"] == [], "the clean run itself is sound"
    yield azurite, workdir, run["calls"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("kind", "operation"), POINTS, ids=[f"{k} {o}" for k, o in POINTS])
def test_a_fault_at_this_call_loses_nothing_and_doubles_nothing(
        clean: tuple[Azurite, Path, list[str]], kind: str, operation: str) -> None:
    azurite, workdir, calls = clean
    k = next(number for number, call in enumerate(calls, 1) if call.endswith(operation))
    result: dict[str, Any] = fault_run.run_one(azurite, workdir, k, kind, operation=operation)
    assert result["hit"].endswith(operation), f"the fault landed on {result['hit']!r}"
    assert result["problems"] == [], result["problems"]
    assert result["counts"].get("missing_emails", 0) == 0
