"""The reduction stage ("reduce"): aggregate a target tile's reprojected tiles over the
request's span and run the scientist's program on them, in the sandbox.

The program gets its inputs in a read-only folder, an empty output folder, a private
temporary folder and ``task.json`` (what it is run on, the request's arguments, where to
write). Its exit code is the verdict; its stdout and stderr are kept as log blobs; only the
regular files it leaves in its output folder that match its manifest's patterns are
published (to ``products/{job}/``). An openEO UDF's (``pipeline.reduction.udf``) are kept in
``tiles`` instead, content-addressed as a built-in reduction's are: the same UDF over the
same tiles is run once.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rasterio.shutil

from pipeline import stages
from pipeline.failures import FailureClass, StageFailure
from pipeline.reduction import REDUCE_STAGE, bundlecache, reducers, sandbox
from pipeline.reduction.builtin import Fetched, Gathered, content_key, gather
from pipeline.science import rasters
from pipeline.stages import StageContext
from pipeline.storage import cache, names

LOG_BYTES = 1024 * 1024  # the tail of stdout/stderr kept as a log blob
MAX_OUTPUTS = 100  # files a reduction may publish (their names live on its task row)
MAX_NAME = 200  # characters of an output's path inside the output folder
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}


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


def program_task(*, job: str, task: str, product: str, layer: str, tile: str, crs: str, bounds: str,
                 missing_dates: list[str], failed_dates: list[str], args: dict[str, Any],
                 group: dict[str, str] | None = None, aliases: dict[str, str] | None = None,
                 encodings: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a program's ``task.json`` says of its task, before :func:`run_program` adds where
    its files are: the one builder of a worker's reduction and of ``bagpipe run-stage reduce``,
    so that a program debugged on a laptop reads what it will read on a worker. ``group``
    and ``aliases``: a reduction grouped in time's (a legacy reduction over the span has
    neither); ``encodings``: each input's, by alias (data type, nodata, scale, offset, unit,
    valid range), how its values decode (a worker's reductions give them)."""
    found = {"job": job, "task": task, "product": product, "layer": layer, "tile": tile, "crs": crs,
             "bounds": bounds, "missing_dates": missing_dates, "failed_dates": failed_dates, "args": args}
    if group is not None:
        found |= {"group": group, "aliases": aliases or {}}
    if encodings is not None:
        found["encodings"] = encodings
    return found


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
                on_progress: Callable[[float], None] | None = None,
                climatologies: dict[str, Path] | None = None, namespaces: bool = True) -> Run:
    """Stage ``tiles`` ((date, GeoTIFF) pairs of the first input: ``task``'s ``product`` and
    ``layer``), ``more`` (every other input's pairs, by ``PRODUCT.LAYER``) and
    ``climatologies`` (the baseline's, by input) read-only into ``root/inputs``, write
    ``task.json`` (``task`` plus where things are: ``inputs``, the first input's files;
    ``layers``, the first product's files by layer; ``by_input``, every input's dates and
    files by ``PRODUCT.LAYER``; ``baseline_files``; ``progress_file``), run the program in
    the sandbox and return the files it left in ``root/outputs`` that its manifest names,
    its GeoTIFFs carrying the manifest's declared unit and colour ramp, as COGs.
    What the program writes to its progress file (the share of its work done, a number from
    0 to 1, rewritten as it goes) is passed to ``on_progress`` while it runs: its worker then
    ends an attempt that its pace shows to be a straggler sooner (``StageContext.progress``).
    ``namespaces``: False runs it as on a kernel that gives none (``BAGPIPE_SANDBOX``)."""
    inputs, outputs, scratch, work = (root / n for n in ("inputs", "outputs", "tmp", "work"))
    for folder in (inputs, outputs, scratch, work):
        folder.mkdir(parents=True)

    def stage(pairs: list[tuple[str, Path]], label: str) -> list[str]:
        files = []
        for day, tif in pairs:
            stem = f"{label}.{day}.{task.get('tile', 'tile')}"
            if reducer.input_format == "ENVI":
                staged = inputs / f"{stem}.bin"
                rasterio.shutil.copy(tif, staged, driver="ENVI")
                (inputs / f"{stem}.bin.aux.xml").unlink(missing_ok=True)
            else:
                staged = inputs / f"{stem}.tif"
                shutil.copyfile(tif, staged)
            files.append(str(staged))
        return files

    product = task.get("product", "input")
    files = stage(tiles, product)
    staged = {ref: stage(pairs, ref) for ref, pairs in (more or {}).items()}
    baseline = {}
    for ref, path in (climatologies or {}).items():
        baseline[ref] = str(inputs / f"{ref}.climatology.{task.get('tile', 'tile')}.tif")
        shutil.copyfile(path, baseline[ref])
    for staged_file in inputs.iterdir():
        staged_file.chmod(0o444)
    inputs.chmod(0o555)
    task_json = root / "task.json"
    progress = scratch / "progress"
    first = f"{product}.{task['layer']}" if task.get("layer") else ""
    by_input = {first: {"dates": [day for day, _ in tiles], "files": files}} if first else {}
    by_input |= {ref: {"dates": [day for day, _ in (more or {})[ref]], "files": listed}
                 for ref, listed in staged.items()}
    task_json.write_text(json.dumps(task | {
        "reducer": reducer.name, "dates": [day for day, _ in tiles], "inputs": files,
        "layers": {task.get("layer", "inputs"): files} | {ref.split(".", 1)[1]: listed for ref, listed in staged.items()
                                                          if ref.split(".", 1)[0] == product},
        "by_input": by_input, **({"baseline_files": baseline} if baseline else {}),
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
    if result.exit_code == 0 and not result.why and len(made) <= MAX_OUTPUTS:
        for path in made:  # published as every other raster product is: its unit, streamable by range reads
            if path.suffix.lower() in (".tif", ".tiff"):
                rasters.declare(path, reducer.unit, reducer.colormap)
                rasters.make_cog(path)
    return Run(result, made, root)


@stages.stage(REDUCE_STAGE)
def reduce(ctx: StageContext) -> None:
    """A scientist's program over a target tile's group of dates, in the sandbox."""
    params = ctx.params
    if params.get("bundle"):  # an uploaded reducer: its checked, cached folder is its {here}
        reducer: reducers.Reducer | None = bundlecache.reducer_for(ctx.clients, params["bundle"])
    else:
        reducer = reducers.catalog(ctx.clients.settings.reducers_path).get(params["reducer"])
    if reducer is None:
        raise StageFailure(FailureClass.USER_CODE, f"reducer {params['reducer']!r} is not installed here")
    spec = json.loads(params["reduce"])
    inputs = [(alias, product, layer) for alias, product, layer in spec["inputs"]]
    found = gather(ctx, inputs)
    if found.failed and params["on_failure"] == "fail":
        raise StageFailure(FailureClass.DEPENDENCY_FAILED, f"no tile for {', '.join(found.failed)}: its task failed "
                           "(the request says a reduction fails then)")
    if not any(found.tiles.values()):
        if found.failed:
            raise StageFailure(FailureClass.DEPENDENCY_FAILED, "not one tile of the group was made")
        ctx.no_data = True  # the catalog has no data for any date of the group: nothing to reduce
        return
    if params.get("bundle") and params.get("udf"):  # set by the openEO compiler's program alone, never by a name
        _udf_outputs(ctx, reducer, spec, found)
        return
    for name, data, kind in _program_outputs(ctx, reducer, spec, found):
        ctx.write_output(name, data, kind)


def _udf_outputs(ctx: StageContext, reducer: reducers.Reducer, spec: dict[str, Any], found: Gathered) -> None:
    """A UDF's outputs, kept in ``tiles`` as a built-in reduction's are: content-addressed by
    its bundle (code, context, runtime) and what it reads (the input tiles' own addresses,
    the group), so the same UDF over the same tiles — a job again, a restart — finds them made
    and runs nothing (CACHED). The list of its files is kept beside them, written once they
    are (``cache.ensure``: made once, whoever asks); a list whose files have gone (expired
    apart) is made again."""
    params = ctx.params
    group, tile = params["group"], params["tile"]
    key = content_key(REDUCE_STAGE, params["bundle"], spec, group, params["start"], params["end"],
                      {alias: [blob for _, blob in dated] for alias, dated in found.tiles.items()})
    listing = names.reduced_blob(key, "outputs", group, tile).removesuffix(".tif") + ".json"
    tiles = ctx.clients.tiles

    def make() -> bytes:
        made = []
        for name, data, kind in _program_outputs(ctx, reducer, spec, found):
            blob = names.reduced_blob(key, name.removesuffix(".tif"), group, tile)
            ctx.clients.transfers.upload(tiles, blob, data, kind)
            made.append(blob)
        return json.dumps(made).encode()

    for _ in range(2):
        kept = cache.ensure(ctx.clients.transfers, tiles, listing, make, "application/json",
                            owner=f"{ctx.part}/{ctx.task}", tidy=ctx.attempt > 1)
        blobs: list[str] = json.loads(kept.data or b"[]")
        if kept.made or all(tiles.get_blob_client(blob).exists() for blob in blobs):
            break
        tiles.delete_blob(listing)  # its files expired before it: made again
    ctx.outputs.extend(names.TILE_OUTPUT_PREFIX + blob for blob in blobs)
    ctx.cached = not kept.made


def _program_outputs(ctx: StageContext, reducer: reducers.Reducer, spec: dict[str, Any],
                     found: Gathered) -> list[tuple[str, bytes, str]]:
    """Run the program over the group's tiles in the sandbox (its logs kept); its published
    files as (path in its output folder, content, media type); StageFailure if it failed."""
    params = ctx.params
    inputs = [(alias, product, layer) for alias, product, layer in spec["inputs"]]
    _, product, layer = inputs[0]
    with tempfile.TemporaryDirectory(prefix="bagpipe-reduce-") as top:
        downloads = Path(top, "downloads")
        downloads.mkdir()
        fetched = Fetched(ctx, found.blobs(), downloads)
        dated = {alias: [(day.isoformat(), fetched.paths[blob]) for day, blob in found.tiles[alias]]
                 for alias, _, _ in inputs}
        grouped = not spec.get("legacy")
        task = program_task(
            job=ctx.job, task=ctx.task, product=product, layer=layer, tile=params["tile"], crs=params["crs"],
            bounds=params["bounds"], missing_dates=sorted(set(found.missing)), failed_dates=found.failed,
            args=json.loads(params.get("args") or "{}"),
            group={"by": spec["by"], "key": params["group"], "start": params["start"], "end": params["end"]}
            if grouped else None,
            aliases={f"{p}.{name}": alias for alias, p, name in inputs} if grouped else None,
            encodings=json.loads(params["encodings"]) if params.get("encodings") else None)
        run = run_program(reducer, dated[inputs[0][0]], Path(top, "run"), task,
                          {f"{p}.{name}": dated[alias] for alias, p, name in inputs[1:]}, ctx.progress,
                          {f"{p}.{name}": fetched.paths[found.climatologies[alias]] for alias, p, name in inputs
                           if alias in found.climatologies}, namespaces=ctx.clients.settings.sandbox == "auto")
        _publish_logs(ctx, run.folder)
        failure = run.failure(reducer)
        if failure is not None:
            raise failure
        outputs = run.folder / "outputs"
        return [(path.relative_to(outputs).as_posix(), path.read_bytes(),
                 mimetypes.guess_type(path.name)[0] or "application/octet-stream") for path in run.outputs]
