"""The job page's preview of a large table, read where the gather left it on Azurite: its
first rows, its ids and one zone's series equal what pyarrow reads of the whole file, while
the preview downloads a small share of it (the footer, one column, the row groups that may
hold the zone)."""

from __future__ import annotations

import io
import json
from datetime import date, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from azure.storage.blob import BlobClient

from pipeline.lifecycle import jobs, partitions, tasks
from pipeline.planning import TaskPlan
from pipeline.storage import names
from pipeline.storage.clients import Clients
from pipeline.web import tablepreview

ZONES, DATES = 40, 230


def zones_table() -> pa.Table:
    """A zonal table sorted by zone, as the gather writes it: a row per zone, input and date."""
    statistics = ("mean", "min", "max", "std", "count", "p10", "p90")
    rows: dict[str, list[Any]] = {name: [] for name in ("zone", "input", "key", "start", "end", "unit", *statistics)}
    for zone in range(ZONES):
        for day in range(DATES):
            start = date(2012, 1, 1) + timedelta(days=16 * day)
            for column, value in (("zone", f"field-{zone:03d}"), ("input", "MOD13A1.500m_16_days_NDVI"),
                                  ("key", start.isoformat()), ("start", start), ("end", start + timedelta(days=15)),
                                  ("unit", "NDVI"), *((name, zone / 100 + day / 1000 + n / 7)
                                                      for n, name in enumerate(statistics))):
                rows[column].append(value)
    return pa.table(rows)


def gathered(clients: Clients, table: str) -> jobs.JobRow:
    """A job's rows as its planner writes them, of a tile task and, last, the gather of its
    zones' table, whose committed output is ``table``; no manifest: the preview reads the
    gather's row."""
    plan = [TaskPlan("tile", {}), TaskPlan("zones_gather", {}, after_all=True)]
    row = jobs.new_row(clients, "{}", plan)
    for seq, spec in enumerate(plan):
        entity = tasks.task_entity(names.partition(row.job, partitions.bucket_of(seq, spec, row.buckets)), seq, spec,
                                   clients.settings.shards)
        clients.tasks.create_entity(entity | ({"Outputs": json.dumps([table])} if spec.after_all else {}))
    return row


def test_a_large_tables_preview_reads_its_footer_one_column_and_the_row_groups_of_one_zone(
        clients: Clients, monkeypatch: pytest.MonkeyPatch) -> None:
    blob = "ab/abcdef/zones.parquet"
    table = zones_table()
    written = io.BytesIO()
    pq.write_table(table, written, row_group_size=DATES)  # a row group per zone
    clients.tiles.upload_blob(blob, written.getvalue(), overwrite=True)
    job = gathered(clients, names.TILE_OUTPUT_PREFIX + blob)
    fetched: list[int] = []
    download = BlobClient.download_blob

    def counted(self: BlobClient, offset: int | None = None, length: int | None = None, **kwargs: Any) -> Any:
        fetched.append(length or 0)
        return download(self, offset, length, **kwargs)

    monkeypatch.setattr(BlobClient, "download_blob", counted)
    monkeypatch.setattr(tablepreview, "READ_AHEAD", 1024)  # a ranged read's least, a share of this small file's
    seen = tablepreview.preview(clients, job, "zones", 3, "field-017")
    whole = table.to_pylist()
    assert seen["total"] == ZONES * DATES and seen["columns"] == table.column_names
    assert seen["rows"] == [[v.isoformat() if isinstance(v, date) else v for v in r.values()] for r in whole[:3]]
    assert seen["ids"] == [f"field-{z:03d}" for z in range(ZONES)]
    (series,) = seen["series"]
    assert series["name"] == "MOD13A1.500m_16_days_NDVI" and series["unit"] == "NDVI"
    assert series["points"] == [[r["start"].isoformat(), r["mean"]] for r in whole if r["zone"] == "field-017"]
    assert sum(fetched) < written.tell() / 3, (sum(fetched), written.tell())

    with pytest.raises(tablepreview.TableMissing, match="no sites table"):
        tablepreview.preview(clients, job, "sites", 3, None)
