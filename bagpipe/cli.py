"""bagpipe: run the local stack and a worker, submit requests, watch them, fetch results."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import httpx
import typer
from rich.logging import RichHandler
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Column, Table

from bagpipe import manage, runstage
from bagpipe.client import DEFAULT_HOME, TOKEN_FILE, Api, ApiError, download_results, forget_home, record_home
from bagpipe.terminal import console, duration, fail
from pipeline.redact import protect_logging
from pipeline.storage.names import CLI_TOKEN

# Click's plain help: Typer's rich panels print every flag as taking a value (``--help <bool>``).
app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  context_settings={"max_content_width": 120})

HomeOpt = Annotated[Path, typer.Option(help="Folder of the local stack's state.")]
ApiOpt = Annotated[Optional[str], typer.Option("--api", help="API base URL.")]
KeyOpt = Annotated[Optional[str], typer.Option("--key", help="Personal API token.")]
JobArg = Annotated[str, typer.Argument(metavar="JOB", help="The job's id, as submit printed it.")]

# The demo request: the Four Corners of the south-western United States (MODIS tiles
# h08v05 and h09v05, reprojected to 1° lon/lat tiles at 0.005°), every 8-day snow
# composite from January to mid-February 2022 (12 tiles x 6 periods = 72 tile tasks), and
# per tile the snow-covered fraction over the span (12 reductions, the Python example).
# The granules are found by searching the local Planetary Computer (STAC API), signed with
# its SAS tokens and read from Azurite, the code path of production; the period of
# 2 February over h09v05 is the real granule in data/modis.
DEMO_REQUEST: dict[str, Any] = {
    "region": {"bbox": [-112.0, 34.0, -108.0, 37.0]},
    "grid": {"crs": "EPSG:4326", "tile_size": 1.0, "resolution": 0.005},
    "start": "2022-01-01",
    "end": "2022-02-17",
    "products": ["MOD10A2"],
    "reducer": {"name": "snow_fraction"},
    "email": "scientist@example.org",
    "label": "demo: Four Corners snow cover, winter 2022",
}
# bagpipe demo --science: real data only, the monthly greenest NDVI of NASA's ten MOD13A2
# composites of h18v09 (the Gulf of Guinea, January to early June 2025) on the tile's own grid
SCIENCE_DEMO_REQUEST: dict[str, Any] = {
    "region": {"tiles": ["h18v09"]},
    "start": "2025-01-01",
    "end": "2025-05-31",
    "products": ["MOD13A2"],
    "reduce": {"by": "month", "reducer": "max"},
    "email": "scientist@example.org",
    "label": "demo: monthly maximum NDVI of the real MOD13A2 series, Gulf of Guinea, 2025",
}


FAILURES_SHOWN = 5  # the newest failed attempts ``status`` shows


def _logging(verbose: bool = False, above_progress: bool = False) -> None:
    """Log lines to the terminal; ``above_progress``: through the console that draws a progress
    bar (the demo's), which prints them above it rather than over it."""
    if above_progress:
        logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(name)s: %(message)s",
                            handlers=[RichHandler(console=console, show_time=False, show_path=False)])
    else:
        logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("azure").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request (the imitations' pass-through's)
    logging.getLogger("mail.log").setLevel(logging.WARNING)
    protect_logging()


@app.command()
def up(home: HomeOpt = DEFAULT_HOME,
       workers: Annotated[int, typer.Option(min=0, help="Worker processes.")] = 2,
       slots: Annotated[int, typer.Option(min=1, help="Tasks each worker runs at once.")] = 2) -> None:
    """Run the local stack (Azurite, API, planner/sweep loop, workers, SMTP) until Ctrl-C."""
    from bagpipe.stack import LocalStack, StackRunning

    _logging()
    try:
        stack = LocalStack(home, workers=workers, slots=slots).start()
    except (StackRunning, OSError, RuntimeError) as exc:  # another stack; Azurite not installed, not started
        fail(exc)
    record_home(home)  # the command line finds this stack from any folder
    console.print(f"bagpipe is up: portal {stack.api_url}/  API {stack.api_url}/api  (your personal API token, "
                  f"the admin's, is in {home / TOKEN_FILE}: the portal asks for it, scripts read it as {CLI_TOKEN})",
                  soft_wrap=True)
    console.print(f"  mail in {stack.mail.folder}, logs in {home / 'logs'}; Ctrl-C stops it")
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    signal.signal(signal.SIGINT, lambda *_: stopped.set())
    stopped.wait()
    console.print("stopping…")
    forget_home(home)
    stack.stop()


@app.command()
def worker(slots: Annotated[int, typer.Option(min=1, help="Tasks run at once.")] = 2,
           exit_when_idle: Annotated[Optional[float], typer.Option(
               min=0, help="Exit after this many seconds of empty queues (an event-driven job).")] = None,
           verbose: bool = False) -> None:
    """Pull and run tasks (settings from the environment) until SIGTERM (or idle)."""
    from pipeline import telemetry
    from pipeline.settings import Settings
    from worker.runner import Worker

    settings = Settings.from_env()
    telemetry.setup(settings, verbose)
    runner = Worker(settings, slots=slots, exit_when_idle=exit_when_idle)
    signal.signal(signal.SIGTERM, lambda *_: runner.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: runner.stopping.set())
    logging.getLogger(__name__).info("worker %s started with %d slots", runner.id, slots)
    runner.run()
    if runner.draining.is_set():
        from pipeline.lifecycle.health import REPLACE_EXIT

        # Found slow and drained: what it held is given up, the messages it held are handed
        # back, its departure is recorded and its stage processes are gone. Its machine
        # barely runs it, and the interpreter's teardown (threads joined, the fork server
        # stopped) would cost it seconds more before a fresh worker can start.
        logging.shutdown()
        os._exit(REPLACE_EXIT)


@app.command()
def submit(
    file: Annotated[Optional[Path], typer.Option(help="A request as JSON.")] = None,
    bbox: Annotated[Optional[str], typer.Option(help="west,south,east,north in degrees.")] = None,
    tiles: Annotated[Optional[str], typer.Option(help="MODIS tiles, e.g. h09v05,h10v05.")] = None,
    start: Annotated[Optional[str], typer.Option(help="First day, YYYY-MM-DD.")] = None,
    end: Annotated[Optional[str], typer.Option(help="Last day, YYYY-MM-DD.")] = None,
    product: Annotated[Optional[list[str]], typer.Option(help="A product (repeat).")] = None,
    layer: Annotated[Optional[list[str]], typer.Option(
        help="A layer to make, PRODUCT.LAYER (repeat; a product not named: its default layer).")] = None,
    email: Annotated[Optional[str], typer.Option(help="Where to send the notification.")] = None,
    label: Annotated[str, typer.Option(help="A name for the job.")] = "",
    crs: Annotated[Optional[str], typer.Option(help="Output grid CRS, e.g. EPSG:4326.")] = None,
    tile_size: Annotated[Optional[float], typer.Option(help="Output tile side, in CRS units.")] = None,
    resolution: Annotated[Optional[float], typer.Option(help="Output pixel size, in CRS units.")] = None,
    reducer: Annotated[Optional[str], typer.Option(
        help="A program to run over each product's whole span (installed, or one you uploaded).")] = None,
    reduce: Annotated[Optional[str], typer.Option(
        help="A built-in reducer per target tile and group of dates: mean, median, min, max, sum, count, std, "
             "percentile:P, first, last, argmax_date, argmin_date, anomaly, zscore, vci, tci.")] = None,
    by: Annotated[Optional[str], typer.Option(
        help="How dates are grouped: span, month, season, year, days:N, month-of-year, day-of-year.")] = None,
    inputs: Annotated[Optional[list[str]], typer.Option(
        "--input", help="A reduction's input, PRODUCT.LAYER or NAME=PRODUCT.LAYER (repeat; default: every layer "
                        "made).")] = None,
    expression: Annotated[Optional[str], typer.Option(
        help="An expression over the inputs per target tile and group (e.g. '0.5 * ndvi.vci + 0.5 * lst.tci').")
    ] = None,
    program: Annotated[Optional[str], typer.Option(help="A program per target tile and group of dates.")] = None,
    args: Annotated[Optional[str], typer.Option(help="The program's arguments, a JSON object.")] = None,
    aggregate: Annotated[Optional[str], typer.Option(
        help="What an expression sees of each input over a group, and a baseline of each year: mean, median, "
             "min, max, sum, first, last.")] = None,
    baseline: Annotated[Optional[str], typer.Option(help="Years of reference: START,END (YYYY-MM-DD each).")] = None,
    name: Annotated[Optional[str], typer.Option(help="The reduction's outputs' name.")] = None,
    derive: Annotated[Optional[list[str]], typer.Option(
        help="A layer derived per date, PRODUCT.NAME=EXPRESSION over PRODUCT.LAYERs (repeat).")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show the tasks, time and cost; submit nothing.")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Submit without asking (a script), even a request that "
                                                    "looks like a slip: a box across half the world, far more "
                                                    "tasks than your last job.")] = False,
    sites: Annotated[Optional[Path], typer.Option(
        help="Sites to sample on each product's own grid: a CSV (id,lon,lat), JSON or GeoJSON file.")] = None,
    window: Annotated[int, typer.Option(help="With --sites: also the mean of a 3×3 or 5×5 window.")] = 1,
    zones: Annotated[Optional[Path], typer.Option(
        help="Zones for zonal statistics: a GeoJSON FeatureCollection of polygons with ids.")] = None,
    region: Annotated[Optional[Path], typer.Option(help="A region given as a GeoJSON polygon file.")] = None,
    form: Annotated[Optional[str], typer.Option(
        "--format", help="Also write cubes: netcdf or zarr (one per product and layer, and per reduction).")] = None,
    api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME,
) -> None:
    """Submit a request (from --file, or from the flags) and print its job id; first show its
    tasks, compute time and cost, and ask when it looks like a slip."""
    request: dict[str, Any] = _request_in(file) if file else {}
    try:  # kept first, as documents of their own: a request names them by digest
        client = Api.resolve(api, key, home)
        if sites:
            request["sites"] = {"kept": {"ref": client.keep("sites", _vector_in(sites))["ref"]}, "window": window}
        if zones:
            request["zones"] = {"kept": {"ref": client.keep("zones", _vector_in(zones))["ref"]}}
        if region:
            request["region"] = {"kept": {"ref": client.keep("region", _vector_in(region))["ref"]}}
    except (ApiError, RuntimeError) as exc:
        fail(exc)
    if form:
        request["output"] = {"format": form}
    if bbox and tiles:
        fail(ValueError("--bbox or --tiles: a region is one or the other"))
    if bbox:
        request["region"] = {"bbox": _bbox(bbox)}
    if tiles:
        request["region"] = {"tiles": tiles.split(",")}
    for field, value in (("start", start), ("end", end), ("email", email)):
        if value:
            request[field] = value
    if product:
        request["products"] = product
    for named in layer or []:
        of, _, layer_name = named.replace(":", ".", 1).partition(".")
        if not (of and layer_name):
            fail(ValueError(f"--layer: PRODUCT.LAYER, e.g. MOD13A1.500m_16_days_NDVI (not {named!r})"))
        request.setdefault("layers", {}).setdefault(of, []).append(layer_name)
    for made in derive or []:
        ref, _, text = made.partition("=")
        of, _, derived = ref.partition(".")
        if not (of and derived and text):
            fail(ValueError(f"--derive: PRODUCT.NAME=EXPRESSION, e.g. MCD43A4.ndvi='(MCD43A4.Nadir_Reflectance_Band2 "
                            f"- MCD43A4.Nadir_Reflectance_Band1) / (…)' (not {made!r})"))
        request.setdefault("derive", {}).setdefault(of, {})[derived] = text
    reduction = _reduction(reduce, by, inputs, expression, program, args, aggregate, baseline, name)
    if reduction:
        request["reduce"] = request.get("reduce", {}) | reduction
    if label:
        request["label"] = label
    grid = {k: v for k, v in (("crs", crs), ("tile_size", tile_size), ("resolution", resolution)) if v is not None}
    if grid:
        request["grid"] = request.get("grid", {}) | grid
    if reducer:
        request["reducer"] = {"name": reducer}
    try:
        found = client.post("/api/estimate", request)
    except (ApiError, RuntimeError) as exc:
        fail(exc)
    console.print(_estimate_line(found), highlight=False)
    for doubt in found["confirm"]:
        console.print(f"[yellow]check:[/yellow] {doubt}", highlight=False, soft_wrap=True)
    if dry_run:
        return
    if found["confirm"] and not yes:
        if not sys.stdin.isatty():
            fail(ValueError("not submitted: mend the request, or pass --yes to submit it as it is"))
        if not typer.confirm("Submit it as it is?", default=False):
            fail(ValueError("not submitted"))
    try:
        created = client.submit(request)
    except (ApiError, RuntimeError) as exc:
        fail(exc)
    console.print(f"submitted {created['job']}: {created['total']:,} tasks; follow it: bagpipe watch {created['job']}",
                  highlight=False)
    print(created["job"])


def _reduction(reduce: str | None, by: str | None, inputs: list[str] | None, expression: str | None,
               program: str | None, args: str | None, aggregate: str | None, baseline: str | None,
               name: str | None) -> dict[str, Any]:
    """A request's ``reduce`` as the flags say it (the API checks it and names what is wrong)."""
    found: dict[str, Any] = {}
    if reduce:
        reducer, _, p = reduce.partition(":")
        found["reducer"] = reducer
        if p:
            try:
                found["percentile"] = float(p)
            except ValueError:
                fail(ValueError(f"--reduce percentile:P, P a number from 0 to 100 (not {p!r})"))
    if expression:
        found["expression"] = expression
    if program:
        found["program"] = {"name": program}
        if args:
            try:
                found["program"]["args"] = json.loads(args)
            except ValueError as exc:
                fail(ValueError(f"--args: a JSON object ({exc})"))
    elif args:
        fail(ValueError("--args go with --program (or --reducer: put them in --file)"))
    if inputs:
        aliased = [i for i in inputs if "=" in i]
        if aliased and len(aliased) != len(inputs):
            fail(ValueError("--input: name every input (NAME=PRODUCT.LAYER) or none"))
        found["inputs"] = dict(i.split("=", 1) for i in inputs) if aliased else list(inputs)
    if baseline:
        first, _, last = baseline.partition(",")
        if not (first and last):
            fail(ValueError(f"--baseline START,END, e.g. 2001-01-01,2020-12-31 (not {baseline!r})"))
        found["baseline"] = {"start": first, "end": last}
    found |= {k: v for k, v in (("by", by), ("aggregate", aggregate), ("name", name)) if v}
    return found
def _vector_in(file: Path) -> Any:
    """What a --sites, --zones or --region file holds: CSV text (a .csv), else JSON."""
    try:
        text = file.read_text()
        return text if file.suffix.lower() in (".csv", ".txt") else json.loads(text)
    except (OSError, ValueError) as exc:
        fail(ValueError(f"{file}: {exc}"))


def _estimate_line(found: dict[str, Any]) -> str:
    """What ``POST /api/estimate`` said, as the portal says it."""
    from pipeline.lifecycle.costs import dollars

    if found["known"]:
        return (f"{found['tasks']:,} tasks: about {duration(found['compute_s'])} of compute, {dollars(found['usd'])} "
                "at Azure's prices (at most: tiles already made cost almost nothing)")
    return (f"{found['tasks']:,} tasks (compute time not known yet: too few runs of its stages so far; storage calls "
            f"{dollars(found['usd'])})")


def _request_in(file: Path) -> dict[str, Any]:
    """The request a ``--file`` holds (a JSON object)."""
    try:
        found = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        fail(ValueError(f"--file {file}: {exc}"))
    if not isinstance(found, dict):
        fail(ValueError(f"--file {file}: a request is a JSON object"))
    return found


def _bbox(text: str) -> list[float]:
    """``--bbox``'s four numbers."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if len(values) != 4:
        fail(ValueError(f"--bbox: four numbers, west,south,east,north in degrees (not {text!r})"))
    return values


@app.command()
def status(job: JobArg,
           as_json: Annotated[bool, typer.Option("--json", help="Print the API's answer as JSON.")] = False,
           api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """Show a job's state, task counts, failures (the newest with errors and logs) and workers; --json: the API's."""
    try:
        client = Api.resolve(api, key, home)
        found = client.status(job)
        failed = client.get(f"/api/jobs/{job}/view")["failed_attempts"] if found["failures"] and not as_json else []
    except (ApiError, RuntimeError) as exc:
        fail(exc)
    if as_json:
        print(json.dumps(found, indent=1))
        return
    console.print(f"{job}  {found['state']}  {_job_state_said(found)}", highlight=False)  # the id whole, to copy
    table = Table()
    table.add_column("tasks")
    table.add_column("", justify="right")
    table.add_column("what it means")
    for name, count in found["counts"].items():
        if count:
            table.add_row(name, str(count), TASK_STATES.get(name, ""))
    for name, count in found["failures"].items():
        table.add_row(f"[red]failure: {name}[/red]", str(count), "attempts that failed so")
    if found["monitor_kills"]:
        table.add_row("[yellow]killed by the monitor[/yellow]", str(found["monitor_kills"]),
                      "attempts stopped for running far longer than their stage's usual time, then retried")
    if found.get("speculative_attempts"):
        table.add_row("[cyan]backup attempts[/cyan]", str(found["speculative_attempts"]),
                      "second copies of slow attempts near the end: the first to finish counts")
    console.print(table)
    _print_failures(job, failed)
    if found.get("workers"):
        workers = Table(title="workers")
        longest = max(len(worker["worker"]) for worker in found["workers"])
        workers.add_column("worker", no_wrap=True, min_width=longest)  # a name to grep the logs for, whole
        for column in ("attempts", "committed", "runtime / history", "state", "sandbox"):
            workers.add_column(column, justify="left" if column in ("state", "sandbox") else "right")
        for worker in found["workers"]:
            ratio, state = worker["recent_ratio"], worker["state"]
            workers.add_row(worker["worker"], str(worker["attempts"]), str(worker["committed"]),
                            "—" if ratio is None else f"{ratio:.2f}×",
                            state if state in ("healthy", "stopped") else f"[red]{state}[/red]",
                            _sandbox_cell(worker.get("sandbox")))
        console.print(workers)


# what a task's state means, for a scientist reading status
TASK_STATES = {
    "PENDING": "planned, waiting for its turn (or for the tasks it needs)",
    "QUEUED": "waiting for a worker",
    "RUNNING": "running on a worker",
    "SUCCEEDED": "made",
    "CACHED": "made before, by this or an earlier job: reused, nothing computed",
    "NO_DATA": "the catalog has nothing there (ocean, an outage, a date not yet produced)",
    "FAILED": "an attempt failed: it will be tried again",
    "TIMED_OUT": "an attempt ran too long and was stopped: it will be tried again",
    "DEAD": "failed at every attempt allowed: not made (the failures below say why)",
    "CANCELLED": "not run: the job was cancelled",
}


def _job_state_said(found: dict[str, Any]) -> str:
    """What a job's state says beyond its name: how far a running job is (a finished one's
    share of tasks ended said nothing: CANCELLED 100%), and what a finishing one does."""
    state = found["state"]
    if state == "FINISHING":
        return "(every task has ended; its manifest and email are being made)"
    if state in ("SUCCEEDED", "FAILED", "CANCELLED"):
        return f"({found['total']:,} tasks)"
    return f"{found['progress']:.0%} of {found['total']:,} tasks ended"


def _print_failures(job: str, failed: list[dict[str, Any]]) -> None:
    """The newest failed attempts (the job view's), each with its error and, for a program's,
    the command that prints what it wrote."""
    for attempt in failed[:FAILURES_SHOWN]:
        console.print(f"[red]{attempt['class']}[/red] task {attempt['task']} attempt {attempt['attempt']} "
                      f"({attempt['stage']}): {attempt['error']}", highlight=False, soft_wrap=True)
        if attempt["logs"]:
            console.print(f"  its stdout and stderr: bagpipe logs {job} {int(attempt['task'])}", highlight=False,
                          soft_wrap=True)


@app.command()
def logs(job: JobArg,
         task: Annotated[Optional[str], typer.Argument(
             metavar="TASK", help="A task's number, as status shows it (default: list the tasks that left logs).")]
         = None,
         api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """What a job's programs wrote to stdout and stderr, successful or not: the tasks that left
    logs, or every attempt's of TASK."""
    try:
        client = Api.resolve(api, key, home)
        found = client.get(f"/api/jobs/{job}/logs", **({"task": task} if task else {}))
        texts = [client.text(entry["link"]) for entry in found] if task else []
    except (ApiError, RuntimeError, httpx.HTTPError) as exc:
        fail(exc)
    if not found:
        console.print(f"no logs{f' of task {task}' if task else ''}: a program's reductions leave them (a "
                      "built-in reducer or an expression writes none), once they have run", highlight=False)
        return
    if task:
        for entry, text in zip(found, texts, strict=True):
            console.print(f"[bold]── task {int(entry['task'])} attempt {entry['attempt']} {entry['name']} "
                          f"({entry['bytes']:,} bytes)[/bold]", highlight=False)
            if text:
                print(text, end="" if text.endswith("\n") else "\n")
        return
    table = Table()
    for column in ("task", "attempts", "stdout", "stderr"):
        table.add_column(column, justify="right")
    by_task: dict[str, dict[str, Any]] = {}
    for entry in found:
        seen = by_task.setdefault(entry["task"], {"attempts": set(), "stdout.txt": 0, "stderr.txt": 0})
        seen["attempts"].add(entry["attempt"])
        seen[entry["name"]] = seen.get(entry["name"], 0) + entry["bytes"]
    for name, seen in by_task.items():
        table.add_row(str(int(name)), str(len(seen["attempts"])), f"{seen['stdout.txt']:,} B",
                      f"{seen['stderr.txt']:,} B")
    console.print(table)
    console.print(f"a task's, every attempt: bagpipe logs {job} TASK", highlight=False, soft_wrap=True)


def _sandbox_cell(mode: str | None) -> str:
    """A worker's sandbox mode, in red where it runs no scientist's program."""
    if mode is None:
        return "—"
    return f"[red]{mode}[/red]" if mode.startswith("none") else mode


PLAIN_EVERY_S = 10.0  # without a terminal, watch prints a line at most this often (and when the job ends)
BAR_WIDTH = 30  # characters of watch's bar: fixed, so that the counts beside it do not squeeze it away


def progress_columns() -> tuple[ProgressColumn, ...]:
    """watch's columns: state, a bar of fixed width, tasks ended of all, time left (from the
    pace so far), and the counts by status, last, where a narrow terminal may cut them."""
    return (TextColumn("{task.description}", table_column=Column(min_width=9)),  # FINISHING
            BarColumn(bar_width=BAR_WIDTH, table_column=Column(min_width=BAR_WIDTH)),
            MofNCompleteColumn(table_column=Column(min_width=11)),  # 84/84, 99999/99999
            TimeRemainingColumn(compact=True, elapsed_when_finished=True, table_column=Column(min_width=5)),
            TextColumn("{task.fields[detail]}", table_column=Column(no_wrap=True, overflow="ellipsis")))


def watch_job(client: Api, job: str, interval: float = 1.0,
              healthy: Callable[[], bool] = lambda: True) -> dict[str, Any]:
    """Show a progress bar by task status until the job finishes (without a terminal, a line
    when the figures change, at most every :data:`PLAIN_EVERY_S`); return its status. Gives
    up if ``healthy`` says the stack that runs it has died."""
    finished = {"SUCCEEDED", "FAILED", "CANCELLED"}
    plain = not console.is_terminal
    said, said_at = "", 0.0
    with Progress(*progress_columns(), console=console, disable=plain) as progress:
        bar = progress.add_task("", total=None, detail="")
        while True:
            found = client.status(job)
            counts = {k: v for k, v in found["counts"].items() if v}
            done = sum(found["counts"][s] for s in ("SUCCEEDED", "CACHED", "NO_DATA", "DEAD", "CANCELLED"))
            detail = " ".join(f"{k.lower()}={v}" for k, v in counts.items())
            progress.update(bar, total=found["total"], completed=done, description=found["state"], detail=detail)
            line = f"{job} {found['state']} {done}/{found['total']} {detail}"
            ended = found["state"] in finished
            if plain and line != said and (ended or time.monotonic() - said_at >= PLAIN_EVERY_S):
                print(line, flush=True)
                said, said_at = line, time.monotonic()
            if ended:
                return found
            if not healthy():
                raise RuntimeError("the local stack's workers have all exited; see its logs")
            time.sleep(interval)


@app.command()
def watch(job: JobArg, api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """Follow a job with a progress bar until it ends; exit status 0 only if it SUCCEEDED."""
    try:
        found = watch_job(Api.resolve(api, key, home), job)
    except (ApiError, RuntimeError) as exc:
        fail(exc)
    from pipeline.lifecycle.costs import dollars

    cost = found.get("cost")
    console.print(f"{job}: {found['state']}" + (f", {cost['compute_s'] / 3600:.2f} slot-hours of compute, "
                                                 f"about {dollars(cost['usd'])}" if cost else ""))
    if found["state"] != "SUCCEEDED":  # for a script: `bagpipe watch JOB && bagpipe results JOB …`
        if found["failures"]:  # why, as status says it
            try:
                _print_failures(job, Api.resolve(api, key, home).get(f"/api/jobs/{job}/view")["failed_attempts"])
            except (ApiError, RuntimeError) as exc:
                fail(exc)
        raise typer.Exit(1)


@app.command()
def results(job: JobArg,
            out: Annotated[Optional[Path], typer.Option(help="Where to put them (default: out/JOB, as the demo).")]
            = None,
            api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """Download a finished job's products, with their mosaics, overview pictures, STAC
    catalog and manifest."""
    target = out or Path("out") / job
    started = time.time()
    try:
        client = Api.resolve(api, key, home)
        with Progress(TextColumn("downloading"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=True, disable=not console.is_terminal) as bar:
            shown = bar.add_task("products", total=None)
            manifest, products = download_results(
                client, job, target, progress=lambda done, total: bar.update(shown, completed=done, total=total))
    except (ApiError, RuntimeError, httpx.HTTPError) as exc:  # the last: a product's download
        fail(exc)
    written = sum(1 for path in target.rglob("*") if path.is_file() and path.stat().st_mtime >= started - 1)
    console.print(f"{written} files written in {target}: {products} products, their mosaics and overview "
                  f"pictures, the STAC catalog (collection.json, an item beside each) and {manifest.name}",
                  highlight=False, soft_wrap=True)


@app.command()
def cancel(job: JobArg, api: ApiOpt = None, key: KeyOpt = None, home: HomeOpt = DEFAULT_HOME) -> None:
    """Cancel a job: no task starts after this."""
    try:
        found = Api.resolve(api, key, home).cancel(job)
    except (ApiError, RuntimeError) as exc:
        fail(exc)
    console.print(f"{job}: {found['state']}")


@app.command()
def demo(out: Annotated[Path, typer.Option(help="Where the products go.")] = Path("out"),
         home: HomeOpt = DEFAULT_HOME,
         workers: Annotated[int, typer.Option(min=1)] = 2,
         slots: Annotated[int, typer.Option(min=1)] = 4,
         science: Annotated[bool, typer.Option(
             "--science", help="Submit the real MOD13A2 series' monthly maxima instead.")] = False) -> None:
    """Up, submit the sample request, watch it, download the products and the email, down."""
    from bagpipe.stack import LocalStack, StackRunning

    _logging(above_progress=True)
    logging.getLogger().setLevel(logging.WARNING)
    started = time.monotonic()
    try:
        with LocalStack(home, workers=workers, slots=slots) as stack:
            console.print(f"local stack up in {time.monotonic() - started:.1f} s: API {stack.api_url}")
            client = Api(stack.api_url, stack.token)
            request = SCIENCE_DEMO_REQUEST if science else DEMO_REQUEST
            job = client.submit(request)["job"]
            console.print(f"submitted {job}: {request['label']}")
            found = watch_job(client, job, healthy=lambda: any(
                p.poll() is None for p in stack.worker_processes))
            target = out / job
            manifest, files = download_results(client, job, target)
            email = _wait_for_email(stack, job)
            shutil.copy(email, target / "email.eml")
    except (StackRunning, OSError, RuntimeError) as exc:  # as up's, and the API's refusals, a stack that died
        fail(exc)
    console.print(f"{job} {found['state']}: {files} products, {manifest}, "
                  f"{target / 'email.eml'}; {time.monotonic() - started:.0f} s in all")
    if found["state"] != "SUCCEEDED":
        raise typer.Exit(1)


def _wait_for_email(stack: Any, job: str, timeout: float = 60) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path, message in stack.mail.messages():
            if job in str(message["Subject"]):
                return path
        time.sleep(0.2)
    raise RuntimeError(f"no email for {job} within {timeout:.0f} s")


manage.register(app)
app.command("run-stage")(runstage.run_stage)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
