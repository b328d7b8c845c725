"""A granule as a catalog lists it, named as NASA names it: short name, acquisition day,
tile, collection and production time (``MOD10A2.A2022033.h09v05.061.2022042050729``). The
production time makes a reprocessed granule a new granule, and a new source."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

NAME = re.compile(r"^(?P<product>M[OYC]D\w+)\.A(?P<year>\d{4})(?P<doy>\d{3})\.(?P<tile>h\d\dv\d\d)\."
                  r"(?P<collection>\d{3})\.(?P<made>\d{13})$")
HDF = "hdf"  # the key of a granule's HDF4 file (every layer in one) among its files
FILE = re.compile(r"^(?P<id>[^_]+?)(?:_(?P<rest>.+?))?\.(?:hdf|tiff?)$", re.IGNORECASE)


def named_in(file_name: str) -> tuple[str, str] | None:
    """(product, what follows the granule's id) of a granule's file as archives name it —
    its HDF4 file (``MOD10A2.A2022033.h09v05.061.2022042050729.hdf``: nothing follows) or a
    layer's GeoTIFF (``…2022042050729_Maximum_Snow_Extent.tif``: the layer) —, or None
    for a file not named so: a file says what it is of, for a command line not to guess."""
    found = FILE.match(file_name)
    granule = NAME.match(found["id"]) if found else None
    return (granule["product"], found["rest"] or "") if found and granule else None


def granule_id(file_name: str) -> str | None:
    """The id of the granule whose file (its HDF4 file or a layer's GeoTIFF) is named
    ``file_name``, or None for a file not named as archives name them."""
    found = FILE.match(file_name)
    return found["id"] if found and NAME.match(found["id"]) else None


@dataclass(frozen=True)
class Granule:
    """One granule as a catalog lists it: its id (the file name without extension), what it
    is of, and where its files are — a COG per layer (STAC assets) or the HDF4 file."""

    id: str
    product: str
    tile: str
    day: date
    files: tuple[tuple[str, str], ...]  # (layer name or "hdf", href)
    synthetic: bool = False  # made by the local stack's imitation, as its catalog entry says (``synthetic``)

    @classmethod
    def named(cls, name: str, files: dict[str, str], synthetic: bool = False) -> Granule | None:
        """The granule a file name describes, or None if it is not a MODIS tile granule's."""
        found = NAME.match(name)
        if not found:
            return None
        day = datetime.strptime(found["year"] + found["doy"], "%Y%j").date()
        return cls(name, found["product"], found["tile"], day, tuple(sorted(files.items())), synthetic)

    @property
    def made(self) -> str:
        """The production timestamp (YYYYDDDHHMMSS): a later one is a reprocessed granule."""
        return self.id.rsplit(".", 1)[-1]

    def href(self, key: str) -> str:
        return dict(self.files)[key]


def pick(granules: Iterable[Granule]) -> dict[tuple[str, str, date], Granule]:
    """One granule per (product, tile, day): the latest production where a catalog lists a
    reprocessed granule beside the one it replaces."""
    found: dict[tuple[str, str, date], Granule] = {}
    for granule in granules:
        key = (granule.product, granule.tile, granule.day)
        if key not in found or granule.made > found[key].made:
            found[key] = granule
    return found


def as_param(granules: Sequence[Granule]) -> str:
    """The task param naming a tile task's granules, by MODIS tile."""
    return json.dumps({g.tile: {"id": g.id, "files": dict(g.files)} | ({"synthetic": True} if g.synthetic else {})
                       for g in granules}, sort_keys=True)


def from_param(text: str | Mapping[str, Any]) -> list[Granule]:
    """The granules a task param names (see :func:`as_param`; or its JSON decoded, as a
    manifest's entry gives it)."""
    found = []
    for tile, entry in sorted((json.loads(text) if isinstance(text, str) else text).items()):
        granule = Granule.named(entry["id"], entry["files"], bool(entry.get("synthetic")))
        if granule is None or granule.tile != tile:
            raise ValueError(f"the task names no granule of {tile} it can read: {entry['id']!r}")
        found.append(granule)
    return found
