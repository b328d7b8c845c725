"""Which planned tile tasks the cache has made already: a repeat request costs almost nothing.

A tile task names its inputs (the granule ids and files in its params), so its outputs'
content addresses can be computed before it runs: the MD5s of its cached source files give
the key of each reprojected layer of each of its target tiles (``tilestage.tile_name``, the
stage's own, of each place: ``planning.places``). The planner
asks here which of a job's PENDING tile tasks have every output in ``tiles`` already, and
settles those without a message or a worker. The looks are batched — each distinct source
and tile read once, a bounded number at a time (``cache.Looks``) — and anything
uncertain (a source or tile missing, a read that failed, a maker at work) leaves its task
to the ordinary way, where the stage finds out for itself.
"""

from __future__ import annotations

from pipeline import planning, stages
from pipeline.failures import StageFailure
from pipeline.lifecycle.status import TaskStatus
from pipeline.lifecycle.tasks import TaskRow
from pipeline.modis import TILE_STAGE, tilestage
from pipeline.storage import cache, names
from pipeline.storage.clients import Clients


@stages.made_already(TILE_STAGE)
def made_already(clients: Clients, rows: list[TaskRow]) -> dict[str, list[str]]:
    """Of the task ``rows``, the PENDING tile tasks whose every output is in the cache, by
    row key: their outputs, named as the stage names them when it finds them made."""
    wanted: dict[str, tuple[dict[str, str], dict[tuple[str, str], str]]] = {}
    for row in rows:
        if row.stage != TILE_STAGE or row.status is not TaskStatus.PENDING:
            continue
        params = row.parameters()
        try:
            sources = tilestage.source_blobs(params) if params.get("granules") else {}
        except (StageFailure, ValueError, KeyError):
            continue  # a catalog entry the stage would refuse: its failure is the stage's to report
        if sources:  # none: the catalog has no granule of it, NO_DATA is the stage's to say
            wanted[row.task] = (params, sources)
    if not wanted:
        return {}
    with cache.Looks(clients) as looks:
        digests = looks.present(clients.sources.container_name,
                                (blob for _, sources in wanted.values() for blob in sources.values()))
        made: dict[str, list[str]] = {}
        for task, (params, sources) in wanted.items():
            if all(blob in digests for blob in sources.values()):
                hexes = {item: digests[blob].hex() for item, blob in sources.items()}
                made[task] = []
                for place in planning.places(params):  # each target tile of a batch, by its own granules
                    if place.get("granules", "{}") != "{}":
                        layers = {layer: tilestage.tile_name(place, layer, hexes)
                                  for layer in tilestage.layers_of(place)}
                        made[task] += [*layers.values(), *tilestage.derived_names(place, layers).values()]
        tiles = looks.present(clients.tiles.container_name, (blob for blobs in made.values() for blob in blobs))
    return {task: [names.TILE_OUTPUT_PREFIX + blob for blob in blobs]
            for task, blobs in made.items() if all(blob in tiles for blob in blobs)}
