"""Stages that misbehave on purpose, registered when a test names this module in
BAGPIPE_STAGE_MODULES (worker stage processes import it)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from pipeline import stages
from pipeline.stages import StageContext, digest


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
    """0.5 s normally; 10× slower on the first attempt of one input. Leaves a pid file (in
    BAGPIPE_TEST_PIDS, which conftest sets for the whole session) so a test can watch it."""
    Path(os.environ["BAGPIPE_TEST_PIDS"], f"{ctx.job}-{ctx.task}-{ctx.attempt}.pid").write_text(str(os.getpid()))
    time.sleep(5.0 if ctx.attempt == 1 and _marked(ctx) else 0.5)
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
