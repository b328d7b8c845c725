"""The retention part of ``bench.scale``: what keeping each kind of intermediate costs against
making it again, and so how long the deployment's lifecycle rule keeps it after its last
use (``pipeline.lifecycle.costs.keep_days``, written into infra/bicep/names.json by
``python -m pipeline.deployment`` from ``pipeline.lifecycle.costs.CACHED``).

Measured here on the real granule in data/modis: its HDF4 file (a cached source), and one
1° tile at 0.005° warped from it (a cached tile: its COG's size, and the warp's time, the
median of a few). A source is made again by fetching it from its archive, timed at an
assumed in-region rate (``FETCH``).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from bench.scale_report import Context, Part, table
from pipeline.lifecycle import costs
from pipeline.modis import reprojection
from pipeline.modis.granules import HDF
from pipeline.modis.products import CATALOG
from pipeline.storage import names

REAL = Path(__file__).resolve().parents[1] / "data" / "modis" / "MOD10A2.A2022033.h09v05.061.2022042050729.hdf"
TILE = (-108.0, 34.0, -107.0, 35.0)  # a 1° tile inside h09v05
FETCH_MB_S, FETCH_FIRST_BYTE_S = 50.0, 0.2  # assumed: an archive read in its own region
RUNS = 5


def measure() -> dict[str, tuple[float, float]]:
    """(bytes, seconds to make again) of a cached source and of a cached tile."""
    product = CATALOG["MOD10A2"]
    source_bytes = REAL.stat().st_size
    fetch_s = FETCH_FIRST_BYTE_S + source_bytes / 1e6 / FETCH_MB_S
    sources = [reprojection.Source(REAL.name.removesuffix(".hdf"), {HDF: REAL})]
    layer = product.layers[0]
    target = reprojection.Target("EPSG:4326", TILE, 0.005, layer.resampling)
    times, tile = [], b""
    for _ in range(RUNS):
        started = time.perf_counter()
        tile = reprojection.warp(sources, product, layer.name, target)
        times.append(time.perf_counter() - started)
    # a tile made again reads its source from the cache (a fetch's worth, in the region) and warps it
    return {names.SOURCES_CONTAINER: (float(source_bytes), fetch_s),
            names.TILES_CONTAINER: (float(len(tile)), statistics.median(times) + fetch_s)}


def part(ctx: Context) -> Part:
    measured = measure()
    rows, figures = [], {}
    for container, (size, remake_s) in measured.items():
        deployed_size, deployed_s = costs.CACHED[container]
        days = costs.keep_days(size, remake_s)
        month = size / 1e9 * costs.PRICES["blob_gb_month"].value
        rows.append((container, f"{size / 1e3:,.1f} KB", f"{remake_s:.2f} s", f"${remake_s * costs.SLOT_USD_PER_S:.2e}",
                     f"${month:.2e}", f"{days:,.0f}", f"{costs.keep_days(deployed_size, deployed_s):,.0f}"))
        figures[f"keep_days_{container}"] = round(days)
    markdown = f"""## Retention: what the cache keeps, and for how long

An intermediate is kept while keeping it costs less than making it again: after its last use
(storage records a read as an access; `pipeline/storage/cache.py` reads a cached blob's first byte
when it only asks whether it is there, so a cache hit counts), a blob stays until storing it
has cost what one remake would (`pipeline.lifecycle.costs.keep_days`). It is the ModisAzure paper's
reasoning (1 GB-month weighed against a small VM's hour) as a rent-or-buy rule: whatever
the future asks for, it spends at most twice what knowing the future would. Compute is a
worker slot's share of a {costs.REPLICA_VCPU:g} vCPU, {costs.REPLICA_GIB:g} GiB Container Apps
execution (${costs.SLOT_USD_PER_S * 3600:.3f} an hour); storage
${costs.PRICES['blob_gb_month'].value} a GB-month (hot, LRS; {costs.PRICE_LIST}).

Measured on the real MOD10A2 granule of data/modis (its HDF4 file as a cached source; one
1° tile at 0.005° warped from it, the median of {RUNS} warps, as a cached tile; a source
fetched again at an assumed {FETCH_MB_S:g} MB/s in its region, {FETCH_FIRST_BYTE_S} s to
its first byte):

{table(["container", "typical blob", "made again in", "remake costs", "a month stored costs",
        "keep after last use (days)", "deployed rule (days)"], rows)}

The deployed rule (`infra/bicep/modules/storage.bicep`, from `pipeline.lifecycle.costs.CACHED` through
`names.json`) deletes a cached source or tile once it has gone unread that long; last-access
tracking is on for the account. A reprojected tile is small and costs a warp to make again:
it is worth keeping for years, so in practice the tile cache only grows with what is asked
for. A source is larger and cheap to fetch again: kept days, not years, after its last use.
The scientists' products and the attempts' logs are not intermediates: they are deleted
`retentionDays` (a deployment parameter, 90 by default) after they were written.
"""
    return Part(figures, markdown)
