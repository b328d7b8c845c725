"""Stages of the tests and the benchmarks, registered when they name this module in
BAGPIPE_STAGE_MODULES (worker stage processes import it): light stand-ins for the MODIS
stages (``noop``, ``digest``: the lifecycle needs no rasters) and stages that misbehave on
purpose."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import time
from pathlib import Path

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

from pipeline import stages
from pipeline.failures import FailureClass, StageFailure
from pipeline.stages import StageContext

SOURCE_BYTES = 64 * 1024


def source_blob(product: str, tile: str, day: str) -> str:
    return f"{product}/{tile}/{day}.bin"


@stages.stage("noop")
def noop(ctx: StageContext) -> None:
    """Does nothing and writes nothing: what a task costs the framework alone (``bench.throughput``)."""


@stages.stage("digest")
def digest(ctx: StageContext) -> None:
    """A light stand-in for collection → reprojection that needs no catalog, no archive and no rasters
    (the lifecycle tests and benchmarks run it): make sure a (product, tile, date) source
    exists in ``sources`` (synthesised deterministically), read it back, write its summary."""
    product, tile, day = ctx.params["product"], ctx.params["tile"], ctx.params["date"]
    name = source_blob(product, tile, day)
    client = ctx.sources.get_blob_client(name)
    try:
        data = client.download_blob().readall()
    except ResourceNotFoundError:
        data = random.Random(f"{product}/{tile}/{day}").randbytes(SOURCE_BYTES)
        try:
            client.upload_blob(data, overwrite=False)
        except ResourceExistsError:
            data = client.download_blob().readall()
    histogram = [0] * 16
    for byte in data:
        histogram[byte >> 4] += 1
    summary = {
        "product": product,
        "tile": tile,
        "date": day,
        "source": name,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "mean": sum(data) / len(data) if data else 0.0,
        "histogram16": histogram,
    }
    ctx.write_output("summary.json", json.dumps(summary, indent=1).encode(), "application/json")


def _marked(ctx: StageContext) -> bool:
    return ctx.params["tile"] == "h10v05" and ctx.params["date"] == "2022-01-09"


@stages.stage("explode_one")
def explode_one(ctx: StageContext) -> None:
    """A user program that always fails on one input."""
    if _marked(ctx):
        raise ValueError("the reduction divided by zero")
    digest(ctx)


@stages.stage("flaky")
def flaky(ctx: StageContext) -> None:
    """Writes its output, then loses its connection on the first attempt of one input."""
    digest(ctx)
    if ctx.attempt == 1 and _marked(ctx):
        raise ConnectionError("connection reset by peer")


@stages.stage("slow")
def slow(ctx: StageContext) -> None:
    time.sleep(0.2)
    digest(ctx)


@stages.stage("straggler")
def straggler(ctx: StageContext) -> None:
    """0.5 s normally; 10× slower on the first attempt of one input (not on its backup).
    Leaves a pid file (in BAGPIPE_TEST_PIDS, which conftest sets for the whole session) so a
    test can watch it."""
    name = f"{ctx.job}-{ctx.task}-{ctx.attempt}{'b' if ctx.backup else ''}.pid"
    Path(os.environ["BAGPIPE_TEST_PIDS"], name).write_text(str(os.getpid()))
    time.sleep(5.0 if ctx.attempt == 1 and not ctx.backup and _marked(ctx) else 0.5)
    digest(ctx)


@stages.stage("paced_straggler")
def paced_straggler(ctx: StageContext) -> None:
    """As ``straggler`` (0.5 s, its pid file), but 8 s on the first attempt of one input, in
    ten steps, each saying the share of its work done."""
    name = f"{ctx.job}-{ctx.task}-{ctx.attempt}{'b' if ctx.backup else ''}.pid"
    Path(os.environ["BAGPIPE_TEST_PIDS"], name).write_text(str(os.getpid()))
    seconds = 8.0 if ctx.attempt == 1 and not ctx.backup and _marked(ctx) else 0.5
    ctx.progress(0.0)
    for step in range(10):
        time.sleep(seconds / 10)
        ctx.progress((step + 1) / 10)
    digest(ctx)


BACKUP_UNTIL_S = 5.3  # slow_copy's backup runs until this long after its attempt began


@stages.stage("slow_copy")
def slow_copy(ctx: StageContext) -> None:
    """0.5 s normally; 12 s on the first attempt of one input; that attempt's backup runs
    until BACKUP_UNTIL_S after the attempt began (its start in BAGPIPE_TEST_PIDS), so that
    it is running when a kill time shorter than that passes, whenever it started."""
    began = Path(os.environ["BAGPIPE_TEST_PIDS"], f"{ctx.job}-slow_copy.began")
    if not (ctx.attempt == 1 and _marked(ctx)):
        time.sleep(0.5)
    elif ctx.backup:
        time.sleep(max(0.5, float(began.read_text()) + BACKUP_UNTIL_S - time.time()))
    else:
        began.write_text(repr(time.time()))
        time.sleep(12.0)
    digest(ctx)


@stages.stage("stubborn")
def stubborn(ctx: StageContext) -> None:
    """Ignores SIGTERM and never ends on its first attempt of one input; it also starts a
    grandchild in its process group."""
    if ctx.attempt == 1 and _marked(ctx):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = os.fork()
        if child == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            while True:
                time.sleep(1)
        Path(os.environ["BAGPIPE_TEST_PIDS"], f"{ctx.job}-stubborn.pid").write_text(f"{os.getpid()} {child}")
        while True:
            time.sleep(1)
    digest(ctx)


@stages.stage("whoami")
def whoami(ctx: StageContext) -> None:
    """Names the process it ran in as its output; fails when its parameters ask it to."""
    if ctx.params.get("fail"):
        raise RuntimeError("asked to fail")
    ctx.outputs.append(str(os.getpid()))


@stages.stage("sleepy")
def sleepy(ctx: StageContext) -> None:
    """A minute on the first attempt of one input (leaving a pid file), at once otherwise."""
    if ctx.attempt == 1 and _marked(ctx):
        Path(os.environ["BAGPIPE_TEST_PIDS"], f"{ctx.job}-sleepy.pid").write_text(str(os.getpid()))
        time.sleep(60)
    digest(ctx)


@stages.stage("leaky")
def leaky(ctx: StageContext) -> None:
    """Fails on one input quoting a signed URL, FTP credentials and a connection string, as a
    feed's or an SDK's error can."""
    if _marked(ctx):
        raise StageFailure(FailureClass.SOURCE_DOWNLOAD,
            "GET https://modiseuwest.blob.core.windows.net/modis-061/x.tif?sv=2024-05-04&se=2026-11-24&sr=c"
            "&sp=rl&sig=TOPSECRETSIGNATURE%3D failed; tried ftp://alice:hunter2secret@ftp.example.org/x and "
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=TOPSECRETACCOUNTKEY==;")
    digest(ctx)


@stages.stage("undumpable")
def undumpable(ctx: StageContext) -> None:
    """Names whether its stage process may be read by others of its user (its dumpable flag)."""
    from worker import private

    ctx.outputs.append("private" if private.is_private() else "dumpable")


@stages.stage("many_outputs")
def many_outputs(ctx: StageContext) -> None:
    """Names more outputs than a task row can hold, on one input."""
    if _marked(ctx):
        ctx.outputs.extend(f"{ctx.output_prefix}part-{i:05d}-{'x' * 40}.bin" for i in range(1000))
        return
    digest(ctx)


@stages.stage("slow_maker")
def slow_maker(ctx: StageContext) -> None:
    """Makes a tile that takes a minute: it holds the tile's cache marker all the while."""
    from pipeline.storage import cache

    def make() -> bytes:
        time.sleep(60)
        return b"never"

    cache.ensure(ctx.clients.transfers, ctx.clients.tiles, ctx.params["name"], make, "image/tiff",
                 owner=f"{ctx.job}/{ctx.task}")


@stages.stage("slow_tidy")
def slow_tidy(ctx: StageContext) -> None:
    """Runs until it is stopped, then tidies up for 1.5 s — a call that keeps failing, retried
    after a sleep in its ``except`` — and notes in ``params["note"]`` that it finished."""
    note = Path(ctx.params["note"])
    try:
        note.write_text("started")
        time.sleep(60)
    finally:
        for _ in range(3):
            try:
                raise ConnectionError("storage unreachable")
            except ConnectionError:
                time.sleep(0.5)
        note.write_text("tidied")


@stages.stage("half_cached")
def half_cached(ctx: StageContext) -> None:
    """Finds its output already made (a cache hit, at once) for the first two dates, and
    computes the others (0.4 s)."""
    if ctx.params["date"] in ("2022-01-01", "2022-01-09"):
        ctx.cached = True
    else:
        time.sleep(0.4)
    digest(ctx)


@stages.stage("slow_machine")
def slow_machine(ctx: StageContext) -> None:
    """0.3 s, or 100× that in a worker started with BAGPIPE_TEST_SLOW_MACHINE set: a slow
    VM, whatever task it runs (found slow long before it would end)."""
    time.sleep(30.0 if os.environ.get("BAGPIPE_TEST_SLOW_MACHINE") else 0.3)
    digest(ctx)
