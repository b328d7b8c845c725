"""Systematic fault injection, the fast subset: the storage calls where a lost answer or a
killed process once left a task or a job stuck (``python -m tests.harness.faults`` sweeps every
call of the run, ``make faults``). Each run is checked from storage alone: every task terminal,
one committed attempt per task, every job finished with one manifest and exactly one email
(sent once: not even twice under one Message-ID), no index row and no cache marker left."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bagpipe.azurite import Azurite
from tests.harness import fault_run

# (kind, the point faulted: a call named by what it does, and which of those calls) — what each stands for
POINTS = [
    ("crash", "api POST jobs#1"),  # the API dies after storing the job, before its plan message
    ("refuse", "api POST plan/messages#1"),  # the plan message cannot be sent
    ("crash", "control POST $batch{dispatch,rollup,task} [QUEUED]#1"),  # a releaser dies after queueing tasks
    ("refuse", "control POST tasks-N/messages#1"),  # a task's message cannot be sent, the release goes on
    ("drop", "w1 POST $batch{attempt,deadline,dispatch,rollup,task} [RUNNING]#1"),  # a claim lands, its answer lost
    ("crash", "w1 POST $batch{attempt,deadline,rollup,task} [SUCCEEDED]#1"),  # a worker dies right after its commit
    ("crash", "control PUT products/blob?block#1"),  # a finisher dies while writing the job's outputs (its pack)
    ("refuse", "control PATCH jobs(FinisherUntil,NotifiedAt){job}#1"),  # the email sent, its record refused
]


@pytest.fixture(scope="module")
def clean(azurite: Azurite, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Azurite, Path, list[str]]]:
    fault_run.warm_fork_server()
    workdir = tmp_path_factory.mktemp("faults")
    run = fault_run.run_one(azurite, workdir, {}, name="clean")
    assert run["problems"] == [], "the clean run itself is sound"
    yield azurite, workdir, run["calls"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("kind", "point"), POINTS, ids=[f"{k} {p}" for k, p in POINTS])
def test_a_fault_at_this_call_loses_nothing_and_doubles_nothing(
        clean: tuple[Azurite, Path, list[str]], kind: str, point: str) -> None:
    azurite, workdir, calls = clean
    assert point in calls, "the clean run makes this call"
    result: dict[str, Any] = fault_run.run_one(azurite, workdir, {point: kind}, name=f"{kind}-{calls.index(point)}")
    assert result["hits"] == [f"{kind} {point}"], f"the fault landed on {result['hits']!r}"
    assert result["problems"] == [], result["problems"]
    assert result["counts"].get("missing_emails", 0) == 0
