"""Scientists' reduction programs, declared by manifests: ``<dir>/<name>/reducer.json``.

A manifest says how to run the program (an argv template, never a shell line), which inputs
it takes, which outputs it is expected to leave, and its limits::

    {"name": "snow_fraction",
     "description": "Share of snow-covered land per pixel over the span, GeoTIFF + PNG",
     "argv": ["{python}", "{here}/snow_fraction.py", "{task}"],
     "outputs": ["*.tif", "*.png"],
     "timeout_s": 600,
     "limits": {"cpu_s": 600, "memory_mb": 2048, "file_mb": 512, "open_files": 256, "processes": 32},
     "env": {"OMP_NUM_THREADS": "1"}}

argv fields: ``{python}`` (the worker's interpreter, with rasterio), ``{here}`` (the
manifest's folder), ``{inputs}``, ``{outputs}``, ``{task}`` (the task.json path). A MATLAB
Compiler binary or a C program is just another argv[0]; ``"input_format": "ENVI"`` stages
the inputs as raw ENVI files (NAME.bin + NAME.hdr) for programs that have no GDAL.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

BUILTIN_DIR = Path(__file__).resolve().parent.parent / "reducers"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_FIELDS = {"python", "here", "inputs", "outputs", "task"}
_SECRET_WORDS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "CONNECTION", "SAS")


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 600  # CPU seconds (RLIMIT_CPU)
    memory_mb: int = 2048  # address space (RLIMIT_AS)
    file_mb: int = 512  # largest file it may write, stdout and stderr included (RLIMIT_FSIZE)
    open_files: int = 256  # RLIMIT_NOFILE
    processes: int = 32  # processes it may run at once (RLIMIT_NPROC, under its own user)


@dataclass(frozen=True)
class Reducer:
    name: str
    argv: tuple[str, ...]
    here: Path
    description: str = ""
    outputs: tuple[str, ...] = ("*",)
    input_format: str = "GTiff"  # or "ENVI": raw NAME.bin + NAME.hdr, for programs with no GDAL
    timeout_s: float = 600.0
    limits: Limits = field(default_factory=Limits)
    env: tuple[tuple[str, str], ...] = ()

    def command(self, inputs: Path, outputs: Path, task: Path) -> list[str]:
        values = {"python": sys.executable, "here": str(self.here), "inputs": str(inputs),
                  "outputs": str(outputs), "task": str(task)}
        return [part.format(**values) for part in self.argv]


def load(path: Path) -> Reducer:
    """A reducer from its manifest; ValueError saying what is wrong with it."""
    raw = json.loads(path.read_text())
    name = raw.get("name", "")
    if not _NAME.match(name):
        raise ValueError(f"{path}: name must be lowercase letters, digits, _ (got {name!r})")
    argv = raw.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"{path}: argv must be a non-empty list of strings (no shell line)")
    for part in argv:
        unknown = set(re.findall(r"{(\w*)}", part)) - _FIELDS
        if unknown:
            raise ValueError(f"{path}: unknown argv field(s) {sorted(unknown)}; known: {sorted(_FIELDS)}")
    env = {str(k): str(v) for k, v in raw.get("env", {}).items()}
    secret = [k for k in env if any(word in k.upper() for word in _SECRET_WORDS)]
    if secret:
        raise ValueError(f"{path}: a reducer gets no secrets; remove {secret} from env")
    return Reducer(name=name, argv=tuple(argv), here=path.parent, description=raw.get("description", ""),
                   outputs=tuple(raw.get("outputs", ["*"])), timeout_s=float(raw.get("timeout_s", 600)),
                   input_format=_input_format(path, raw.get("input_format", "GTiff")),
                   limits=Limits(**raw.get("limits", {})), env=tuple(sorted(env.items())))


def _input_format(path: Path, value: str) -> str:
    if value not in ("GTiff", "ENVI"):
        raise ValueError(f"{path}: input_format is GTiff or ENVI, not {value!r}")
    return value


@lru_cache(maxsize=8)
def catalog(extra_dirs: str = "") -> dict[str, Reducer]:
    """The reducers shipped in ``reducers/`` and those in the folders ``extra_dirs`` names
    (os.pathsep-separated: BAGPIPE_REDUCERS_PATH)."""
    found: dict[str, Reducer] = {}
    folders = [BUILTIN_DIR, *(Path(d) for d in extra_dirs.split(":") if d)]
    for folder in folders:
        for manifest in sorted(folder.glob("*/reducer.json")):
            reducer = load(manifest)
            found[reducer.name] = reducer
    return found
