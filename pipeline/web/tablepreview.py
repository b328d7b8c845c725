"""A finished job's table previewed on its page: the first rows of its sites' or zones'
GeoParquet, the ids it holds, and one site's or zone's series per layer (or input).

The table is read where the gather left it, by ranged reads (the Parquet footer, then the
columns and row groups asked for), so a table of 50,000 sites over years answers in a few
reads and bounded memory, as a table of ten does: the ids are one column, a series the row
groups whose statistics may hold its id."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from datetime import date
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from azure.storage.blob import BlobClient

from pipeline.lifecycle import jobs, results, tasks
from pipeline.storage.clients import Clients

MAX_ROWS = 100  # rows a preview may ask for
MAX_IDS = 1000  # ids listed, in the table's order
READ_AHEAD = 1024 * 1024  # bytes a ranged read fetches at least


@dataclass(frozen=True)
class Shape:
    """What a kind of table holds: its id column, the column naming a series, its time
    column and the value a series plots."""

    id: str
    series: str
    time: str
    value: str


SHAPES = {"sites": Shape("site", "layer", "date", "value"), "zones": Shape("zone", "input", "start", "mean")}


class TableMissing(LookupError):
    """The job made no table of that kind."""


class BlobFile(io.RawIOBase):
    """A blob read as a seekable file, each read one ranged download."""

    def __init__(self, blob: BlobClient) -> None:
        self.blob = blob
        self.size = int(blob.get_blob_properties().size)
        self.position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        length = min(len(buffer), self.size - self.position)
        if length <= 0:
            return 0
        data = self.blob.download_blob(offset=self.position, length=length).readall()
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)


def locate(clients: Clients, job: jobs.JobRow, kind: str) -> BlobClient:
    """The blob of the job's ``kind`` table (GeoParquet), as the gather that wrote it names
    it: the job's gathers are its last tasks (``JobRow.gathers``), so their rows are one
    key range, a few rows, where the manifest lists every task (megabytes for a large job)."""
    suffix = f"/{kind}.parquet"
    gathers = tasks.list_tasks(clients.tasks, job.parts, job.first_gather, job.gathers) if job.gathers else []
    for task in gathers:
        for output in task.output_names():
            if output.endswith(suffix):
                container, blob = results.locate(clients, output)
                return clients.blob_service.get_blob_client(container, blob)
    raise TableMissing(f"job {job.job} made no {kind} table")


def _plain(value: Any) -> Any:
    """A cell as JSON has it: a date as ISO text, NaN as null."""
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _first(table: pq.ParquetFile, rows: int, columns: list[str]) -> list[dict[str, Any]]:
    """The first ``rows`` rows, from as many row groups as hold them."""
    found: list[dict[str, Any]] = []
    for group in range(table.num_row_groups):
        found += table.read_row_group(group, columns=columns).slice(0, rows - len(found)).to_pylist()
        if len(found) == rows:
            break
    return found


def _ids(table: pq.ParquetFile, column: str) -> list[str]:
    """The first MAX_IDS ids, in the table's order: one column, a row group at a time."""
    seen: dict[str, None] = {}
    for group in range(table.num_row_groups):
        for value in table.read_row_group(group, columns=[column]).column(0).to_pylist():
            seen.setdefault(str(value), None)
            if len(seen) == MAX_IDS:
                return list(seen)
    return list(seen)


def _may_hold(table: pq.ParquetFile, group: int, column: int, wanted: str) -> bool:
    """Whether row group ``group`` may hold ``wanted`` in ``column``, by its statistics."""
    stats = table.metadata.row_group(group).column(column).statistics
    if stats is None or not stats.has_min_max:
        return True
    return bool(str(stats.min) <= wanted <= str(stats.max))


def _series(table: pq.ParquetFile, shape: Shape, wanted: str) -> list[dict[str, Any]]:
    """``wanted``'s series: per layer (or input), its points (time, value) in time order."""
    names = table.schema_arrow.names
    index = names.index(shape.id)
    columns = [shape.id, shape.series, shape.time, shape.value, *(["unit"] if "unit" in names else [])]
    found: list[pa.Table] = []
    for group in range(table.num_row_groups):
        if _may_hold(table, group, index, wanted):
            part = table.read_row_group(group, columns=columns)
            found.append(part.filter(pc.equal(part.column(shape.id), wanted)))
    rows = pa.concat_tables(found).to_pylist() if found else []
    series: dict[str, dict[str, Any]] = {}
    for row in sorted(rows, key=lambda r: (str(r[shape.series]), r[shape.time])):
        one = series.setdefault(str(row[shape.series]), {"name": str(row[shape.series]),
                                                         "unit": row.get("unit") or "", "points": []})
        one["points"].append([_plain(row[shape.time]), _plain(row[shape.value])])
    return list(series.values())


def preview(clients: Clients, job: jobs.JobRow, kind: str, rows: int, wanted: str | None) -> dict[str, Any]:
    """The first ``rows`` rows of the job's ``kind`` table, its row count, its ids (the first
    MAX_IDS) and the series of ``wanted`` (else of its first id)."""
    shape = SHAPES[kind]
    with io.BufferedReader(BlobFile(locate(clients, job, kind)), buffer_size=READ_AHEAD) as handle:
        table = pq.ParquetFile(handle, pre_buffer=False)
        # a GeoParquet point's geometry (WKB) is the lon and lat columns beside it
        columns = [f.name for f in table.schema_arrow if not pa.types.is_binary(f.type)]
        ids = _ids(table, shape.id)
        chosen = wanted if wanted is not None else (ids[0] if ids else None)
        return {
            "kind": kind, "columns": columns, "total": table.metadata.num_rows,
            "rows": [[_plain(v) for v in row.values()] for row in _first(table, rows, columns)],
            "ids": ids, "id": chosen, "series": _series(table, shape, chosen) if chosen is not None else [],
        }
