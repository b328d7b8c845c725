"""The repeat part of ``bench.scale``: what a request costs the second time.

The demo's request (``bagpipe.cli.DEMO_REQUEST``: 12 target tiles × 6 periods of MOD10A2,
72 tile tasks, granules from the local Planetary Computer) is run on the local stack's
pieces in one process — Azurite, the Planetary Computer imitation, the control loop and two
workers of four slots — then submitted again: every tile is in the cache by then, so the
planner settles every tile task at planning (``transitions.settle``), with no message and
no worker. Each is timed from its submission to its SUCCEEDED state, side by side in one
run; ``repeat_speedup`` is the first's time over the repeat's. The same again with the
demo's reducer (12 reductions, which are not cached: they run again) in a deployment of
its own, for what a repeat of the demo itself costs.
"""

from __future__ import annotations

import copy
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bagpipe.azurite import Azurite
from bagpipe.cli import DEMO_REQUEST
from bagpipe.mailserver import MailServer
from bagpipe.planetary import Planetary
from bench.scale_report import Context, Part, table
from bench.throughput import running
from pipeline.lifecycle import jobs, tasks
from pipeline.requests import application
from pipeline.requests.request import JobRequest
from pipeline.settings import Settings
from pipeline.storage.clients import Clients
from worker.child import StageProcess

WORKERS, SLOTS = 2, 4  # as `make demo` runs it
TIMEOUT_S = 600.0
POLL_S = 0.25  # the benchmark's look at its job
REPEATS = 5  # repeats of a request timed: the median is reported (each later one finds more rows in Azurite)


@contextmanager
def deployment(azurite: Azurite, planetary: Planetary, mail: MailServer) -> Iterator[Settings]:
    """A deployment of its own (its own cache) with its control loop and workers running."""
    settings = Settings(storage_connection=azurite.connection_string, namespace=f"r{secrets.token_hex(5)}",
                        mail_mode="smtp", smtp_port=mail.port, tile_stage="modis", catalog="stac",
                        stac_url=planetary.stac_url, stac_sas_url=planetary.sas_url)
    Clients(settings).ensure_resources()
    with running(settings, WORKERS, SLOTS, idle_sleep=0.05, sweep_every=1.0):
        yield settings


def timed_job(clients: Clients, body: dict[str, Any]) -> tuple[float, str, float | None]:
    """Seconds from the request's submission to its job's SUCCEEDED state, and the job, as
    the job row says (its ``created_at`` and ``finished_at``): polled only every
    :data:`POLL_S`, which neither rounds the time nor loads the storage the job uses; and
    when its last tile task was settled at planning, if any was (seconds after the submission)."""
    job = application.submit(clients, JobRequest.model_validate(body)).job
    give_up = time.monotonic() + TIMEOUT_S
    while not (row := jobs.get(clients, job)).state.finished:
        if time.monotonic() > give_up:
            raise RuntimeError(f"{job} still {row.state} after {TIMEOUT_S:.0f} s")
        time.sleep(POLL_S)
    if row.state != "SUCCEEDED" or row.finished_at is None:
        raise RuntimeError(f"{job} ended {row.state}")
    settled = [r.settled_at for r in tasks.list_tasks(clients.tasks, row.parts) if r.settled_at]
    settled_s = (max(settled) - row.created_at).total_seconds() if settled else None
    return (row.finished_at - row.created_at).total_seconds(), job, settled_s


def first_and_repeat(azurite: Azurite, planetary: Planetary, mail: MailServer,
                     body: dict[str, Any]) -> dict[str, Any]:
    """The request run once, then :data:`REPEATS` times again, in a fresh deployment: the
    first time, the median repeat (with its phases and what it did), and the repeats' range."""
    with deployment(azurite, planetary, mail) as settings:
        clients = Clients(settings)
        first_s, _, _ = timed_job(clients, body)
        runs = sorted((timed_job(clients, body) for _ in range(REPEATS)), key=lambda run: run[0])
        repeat_s, job, settled_s = runs[len(runs) // 2]
        rows = tasks.list_tasks(clients.tasks, jobs.get(clients, job).parts)
        tiles = [r for r in rows if r.stage == "modis"]
    settled_s = settled_s or 0.0
    return {"first_s": first_s, "repeat_s": repeat_s, "tiles": len(tiles), "tasks": len(rows),
            "settled": sum(1 for r in tiles if r.settled_at), "settled_s": settled_s, "after_s": repeat_s - settled_s,
            "fastest_s": runs[0][0], "slowest_s": runs[-1][0]}


def part(ctx: Context) -> Part:
    tiles_only = {k: v for k, v in copy.deepcopy(DEMO_REQUEST).items() if k != "reducer"}
    StageProcess(Settings(storage_connection="UseDevelopmentStorage=true")).close()  # its fork server, untimed
    azurite = Azurite(Path(ctx.tmp, "repeat-azurite")).start()
    mail = MailServer(Path(ctx.tmp, "repeat-mail")).start()
    try:
        with Planetary(azurite.connection_string) as planetary:
            plain = first_and_repeat(azurite, planetary, mail, tiles_only)
            reduced = first_and_repeat(azurite, planetary, mail, copy.deepcopy(DEMO_REQUEST))
    finally:
        mail.stop()
        azurite.stop()
    speedup = plain["first_s"] / plain["repeat_s"]
    with_reductions = reduced["first_s"] / reduced["repeat_s"]
    figures = {"repeat_speedup": round(speedup, 1), "repeat_first_s": round(plain["first_s"], 2),
               "repeat_again_s": round(plain["repeat_s"], 3), "repeat_fastest_s": round(plain["fastest_s"], 3),
               "repeat_slowest_s": round(plain["slowest_s"], 3), "repeat_settled": plain["settled"],
               "repeat_with_reductions_speedup": round(with_reductions, 1),
               "repeat_settled_s": round(plain["settled_s"], 3), "repeat_after_s": round(plain["after_s"], 3)}
    rows = [(label, run["tasks"], f"{run['first_s']:.2f} s", f"{run['repeat_s']:.2f} s",
             f"{run['fastest_s']:.2f}–{run['slowest_s']:.2f} s", f"{run['settled_s']:.2f} s", f"{run['after_s']:.2f} s",
             f"{run['settled']} of {run['tiles']}", f"{run['first_s'] / run['repeat_s']:.1f}×")
            for label, run in (("the demo's tiles, no reducer", plain), ("the demo (12 reductions)", reduced))]
    markdown = f"""## A repeat request

The demo's request run once, then {REPEATS} times again, on the local stack's pieces
(Azurite, the Planetary Computer imitation, the control loop, {WORKERS} workers of {SLOTS}
slots, in one process), each timed from its submission to SUCCEEDED by its job row's own
times (`created_at`, `finished_at`); the median repeat is reported, with the range of the
{REPEATS}. Every repeat finds every tile in the cache: the planner computes each tile task's
content address from its granules and the MD5s of its cached sources, looks at the cache in
batches (a one-byte read of each blob, 32 at a time on one asynchronous client whose
connections the sources' and the tiles' looks share: `cache.Looks`), and settles the tasks
whose every output is there at planning (PENDING → CACHED, `transitions.settle`), with no
message, no claim and no attempt. The finisher then finds the job's overviews and packs made already: an overview
of cached tiles and the packs of a job's cached tiles are content-addressed by their tiles'
names (`overview.cache_key`, `packing.cache_address`), so the repeat copies its overviews
(several at once) and names the same packs, reading no tile. Reductions are not cached: a
repeat of a request with a reducer runs them again. "Settled" is from the submission to the
last tile task settled at planning (the planner's search, rows and looks at the cache),
"after" from there to SUCCEEDED (the start, the manifest, overviews, packs, email; and the
reductions, if any).

{table(["request", "tasks", "first run", "repeat (median)", "repeats' range", "repeat: settled", "repeat: after",
        "settled at planning", "speedup"], rows)}

`repeat_speedup` = {speedup:.1f} (the first run's time over the median repeat's, the tiles alone).
"""
    return Part(figures, markdown)
