"""The tables a job makes (its sites' values, its zones' statistics) as scientists open them:
CSV and (Geo)Parquet, written a part at a time so that memory holds one part, whatever the
table's length.

A table's parts are Arrow tables of one schema. The Parquet file keeps each column's unit
in its field's metadata (``unit``) and, with a point geometry, is GeoParquet 1.1 (a WKB
``geometry`` column, the ``geo`` metadata: lon/lat, OGC:CRS84) that
GeoPandas, DuckDB and QGIS open as a layer; the CSV has the same columns, less the geometry.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import shapely

GEOPARQUET_VERSION = "1.1.0"
# a sites' table: a row per site, date and layer (``pipeline.modis.points``)
SITES = pa.schema([
    ("site", pa.string()), ("lon", pa.float64()), ("lat", pa.float64()), ("product", pa.string()),
    ("layer", pa.string()), ("date", pa.date32()), ("value", pa.float64()), ("unit", pa.string()),
    ("quality", pa.int64()), ("quality_flags", pa.string()), ("usable", pa.bool_()),
    ("window_mean", pa.float64()), ("window_count", pa.int32()), ("status", pa.string()),
    ("tile", pa.string()), ("row", pa.int32()), ("col", pa.int32()), ("granule", pa.string()),
])


def with_units(schema: pa.Schema, units: dict[str, str]) -> pa.Schema:
    """``schema`` with each named column's unit in its field's metadata."""
    return pa.schema([f.with_metadata({b"unit": units[f.name].encode()}) if units.get(f.name) else f
                      for f in schema])


def to_parquet(table: pa.Table) -> bytes:
    """One part as Parquet bytes (what a task keeps of its part)."""
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def from_parquet(data: bytes) -> pa.Table:
    return pq.read_table(io.BytesIO(data))


class Writer:
    """A table written a part at a time into a CSV file and a Parquet file; with ``points``
    (the names of a lon and a lat column) the Parquet file is GeoParquet, a point per row."""

    def __init__(self, csv_path: Path, parquet_path: Path, schema: pa.Schema,
                 points: tuple[str, str] | None = None) -> None:
        self.schema, self.points = schema, points
        self._csv = csv_path.open("wb")
        self._header = True
        self.rows = 0
        stored = schema
        if points:
            stored = schema.append(pa.field("geometry", pa.binary())).with_metadata(
                {**(schema.metadata or {}), b"geo": json.dumps(geo_metadata()).encode()})
        self._parquet = pq.ParquetWriter(parquet_path, stored, compression="zstd")

    def write(self, part: pa.Table) -> None:
        part = part.select(self.schema.names).cast(self.schema)
        pacsv.write_csv(part, self._csv, pacsv.WriteOptions(include_header=self._header))
        self._header = False
        if self.points:
            lon = np.asarray(part.column(self.points[0]).to_numpy(zero_copy_only=False), dtype=float)
            lat = np.asarray(part.column(self.points[1]).to_numpy(zero_copy_only=False), dtype=float)
            wkb = shapely.to_wkb(shapely.points(lon, lat))
            part = part.append_column(pa.field("geometry", pa.binary()), pa.array(wkb, pa.binary()))
        self._parquet.write_table(part)
        self.rows += part.num_rows

    def close(self) -> None:
        """Finish both files (an empty table is its header alone)."""
        if self._header:
            self._csv.write((",".join(f'"{name}"' for name in self.schema.names) + "\n").encode())
        self._csv.close()
        self._parquet.close()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def geo_metadata() -> dict[str, Any]:
    """GeoParquet's file metadata for a WKB point column in lon/lat (no ``crs``: OGC:CRS84,
    the specification's default)."""
    column: dict[str, Any] = {"encoding": "WKB", "geometry_types": ["Point"]}
    return {"version": GEOPARQUET_VERSION, "primary_column": "geometry", "columns": {"geometry": column}}
