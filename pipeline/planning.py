"""What a job is made of: the seam between the lifecycle, which runs any bag of tasks, and
the application that says what a request becomes (``pipeline.requests``: MODIS requests).

The lifecycle stores a job's request as its application wrote it and never reads inside;
it asks the application for the job's :class:`TaskPlan` list (at submission, to count and
estimate it; at planning, with the catalog searched) and, once every task has ended, for
each task's parameters as its manifest gives them and what the job's products add to its
manifest and email. It knows of a plan only what
running it needs: each task's stage and parameters, which tasks wait for which (counters:
``pipeline.lifecycle.transitions``), which share a table partition, and how much work
each is for the runtime history.

A plan lists first the tasks nothing holds back (the release window walks them in order),
then those that wait for others: a task waits only for tasks listed before it. Last come
the tasks that wait for the whole job (``after_all``: a gather, which joins what tasks of
every partition made): the lifecycle releases them once every other task of the job has
ended, as its counters say (``pipeline.lifecycle.progress``), so that they need no counter
of their own in the partitions of what they wait for.

A task may work on several places at once (a tile task warping a batch of target tiles):
its ``tile`` names them, comma-separated, and its parameters of each place
(:data:`PLACE_PARAMS`) hold one value per place, separated by :data:`PLACES`; the
``granules`` it reads are those of every place, by MODIS tile, and each place reads those
of the tiles its ``reads`` names. Each of its outputs is made for one place and named for
it (its file name ends ``.PLACE.tif``, ``names.tile_blob``). :func:`places` gives such a
task's parameters as a task of each place alone would have them, and :func:`outputs_of` a
place's outputs: the counts per place, the manifest's entries and every task that reads
its outputs see one place at a time, as if each had had a task of its own.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pipeline.lifecycle.jobs import JobRow
    from pipeline.settings import Settings
    from pipeline.storage.clients import Clients

APPLICATION = "pipeline.requests.application"  # the module that registers the deployment's application
WORK, HISTORY, FEEDS = "work", "history", "feeds"  # the parameters the lifecycle reads (set from a TaskPlan)
PLACES = ";"  # between the values of a task's places (its ``tile`` names them, comma-separated)
PLACE_PARAMS = ("bounds", "sources")  # the parameters that hold a value per place
READS = "reads"  # per place, the MODIS tiles (comma-separated) whose granules its work reads


class RequestError(ValueError):
    """A request that is well-formed but cannot be run: ``status`` is the HTTP answer,
    ``field`` the request's field at fault."""

    def __init__(self, status: int, field: str, message: str, **extra: object) -> None:
        super().__init__(message)
        self.status, self.field, self.message, self.extra = status, field, message, extra


@dataclass(frozen=True)
class TaskPlan:
    """One task of a job, as its application plans it."""

    stage: str  # the stage a worker runs (``pipeline.stages``)
    params: dict[str, str]  # the stage's parameters: strings, as a table row keeps them
    waits_for: int = 0  # how many tasks must end before it runs (0: the job's window releases it)
    feeds: tuple[int, ...] = ()  # the tasks (indexes in the plan) that wait for this one
    group: int | None = None  # tasks of one group share a table partition (one that waits and what it waits for)
    work: float = 1.0  # its work, in the unit its runtime history is kept in (megapixels)
    history: str = ""  # the key of its runtime history within its stage (a product, a reducer)
    after_all: bool = False  # it waits for every task of the job that is not after_all itself (a gather)
    meta: dict[str, Any] = field(default_factory=dict, compare=False)  # the application's own, never stored

    @property
    def tile(self) -> str:
        """The places it works on, comma-separated, for the counts per place ("" for none)."""
        return self.params.get("tile", "")

    def stored_params(self) -> dict[str, str]:
        """Its parameters as its row keeps them, with what the lifecycle reads of it."""
        return self.params | {WORK: repr(self.work), HISTORY: self.history} | (
            {FEEDS: ",".join(map(str, self.feeds))} if self.feeds else {})


@dataclass(frozen=True)
class Finished:
    """What a job's products add to its manifest (``manifest``: fields; ``missing``, if
    given, names each optional piece it could not make with its error, which the job's
    status and email say) and to its email (``lines``: paragraphs, after the link to the
    manifest), and what its scientist must know of them wherever the job is shown
    (``notes``: its status, portal and email)."""

    manifest: dict[str, Any] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Application(Protocol):
    """What turns a deployment's requests into tasks, and its products into results."""

    def plan(self, settings: Settings, request: str, resolved: str, *, search: bool, limit: int) -> list[TaskPlan]:
        """The tasks of ``request`` (its stored JSON; ``resolved``: what was resolved of it at
        submission, as the job row keeps it): without the catalog (``search`` False: to count
        or estimate it, in milliseconds) or with each task's inputs found (at planning: the
        same tasks, in the same order). RequestError if it cannot run, or makes more than
        ``limit`` tasks."""
        ...

    def entry(self, params: dict[str, str]) -> dict[str, Any]:
        """A task's parameters (text, as its row keeps them) as the manifest's entry of the
        task gives them: typed, numbers as numbers and documents as objects."""
        ...

    def finished(self, clients: Clients, row: JobRow, entries: list[dict[str, Any]]) -> Finished:
        """What the finished job's products add to its manifest and email (``entries``: the
        manifest's task entries): mosaics, overviews, provenance."""
        ...


_registered: list[Application] = []


def register(application: Application) -> None:
    """Make ``application`` the deployment's (its module does it when imported)."""
    _registered[:] = [application]


def application() -> Application:
    """The deployment's application (importing :data:`APPLICATION` the first time)."""
    if not _registered:
        importlib.import_module(APPLICATION)
    return _registered[0]


def places_of(tile: str) -> list[str]:
    """The places a task's ``tile`` parameter names (comma-separated; "" for none)."""
    return tile.split(",") if "," in tile else [tile]


def size(plan: list[TaskPlan]) -> int:
    """How many places ``plan``'s tasks work on, each of a batch's counted: the tasks it would
    be a place a task, whatever its batches (a scientist's measure of a request's size)."""
    return sum(len(places_of(task.tile)) for task in plan)


def places(params: dict[str, str]) -> list[dict[str, str]]:
    """A task's parameters as a task of each of its places alone would have them: its
    ``tile``, its value of each of :data:`PLACE_PARAMS`, and of its ``granules`` those of
    the MODIS tiles it reads (none: the catalog has none of the tiles it covers). A task of
    one place: its own parameters."""
    named = places_of(params.get("tile", ""))
    if len(named) == 1:
        return [params]
    values = {key: params[key].split(PLACES) for key in PLACE_PARAMS if key in params}
    reads = params.get(READS, "").split(PLACES)
    granules = json.loads(params["granules"]) if "granules" in params else None
    if any(len(v) != len(named) for v in [*values.values(), reads]):
        raise ValueError(f"a task of {len(named)} places names {', '.join(f'{len(v)} {k}' for k, v in values.items())}"
                         f" and {len(reads)} reads")
    found = []
    for index, place in enumerate(named):
        own = {key: value for key, value in params.items() if key != READS}
        own |= {"tile": place, **{key: value[index] for key, value in values.items()}}
        if granules is not None:
            wanted = set(reads[index].split(","))
            own["granules"] = json.dumps({tile: g for tile, g in granules.items() if tile in wanted}, sort_keys=True)
        found.append(own)
    return found


def outputs_of(outputs: list[str], tile: str, several: bool) -> list[str]:
    """The outputs a task made for its place ``tile`` (``several``: the task works on
    several places, and names each output for its own; else every one of them)."""
    return [o for o in outputs if o.endswith(f".{tile}.tif")] if several else outputs


def gathers(plan: list[TaskPlan]) -> int:
    """How many of a plan's tasks wait for the whole job (its last ones); ValueError if one
    comes before a task that does not, waits for a counter, feeds a task, or asks for a
    partition group (it has none: its partition is by its sequence number)."""
    count = next((len(plan) - i for i, task in enumerate(plan) if task.after_all), 0)
    last = plan[len(plan) - count:]
    if not all(task.after_all for task in last):
        raise ValueError("a plan lists the tasks that wait for the whole job after all others")
    if any(task.waits_for or task.feeds or task.group is not None for task in last):
        raise ValueError("a task that waits for the whole job waits for no counter, feeds none and has no group")
    return count


def releasable(plan: list[TaskPlan]) -> int:
    """How many of a plan's tasks the window releases (its first ones); ValueError if a task
    that waits comes before one that does not, or waits for a task after it."""
    after = len(plan) - gathers(plan)
    count = next((i for i, task in enumerate(plan[:after]) if task.waits_for), after)
    if any(not task.waits_for for task in plan[count:after]):
        raise ValueError("a plan lists the tasks that wait after all those that do not")
    fed: dict[int, int] = {}
    for seq, task in enumerate(plan):
        for waiting in task.feeds:
            if not seq < waiting < len(plan):
                raise ValueError(f"task {seq} feeds a task that is not after it in the plan")
            fed[waiting] = fed.get(waiting, 0) + 1
    wrong = [seq for seq, task in enumerate(plan) if task.waits_for != fed.get(seq, 0)]
    if wrong:
        raise ValueError(f"task {wrong[0]} waits for {plan[wrong[0]].waits_for} tasks, {fed.get(wrong[0], 0)} feed it")
    return count


def work_of(params: dict[str, str]) -> float:
    """A task's work as its parameters say (1.0 when they do not: its history is then per task)."""
    try:
        return max(float(params.get(WORK, 1.0)), 1e-6)
    except ValueError:
        return 1.0


def history_of(params: dict[str, str]) -> str:
    """The key of a task's runtime history within its stage."""
    return params.get(HISTORY, "")


def feeds_of(params: dict[str, str]) -> list[int]:
    """The sequence numbers of the tasks that wait for this one."""
    return [int(seq) for seq in params.get(FEEDS, "").split(",") if seq]
