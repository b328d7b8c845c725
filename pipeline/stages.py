"""The stages a task can run, by name, and what a stage is given and gives back.

A stage is a plain function of a :class:`StageContext`; workers look it up by the name the
task row carries. Scientists' programs are not stages: they are declared by manifests
(``pipeline.reduction.reducers``) and run by the ``reduce`` stage in a sandbox (``pipeline.reduction.stage``).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from azure.storage.blob import ContainerClient

from pipeline.failures import FailureClass, StageFailure
from pipeline.science import vectors
from pipeline.storage import names
from pipeline.storage.clients import Clients

if TYPE_CHECKING:
    from pipeline.lifecycle.tasks import TaskRow


@dataclass
class StageContext:
    """What one attempt of a stage may touch."""

    job: str
    task: str
    attempt: int
    params: dict[str, str]
    clients: Clients
    part: str  # the job's table partition the task's rows are in (``pipeline.lifecycle.partitions``)
    output_prefix: str  # where in ``products`` this attempt writes
    backup: bool = False  # a backup copy of the attempt (the same inputs, on another machine)
    outputs: list[str] = field(default_factory=list)
    cached: bool = False  # set by a stage whose output already existed (the task ends CACHED)
    no_data: bool = False  # set by a stage that found none of its sources (the task ends NO_DATA)
    reporter: Callable[[float], None] | None = field(default=None, repr=False)  # where ``progress`` goes

    @property
    def sources(self) -> ContainerClient:
        return self.clients.sources

    @property
    def products(self) -> ContainerClient:
        return self.clients.products

    def progress(self, done: float) -> None:
        """Say what share of its work the attempt has done, from 0 to 1, in proportion to
        the time the work takes (inputs read of all it reads, rows written of the tile's).
        Its worker then revokes an attempt whose pace will take it far past its kill time as
        soon as that is plain, not at the kill time (LATE's progress rate), so that a
        straggler costs its slot a fraction of its history instead of several times it.
        The pace counts from the stage's first word: say 0 where the work that goes in
        proportion begins (after a slow start: fetching inputs, starting a program).
        Optional: a stage that never says is revoked at its kill time."""
        if self.reporter is not None:
            self.reporter(min(1.0, max(0.0, done)))  # NaN counts as nothing done

    def write_output(self, name: str, data: bytes, content_type: str) -> str:
        """Upload one output of this attempt; return its blob name."""
        blob = f"{self.output_prefix}{name}"
        self.clients.transfers.upload(self.products, blob, data, content_type)
        self.outputs.append(blob)
        return blob


def kept_document(clients: Clients, digest: str) -> dict[str, Any]:
    """A kept vector document (sites, zones, a region's polygon: ``names.vector_blob``), read
    and checked against its digest, for the stages that read one."""
    data, _ = clients.transfers.download(clients.tiles, names.vector_blob(digest))
    found: dict[str, Any] = json.loads(data)
    if vectors.digest_of(found) != digest:
        raise StageFailure(FailureClass.CORRUPT_BLOB, f"vector document {digest[:16]}… does not match its digest")
    return found


Stage = Callable[[StageContext], None]
STAGES: dict[str, Stage] = {}


def stage(name: str) -> Callable[[Stage], Stage]:
    def register(fn: Stage) -> Stage:
        STAGES[name] = fn
        return fn

    return register


# A stage whose outputs are content-addressed by what its task row names may say, before it
# runs, which of a job's planned tasks it would find made already: of the task rows given,
# those whose every output is there, by row key, with their outputs named as it names them.
# The planner settles those at planning (``transitions.settle``: no message, no worker).
MadeAlready = Callable[[Clients, list["TaskRow"]], dict[str, list[str]]]
MADE_ALREADY: dict[str, MadeAlready] = {}


def made_already(name: str) -> Callable[[MadeAlready], MadeAlready]:
    def register(fn: MadeAlready) -> MadeAlready:
        MADE_ALREADY[name] = fn
        return fn

    return register


def load(modules: str) -> None:
    """Import the modules named (comma-separated): the stages and checks they register."""
    for module in filter(None, (m.strip() for m in modules.split(","))):
        importlib.import_module(module)
