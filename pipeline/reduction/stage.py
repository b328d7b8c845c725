"""The reduction stage ("reduce"): aggregate a target tile's reprojected tiles over the
request's span and run the scientist's program on them, in the sandbox.

The program gets its inputs in a read-only folder, an empty output folder, a private
temporary folder and ``task.json`` (what it is run on, the request's arguments, where to
write). Its exit code is the verdict; its stdout and stderr are kept as log blobs; only the
regular files it leaves in its output folder that match its manifest's patterns are
published (to ``products/{job}/``).
"""

from __future__ import annotations

import fnmatch
import json
import mimetypes
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rasterio.shutil

from pipeline import stages
from pipeline.failures import FailureClass, StageFailure
from pipeline.lifecycle import tasks
from pipeline.lifecycle.status import TaskStatus
from pipeline.reduction import REDUCE_STAGE, bundlecache, reducers, sandbox
from pipeline.stages import StageContext
from pipeline.storage import names

LOG_BYTES = 1024 * 1024  # the tail of stdout/stderr kept as a log blob
MAX_OUTPUTS = 100  # files a reduction may publish (their names live on its task row)
MAX_NAME = 200  # characters of an output's path inside the output folder
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
GOOD = (TaskStatus.SUCCEEDED.value, TaskStatus.CACHED.value)


def inputs_of(ctx: StageContext) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """The group's finished tiles (date, blob per layer), the dates the catalog has no data
    for (tile tasks that ended NO_DATA: missing data is data) and the dates whose tile task
    failed (DEAD or CANCELLED)."""
    first, count = (int(v) for v in ctx.params["deps"].split(","))
    ready, missing, failed = [], [], []
    for row in tasks.list_tasks(ctx.clients.tasks, [ctx.part], first, count):
        day = row.parameters()["date"]
        outputs = row.output_names()
        if row.status in GOOD and outputs:
            ready.append({"date": day, "blobs": [o.removeprefix(names.TILE_OUTPUT_PREFIX) for o in outputs]})
        elif row.status is TaskStatus.NO_DATA:
            missing.append(day)
        else:
            failed.append(day)
    return ready, missing, failed


def _publish_logs(ctx: StageContext, folder: Path) -> None:
    prefix = names.log_prefix(ctx.job, ctx.task, ctx.attempt)
    for name in ("stdout.txt", "stderr.txt"):
        path = folder / name
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - LOG_BYTES))
            ctx.clients.transfers.upload(ctx.clients.logs, prefix + name, f.read(), "text/plain")


def _tail(path: Path, chars: int = 600) -> str:
    text = path.read_text(errors="replace")
    return text[-chars:].strip()


@dataclass(frozen=True)
class Run:
    """What a program run left: the sandbox's verdict, its published files, its folder."""

    result: sandbox.Result
    outputs: list[Path]
    folder: Path  # holds stdout.txt and stderr.txt

    def failure(self, reducer: reducers.Reducer) -> StageFailure | None:
        if self.result.exit_code == 0 and not self.result.why:
            made = [p.relative_to(self.folder / "outputs").as_posix() for p in self.outputs]
            if len(made) > MAX_OUTPUTS or max(map(len, made), default=0) > MAX_NAME:
                return StageFailure(FailureClass.USER_CODE, (
                    f"{reducer.name} left {len(made)} output files, the longest named in {max(map(len, made))} "
                    f"characters; at most {MAX_OUTPUTS} files, each named in at most {MAX_NAME}, are published"))
            if self.outputs:
                return None
            return StageFailure(FailureClass.USER_CODE, f"{reducer.name} exited 0 but left no output matching "
                                f"{list(reducer.outputs)}")
        verdict = self.result.why or f"exited with code {self.result.exit_code}"
        failure = FailureClass.EXECUTION_TIMEOUT if "timeout" in verdict else FailureClass.USER_CODE
        return StageFailure(failure, f"{reducer.name} {verdict}: {_tail(self.folder / 'stderr.txt')}")


PROGRESS_READ_S = 0.2  # how often a running program's progress file is read


def _read_progress(path: Path) -> float | None:
    """The share of its work a program says it has done: the number its progress file
    starts with (not followed if the program made it a link: it is the program's file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return float(os.read(fd, 32).decode("ascii", "replace").split()[0])
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(fd)


def _watch_progress(path: Path, on_progress: Callable[[float], None], done: threading.Event) -> None:
    while not done.wait(PROGRESS_READ_S):
        said = _read_progress(path)
        if said is not None:
            on_progress(said)


def run_program(reducer: reducers.Reducer, tiles: list[tuple[str, Path]], root: Path,
                task: dict[str, Any], more: dict[str, list[tuple[str, Path]]] | None = None,
                on_progress: Callable[[float], None] | None = None, namespaces: bool = True) -> Run:
    """Stage ``tiles`` ((date, GeoTIFF) pairs of the first requested layer) and ``more``
    (other layers' pairs, by layer) read-only into ``root/inputs``, write ``task.json``
    (``task`` plus where things are: ``inputs``, and ``layers`` naming every layer's files,
    and ``progress_file``), run the program in the sandbox and return the files it left in
    ``root/outputs`` that its manifest names. What the program writes to its progress file
    (the share of its work done, a number from 0 to 1, rewritten as it goes) is passed to
    ``on_progress`` while it runs: its worker then ends an attempt that its pace shows to be
    a straggler sooner (``StageContext.progress``). ``namespaces``: False runs it as on a
    kernel that gives none (``BAGPIPE_SANDBOX``)."""
    inputs, outputs, scratch, work = (root / n for n in ("inputs", "outputs", "tmp", "work"))
    for folder in (inputs, outputs, scratch, work):
        folder.mkdir(parents=True)

    def stage(pairs: list[tuple[str, Path]], layer: str) -> list[str]:
        files = []
        for day, tif in pairs:
            stem = f"{task.get('product', 'input')}{layer}.{day}.{task.get('tile', 'tile')}"
            if reducer.input_format == "ENVI":
                staged = inputs / f"{stem}.bin"
                rasterio.shutil.copy(tif, staged, driver="ENVI")
                (inputs / f"{stem}.bin.aux.xml").unlink(missing_ok=True)
            else:
                staged = inputs / f"{stem}.tif"
                shutil.copyfile(tif, staged)
            files.append(str(staged))
        return files

    files = stage(tiles, "")
    layers = {name: stage(pairs, f".{name}") for name, pairs in (more or {}).items()}
    for staged in inputs.iterdir():
        staged.chmod(0o444)
    inputs.chmod(0o555)
    task_json = root / "task.json"
    progress = scratch / "progress"
    task_json.write_text(json.dumps(task | {
        "reducer": reducer.name, "dates": [day for day, _ in tiles], "inputs": files,
        "layers": {task.get("layer", "inputs"): files} | layers,
        "inputs_dir": str(inputs), "outputs_dir": str(outputs), "progress_file": str(progress),
    }, indent=1))
    env = BASE_ENV | dict(reducer.env) | {"HOME": str(scratch), "TMPDIR": str(scratch), "BAGPIPE_TASK": str(task_json)}
    ended = threading.Event()
    if on_progress is not None:
        threading.Thread(target=_watch_progress, args=(progress, on_progress, ended), name="reduce-progress",
                         daemon=True).start()
    try:
        result = sandbox.run(reducer.command(inputs, outputs, task_json), cwd=work, writable=[outputs, scratch],
                             readable=[reducer.here, root], stdout=root / "stdout.txt", stderr=root / "stderr.txt",
                             limits=reducer.limits, env=env, timeout_s=reducer.timeout_s, network=reducer.network,
                             namespaces=namespaces)
    finally:
        ended.set()
    made = [p for p in sorted(outputs.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.resolve().is_relative_to(outputs.resolve())
            and any(fnmatch.fnmatch(p.name, pattern) for pattern in reducer.outputs)]
    return Run(result, made, root)


@stages.stage(REDUCE_STAGE)
def reduce(ctx: StageContext) -> None:
    params = ctx.params
    if params.get("bundle"):  # an uploaded reducer: its checked, cached folder is its {here}
        reducer: reducers.Reducer | None = bundlecache.reducer_for(ctx.clients, params["bundle"])
    else:
        reducer = reducers.catalog(ctx.clients.settings.reducers_path).get(params["reducer"])
    if reducer is None:
        raise StageFailure(FailureClass.USER_CODE, f"reducer {params['reducer']!r} is not installed here")
    ready, missing, failed = inputs_of(ctx)
    if failed and params["on_failure"] == "fail":
        raise StageFailure(FailureClass.DEPENDENCY_FAILED, f"no tile for {', '.join(failed)}: its task failed "
                           "(the request says a reduction fails then)")
    if not ready and not failed:
        ctx.no_data = True  # the catalog has no data for any date of the span: nothing to reduce
        return
    if not ready:
        raise StageFailure(FailureClass.DEPENDENCY_FAILED, "not one tile of the span was made")
    layers = [name for name in params["layers"].split(",") if name]  # the planner names them all
    with tempfile.TemporaryDirectory(prefix="bagpipe-reduce-") as top:
        downloads = Path(top, "downloads")
        downloads.mkdir()

        def download(item: tuple[str, str, str]) -> Path:
            day, layer, blob = item
            local = downloads / f"{day}.{layer}.tif"
            local.write_bytes(ctx.clients.transfers.download(ctx.clients.tiles, blob)[0])
            return local

        wanted = [(item["date"], layer, blob) for item in ready
                  for layer, blob in zip(layers, item["blobs"], strict=True)]
        by_layer: dict[str, list[tuple[str, Path]]] = {layer: [] for layer in layers}
        with ThreadPoolExecutor(8) as pool:  # a task's inputs download in parallel
            for (day, layer, _), path in zip(wanted, pool.map(download, wanted), strict=True):
                by_layer[layer].append((day, path))
        run = run_program(reducer, by_layer[layers[0]], Path(top, "run"), {
            "job": ctx.job, "task": ctx.task, "product": params["product"], "layer": layers[0],
            "tile": params["tile"], "crs": params["crs"], "bounds": params["bounds"], "missing_dates": missing,
            "failed_dates": failed, "args": json.loads(params.get("args") or "{}"),
        }, {layer: by_layer[layer] for layer in layers[1:]}, ctx.progress,
            namespaces=ctx.clients.settings.sandbox == "auto")
        _publish_logs(ctx, run.folder)
        failure = run.failure(reducer)
        if failure is not None:
            raise failure
        outputs = run.folder / "outputs"
        for path in run.outputs:
            kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            ctx.write_output(path.relative_to(outputs).as_posix(), path.read_bytes(), kind)
