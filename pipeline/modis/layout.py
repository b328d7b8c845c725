"""A finished job's manifest entries as products: what each task's outputs are, over which
dates, and under which name a scientist finds them — one answer for the results folder, the
overviews, the region mosaics and the STAC items.

- A **tile** (stage ``modis``): a layer of a product on a date, named ``PRODUCT.LAYER.DATE.TILE.tif``.
- A **reduction** over a group of dates: a program's (stage ``reduce``: the files it left,
  named as it named them) or a built-in's (stage ``aggregate``: ``NAME.GROUP.TILE.tif``),
  found under the reduction's name (a program's old form: its product) and its group.
- A **climatology** (stage ``climatology``): a baseline's statistics of one layer, found
  under its product and the baseline's days.
- A **gather** (stages ``sites``, ``zones``, ``cube``): the job's one table of its sites or
  zones (CSV and GeoParquet or Parquet), or a cube (netCDF, Zarr), found under ``sites``,
  ``zones`` or ``cubes``; a point task's and a zonal task's Parquet parts are what their
  gather joined.

An entry gives its task's parameters typed (:func:`typed`), where the task's row keeps them
as text: ``"res": 0.005``, a box as four numbers, ``"granules"`` as the object it is. The
readers here take an entry of text too (a manifest written before entries were typed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import date
from typing import Any

from pipeline.modis.products import CATALOG, last_day
from pipeline.storage import names

REDUCTIONS = ("reduce", "aggregate")
CLIMATOLOGY = "climatology"
GATHERS = {"sites": "sites", "zones": "zones", "cube": "cubes"}  # a gather's stage: its folder


NUMBERS = frozenset({"res", "work", "window"})  # a number
NUMBER_LISTS = frozenset({"bounds", "lonlat", "bbox", "percentiles", "feeds"})  # numbers, comma-separated
NAME_LISTS = frozenset({"sources", "layers", "statistics", "series"})  # names, comma-separated
RUNS = frozenset({"deps", "over"})  # runs of sequence numbers: first,count;first,count
DOCUMENTS = frozenset({"granules", "derived", "input", "encoding", "encodings", "reduce", "args", "windows"})  # JSON
FLAGS = frozenset({"intermediate"})  # "1": true


def typed(params: Mapping[str, str]) -> dict[str, Any]:
    """A task's parameters (text, as its row keeps them) as its manifest entry gives them:
    numbers as numbers, lists as lists (a box as its four numbers, runs as [first, count]
    pairs), JSON documents as the objects they are, anything else as its text."""
    found: dict[str, Any] = {}
    for key, text in params.items():
        if key in NUMBERS:
            found[key] = _number(text)
        elif key in NUMBER_LISTS:
            found[key] = [_number(v) for v in text.split(",") if v]
        elif key in NAME_LISTS:
            found[key] = [v for v in text.split(",") if v]
        elif key in RUNS:
            found[key] = runs(text)
        elif key in DOCUMENTS:
            found[key] = json.loads(text)
        elif key in FLAGS:
            found[key] = text == "1"
        else:
            found[key] = text
    return found


def _number(text: str) -> int | float:
    return int(text) if text.lstrip("-").isdigit() else float(text)


def document(task: Mapping[str, Any], key: str) -> Any:
    """A JSON parameter of an entry (None if it has none; a manifest written before entries
    were typed holds its text)."""
    value = task.get(key)
    if value is None or value == "":
        return None
    return json.loads(value) if isinstance(value, str) else value


def numbers(value: str | Sequence[float]) -> list[float]:
    """A list of numbers of an entry (a box: west, south, east, north), typed or as text."""
    return [float(v) for v in (value.split(",") if isinstance(value, str) else value)]


def runs(value: str | Sequence[Sequence[int]]) -> list[list[int]]:
    """Runs of sequence numbers ([first, count] pairs), typed or as text (``first,count;…``)."""
    if not isinstance(value, str):
        return [[int(first), int(count)] for first, count in value]
    return [[int(v) for v in run.split(",")] for run in value.split(";") if run]


def is_gather(task: dict[str, Any]) -> bool:
    """Whether the entry is a gather's (the job's one table or a cube, over all its tiles)."""
    return task["stage"] in GATHERS


def is_reduction(task: dict[str, Any]) -> bool:
    """Whether the entry is a reduction's (its outputs the job's own, over a group of dates)."""
    return task["stage"] in REDUCTIONS


def waits(task: dict[str, Any]) -> bool:
    """Whether the entry's task waited for others (a reduction, a climatology)."""
    return is_reduction(task) or task["stage"] == CLIMATOLOGY


def _reduction(task: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = document(task, "reduce") or {}
    return found


def folder(task: dict[str, Any]) -> str:
    """The first folder of the entry's files: its product, its reduction's name, or its
    gather's kind."""
    if is_gather(task):
        return GATHERS[task["stage"]]
    spec = _reduction(task)
    return str(task["product"] if not spec or spec.get("legacy") else spec["name"])


def span(task: dict[str, Any]) -> str:
    """The entry's dates as its folder names them: a date, a program's span of periods
    (``first_last``: their first days), a reduction's group, a climatology's days."""
    if task.get("group"):
        return str(task["group"])
    if task["stage"] == CLIMATOLOGY:
        windows = document(task, "windows")
        return f"{windows[0][0]}_{windows[-1][1]}"
    return f"{task['date']}_{task['last']}" if task.get("last") else str(task["date"])


def dates(task: dict[str, Any]) -> tuple[date, date]:
    """The first and last day the entry's products cover."""
    if task.get("start") and task.get("end"):
        return date.fromisoformat(task["start"]), date.fromisoformat(task["end"])
    if task["stage"] == CLIMATOLOGY:
        windows = document(task, "windows")
        return date.fromisoformat(windows[0][0]), date.fromisoformat(windows[-1][1])
    last = date.fromisoformat(task.get("last") or task["date"])
    return date.fromisoformat(task["date"]), last_day(CATALOG[task["product"]], last)


def output_name(task: dict[str, Any], name: str) -> str:
    """An output's name without its tile (and group): the same for every tile of the job, so
    that a mosaic or an overview gathers them."""
    stem = name.removesuffix(".tif")
    if task["stage"] == "aggregate" or (task["stage"] == "reduce" and task.get("group")):  # a UDF's, kept as these
        return stem.removesuffix(f".{task['group']}.{task['tile']}")
    if task["stage"] == CLIMATOLOGY:
        return stem.split(".climatology.", 1)[0].split(".", 1)[-1] + ".climatology"
    if task["stage"] == "reduce":
        return stem
    return stem.split(".")[1]  # a tile: PRODUCT.LAYER.DATE.TILE


def by_task(entries: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """A manifest's entries by their task (a task of several places has one per place)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        found.setdefault(entry["task"], []).append(entry)
    return found


def dependencies(task: dict[str, Any], by_key: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The entries of the tasks the entry's task waited for, in order (of a task of several
    places, the entry of the entry's own place: a reduction reads its target tile's)."""
    if not waits(task) or not task.get("deps"):
        return []
    found = []
    for first, count in runs(task["deps"]):
        for seq in range(first, first + count):
            entries = by_key.get(names.task_key(seq), [])
            found += [e for e in entries if e.get("tile") == task.get("tile")] if len(entries) > 1 else entries
    return found
