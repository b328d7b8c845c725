"""Whether a source granule is synthetic: made by the local stack's imitation of the archives
(``bagpipe/modis_world.py``), not by NASA. Products made from one should say so.

A synthesized granule says it everywhere the archives describe a granule: its STAC item's
property and its CMR entry's field :data:`SYNTHETIC` (``true``), its HDF4 file's global
attribute and each COG layer's GDAL metadata item :data:`TAG` (``"true"``: GDAL reads a colon
in a metadata name as the end of the name). A real granule carries none of them.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pyhdf.error import HDF4Error
from pyhdf.SD import SD, SDC
from rasterio.errors import RasterioIOError
from rasterio.io import MemoryFile

SYNTHETIC = "bagpipe:synthetic"
TAG = "BAGPIPE_SYNTHETIC"
HDF4_MAGIC = b"\x0e\x03\x13\x01"


def is_synthetic(source: Path | bytes | Mapping[str, Any]) -> bool:
    """Whether a granule is synthetic, given one of its files (a path or its bytes: a COG
    layer or the HDF4 file) or its catalog entry (a STAC item, or a CMR granule entry).
    A file that is neither HDF4 nor a raster GDAL reads is not a granule: ValueError."""
    if isinstance(source, Mapping):
        marked = source.get("properties", {}).get(SYNTHETIC, source.get(SYNTHETIC, False))
        return marked is True or str(marked).lower() == "true"
    if isinstance(source, Path):
        with source.open("rb") as file:
            if file.read(4) == HDF4_MAGIC:
                return _hdf_marked(source)
        return _tif_marked(source.read_bytes())
    if source[:4] == HDF4_MAGIC:
        with tempfile.NamedTemporaryFile(suffix=".hdf") as tmp:  # the HDF4 library reads files only
            tmp.write(source)
            tmp.flush()
            return _hdf_marked(Path(tmp.name))
    return _tif_marked(source)


def _hdf_marked(path: Path) -> bool:
    try:
        sd = SD(str(path), SDC.READ)
    except HDF4Error as exc:
        raise ValueError(f"not an HDF4 file ({exc})") from None
    try:
        return str(sd.attributes().get(TAG, "")).lower() == "true"
    finally:
        sd.end()


def _tif_marked(data: bytes) -> bool:
    try:
        with MemoryFile(data) as memory, memory.open() as raster:
            return str(raster.tags().get(TAG, "")).lower() == "true"
    except RasterioIOError as exc:
        raise ValueError(f"not a raster GDAL reads ({exc})") from None
