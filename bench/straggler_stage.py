"""Stages with a known runtime distribution, for ``bench.stragglers``.

Per-machine model (``bench_work``): every task is 5–9 s of work (fixed by its tile and
date) done in steps of 20 ms, each counting the time it took up to 30 ms, so that work
advances only while its process runs: a worker whose process tree the benchmark
duty-cycles with SIGSTOP/SIGCONT is a slow machine, and the task cannot tell (a plain
sleep would go on ticking while the process is stopped). A wake-up late by less than
10 ms, as on a loaded machine, still counts whole.

Per-task model: every task sleeps 1.0–1.8 s (fixed by its tile and date): long enough that the run is
bound by the slots, as a real job's compute is, not by the local storage emulator. In ``bench_straggle`` 16% of
the tasks (also fixed by tile and date) run 4–10× slower on their first attempt, as the
ModisAzure paper saw VMs do; a retry, or a backup copy of the first attempt, runs at normal speed.

Each says the share of its work done as it goes (``StageContext.progress``), as a real
stage can (inputs read, rows written): what it has done, not how fast.
"""

from __future__ import annotations

import hashlib
import time

from pipeline import stages
from pipeline.stages import StageContext

SLOW_SHARE = 0.16
STEP_S = 0.02
STEP_COUNTS_AT_MOST_S = 0.03
PACE_STEPS = 50  # a per-task model's task does its work in this many steps (its word sent at most every 0.1 s)


def _draw(ctx: StageContext, salt: str) -> float:
    key = f"{salt}/{ctx.params['tile']}/{ctx.params['date']}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64


def base_seconds(ctx: StageContext) -> float:
    return 1.0 + 0.8 * _draw(ctx, "base")


def slowdown(ctx: StageContext) -> float:
    """4–10× for the straggling share on a first attempt (not its backup), else 1."""
    if ctx.attempt == 1 and not ctx.backup and _draw(ctx, "slow") < SLOW_SHARE:
        return 4 + 6 * _draw(ctx, "factor")
    return 1.0


def sleep_saying(ctx: StageContext, seconds: float) -> None:
    """Sleep ``seconds`` in PACE_STEPS steps, saying the share done as the work begins and
    after each step: a task's work, and what a stage knows of it (not how fast it goes)."""
    ctx.progress(0.0)
    for step in range(PACE_STEPS):
        time.sleep(seconds / PACE_STEPS)
        ctx.progress((step + 1) / PACE_STEPS)


@stages.stage("bench_clean")
def clean(ctx: StageContext) -> None:
    sleep_saying(ctx, base_seconds(ctx))
    ctx.write_output("done.txt", b"ok", "text/plain")


@stages.stage("bench_straggle")
def straggle(ctx: StageContext) -> None:
    sleep_saying(ctx, base_seconds(ctx) * slowdown(ctx))
    ctx.write_output("done.txt", b"ok", "text/plain")


def work_seconds(ctx: StageContext) -> float:
    return 5.0 + 4.0 * _draw(ctx, "work")


@stages.stage("bench_work")
def work(ctx: StageContext) -> None:
    last, whole = time.monotonic(), work_seconds(ctx)
    left = whole
    ctx.progress(0.0)
    while left > 0:
        time.sleep(STEP_S)
        now = time.monotonic()
        left -= min(now - last, STEP_COUNTS_AT_MOST_S)
        last = now
        ctx.progress(1 - left / whole)
    ctx.write_output("done.txt", b"ok", "text/plain")
