"""The tile stage of ``tests.harness.faults``: a small real GeoTIFF per target tile of the task's
batch (``planning.places``: the harness's jobs batch their tiles, so that a task counts itself
off several reductions) made once through the tile cache (content-addressed, with its
``.making`` marker), so that reductions have inputs and the harness can check that no marker
is left; a repeat of a job finds its tiles made at planning
(:func:`made_already`) and is settled there. The first attempt of the task of the tile
named :data:`LOST_TILE` hangs in each of its two periods: the harness loses its worker there, so
that every run has a monitor revocation of each kind — a heartbeat lapsed, and a worker
found slow (the harness has it report a stall first)."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
from affine import Affine
from rasterio.io import MemoryFile

from pipeline import planning, stages
from pipeline.lifecycle.status import TaskStatus
from pipeline.stages import StageContext
from pipeline.storage import cache, names
from pipeline.storage.clients import Clients

LOST_TILE = "x-0108y+0035"
LOST_DATE, SLOW_DATE = "2022-01-01", "2022-01-09"  # its first period's first attempt is lost; its second's is slow
HANGS_ENV = "BAGPIPE_FAULT_HANGS"  # the folder where the lost attempt says it hangs
SIDE = 16  # pixels


def _tile(params: dict[str, str]) -> bytes:
    seed = hashlib.sha256(f"{params['tile']}/{params['date']}".encode()).digest()
    values = np.random.default_rng(int.from_bytes(seed[:8], "big")).choice([25, 50, 200], (SIDE, SIDE))
    west, _, _, north = (float(b) for b in params["bounds"].split(","))
    step = float(params["res"])
    profile = {"driver": "GTiff", "width": SIDE, "height": SIDE, "count": 1, "dtype": "uint8", "nodata": 255,
               "crs": params["crs"], "transform": Affine(step, 0, west, 0, -step, north)}
    with MemoryFile() as memory:
        with memory.open(**profile) as dst:
            dst.write(values.astype("uint8"), 1)
        return memory.read()


def _name(params: dict[str, str]) -> str:
    """The tile's content-addressed name: what the task makes, or finds made."""
    key = hashlib.sha256(f"fault_tile/{params['tile']}/{params['date']}".encode()).hexdigest()
    return names.tile_blob(key, params["product"], "Maximum_Snow_Extent", params["tile"], params["date"])


@stages.made_already("fault_tile")
def made_already(clients: Clients, rows: list[Any]) -> dict[str, list[str]]:
    """The planned tasks whose every tile is in the cache (a repeat of a job): settled at planning."""
    wanted = {r.task: [_name(place) for place in planning.places(r.parameters())] for r in rows
              if r.stage == "fault_tile" and r.status is TaskStatus.PENDING}
    with cache.Looks(clients) as looks:
        there = looks.present(clients.tiles.container_name, (n for made in wanted.values() for n in made))
    return {task: [names.TILE_OUTPUT_PREFIX + name for name in made] for task, made in wanted.items()
            if all(name in there for name in made)}


@stages.stage("fault_tile")
def fault_tile(ctx: StageContext) -> None:
    places = planning.places(ctx.params)
    lost = any(place["tile"] == LOST_TILE for place in places)
    if lost and ctx.params["date"] in (LOST_DATE, SLOW_DATE) and ctx.attempt == 1:
        slow = ".slow" if ctx.params["date"] == SLOW_DATE else ""
        Path(os.environ[HANGS_ENV], f"{ctx.job}-{ctx.task}{slow}").touch()
        time.sleep(600)  # the harness loses this worker here (having found it slow first, if it says so)
    cached = True
    for place in places:
        name = _name(place)
        made = cache.ensure(ctx.clients.transfers, ctx.clients.tiles, name,
                            lambda place=place: _tile(place),  # type: ignore[misc]  # bound default
                            "image/tiff", want_data=False, owner=f"{ctx.job}/{ctx.task}", tidy=ctx.attempt > 1)
        cached = cached and not made.made
        ctx.outputs.append(names.TILE_OUTPUT_PREFIX + name)
    ctx.cached = cached
