"""The processes bagpipe runs, as ``GET /processes`` lists them: each the official
specification of openEO's processes, served verbatim (``specs/``: the openEO processes
project's release 2.0.0-rc.2, see ``specs/SOURCE.md``). The list is what the compiler takes
(``graph.PROCESSES``): a process is listed only if a graph using it compiles onto tasks."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from pipeline.web.openeo import graph


@functools.cache
def specs() -> tuple[dict[str, Any], ...]:
    """Every listed process's specification, by id."""
    folder = resources.files("pipeline.web.openeo") / "specs"
    found = []
    for process in sorted(set(graph.PROCESSES)):
        spec: dict[str, Any] = json.loads((folder / f"{process}.json").read_text())
        found.append(spec)
    return tuple(found)
