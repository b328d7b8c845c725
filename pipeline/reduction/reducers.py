"""Scientists' reduction programs, declared by manifests: ``<dir>/<name>/reducer.json``.

A manifest says how to run the program (an argv template, never a shell line), which inputs
it takes, which outputs it is expected to leave, and its limits::

    {"name": "snow_fraction",
     "description": "Share of snow-covered land per pixel over the span, GeoTIFF + PNG",
     "argv": ["{python}", "{here}/snow_fraction.py", "{task}"],
     "outputs": ["*.tif", "*.png"],
     "timeout_s": 600,
     "limits": {"cpu_s": 600, "memory_mb": 2048, "file_mb": 512, "open_files": 256, "processes": 32},
     "env": {"OMP_NUM_THREADS": "1"},
     "accepts": ["MOD10A2.Maximum_Snow_Extent", "MYD10A2.Maximum_Snow_Extent"],
     "output": {"unit": "1", "colormap": "Blues"}}

argv fields: ``{python}`` (the worker's interpreter, with rasterio), ``{here}`` (the
manifest's folder), ``{inputs}``, ``{outputs}``, ``{task}`` (the task.json path). A MATLAB
Compiler binary or a C program is just another argv[0]; ``"input_format": "ENVI"`` stages
the inputs as raw ENVI files (NAME.bin + NAME.hdr) for programs that have no GDAL.
``accepts`` names the inputs the program makes sense of (``PRODUCT.LAYER``, ``*`` and ``?``
as in file names; by default any): a request that gives it another is refused naming its
field. ``output`` says the unit and the colour ramp (a matplotlib colormap name, one of
``pipeline.science.ramps``) of its rasters: each published raster carries them (its bands'
unit where the program set none, the ramp in its ``BAGPIPE_COLORMAP`` tag), so that its
STAC item gives the unit and its overview is drawn on that ramp with the unit on its colour
bar.

A program has no network. An installed reducer (never an uploaded one: ``bundles`` refuses
the field) may list the hosts its program reaches, ``"network": {"hosts":
["data.example.org:443"]}``: through the sandbox's proxy (``HTTPS_PROXY`` in its
environment), to those hosts only and only at public addresses (``pipeline.reduction.proxy``).
A host is a name or a public IP address, and a port; loopback, link-local and private
addresses, and ``localhost``, are refused here.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import re
import sys
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from string import Formatter
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pipeline.reduction.proxy import public
from pipeline.science import ramps

log = logging.getLogger(__name__)
BUILTIN_DIR = Path(__file__).resolve().parents[2] / "reducers"
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_FIELDS = {"python", "here", "inputs", "outputs", "task"}
_SECRET_WORDS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "CONNECTION", "SAS")
_HOST = re.compile(r"^(?:\[(?P<ip6>[0-9a-fA-F:.]+)\]|(?P<name>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?))"
                   r":(?P<port>[0-9]{1,5})$")


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
    network: tuple[str, ...] = ()  # the "host:port"s it may reach, through the proxy (none: no network)
    accepts: tuple[str, ...] = ()  # the inputs it takes, as PRODUCT.LAYER patterns (none: any)
    unit: str = ""  # its rasters' unit
    colormap: str = ""  # their colour ramp (a matplotlib name)

    def command(self, inputs: Path, outputs: Path, task: Path) -> list[str]:
        values = {"python": sys.executable, "here": str(self.here), "inputs": str(inputs),
                  "outputs": str(outputs), "task": str(task)}
        return [part.format(**values) for part in self.argv]


@dataclass(frozen=True)
class Program:
    """The reduction a job runs, as resolved when it was submitted: a reducer installed on
    the workers (by name), or a bundle a scientist uploaded (by its exact content digest)."""

    name: str
    owner: str = ""  # a bundle's owner ("" for an installed reducer)
    version: int = 0
    digest: str = ""  # the SHA-256 of the bundle's canonical form
    accepts: tuple[str, ...] = ()  # the inputs its manifest says it takes (PRODUCT.LAYER patterns; none: any)
    # an openEO UDF's bundle, made by the graph compiler (``pipeline.reduction.udf``): its outputs
    # are kept content-addressed in tiles. Set only there — an upload's name is its owner's to choose
    udf: bool = False

    @property
    def label(self) -> str:
        return f"{self.owner}/{self.name}@{self.version}" if self.digest else self.name

    def params(self) -> dict[str, str]:
        """What a reduction task row carries (no "/": a runtime history key is made of it)."""
        if not self.digest:
            return {"reducer": self.name}
        return {"reducer": f"{self.name}@{self.version}", "bundle": self.digest} | ({"udf": "1"} if self.udf else {})

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Program:
        found = json.loads(text)
        return cls(**found | {"accepts": tuple(found.get("accepts", ()))})

    def refused(self, refs: list[str]) -> list[str]:
        """Of the inputs ``refs`` (``PRODUCT.LAYER``), those its manifest does not take."""
        return [ref for ref in refs if self.accepts and not any(fnmatch.fnmatchcase(ref, p) for p in self.accepts)]


class _Limits(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cpu_s: Annotated[int, Field(ge=1, le=86_400)] = Limits.cpu_s
    memory_mb: Annotated[int, Field(ge=64, le=262_144)] = Limits.memory_mb
    file_mb: Annotated[int, Field(ge=1, le=65_536)] = Limits.file_mb
    open_files: Annotated[int, Field(ge=16, le=65_536)] = Limits.open_files
    processes: Annotated[int, Field(ge=1, le=4096)] = Limits.processes


class _Network(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hosts: Annotated[list[str], Field(min_length=1, max_length=32)]

    @field_validator("hosts")
    @classmethod
    def _public_hosts(cls, hosts: list[str]) -> list[str]:
        return [_host(host) for host in hosts]


def _host(text: str) -> str:
    """A listed host, "name:port" in lower case; ValueError if it is not one or is never reachable."""
    match = _HOST.match(text)
    port = int(match["port"]) if match else 0
    if not match or not 1 <= port <= 65_535:
        raise ValueError(f"{text!r}: a host is NAME:PORT or IP:PORT ([IPv6]:PORT), the port from 1 to 65535")
    host = (match["ip6"] or match["name"]).lower()
    try:
        literal = public(host)
    except ValueError:  # a name: the proxy checks the addresses it resolves to, each time
        literal = host != "localhost" and not host.endswith(".localhost")
    if not literal:
        raise ValueError(f"{text!r}: loopback, link-local and private addresses are never reachable")
    return f"{host}:{port}"


class _Output(BaseModel):
    model_config = ConfigDict(extra="forbid")
    unit: Annotated[str, Field(max_length=32)] = ""
    colormap: Annotated[str, Field(pattern=r"^[A-Za-z0-9_]{0,32}$")] = ""

    @field_validator("colormap")
    @classmethod
    def _known_ramp(cls, colormap: str) -> str:
        if colormap and not ramps.known(colormap):
            raise ValueError(f"{colormap!r} is not a colour ramp bagpipe draws; it draws {', '.join(ramps.names())} "
                             "(each reversed as NAME_r)")
        return colormap


class _Manifest(BaseModel):
    """reducer.json as written by a scientist: every field typed and bounded, nothing extra."""

    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Field(pattern=_NAME.pattern)]
    argv: Annotated[list[str], Field(min_length=1, max_length=256)]
    description: Annotated[str, Field(max_length=1000)] = ""
    outputs: Annotated[list[Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[^/\\]+$")]],
                       Field(min_length=1, max_length=64)] = ["*"]
    input_format: Literal["GTiff", "ENVI"] = "GTiff"
    timeout_s: Annotated[float, Field(gt=0, le=86_400, allow_inf_nan=False)] = 600.0
    limits: _Limits = _Limits()
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], str] = {}
    network: _Network | None = None  # false in a manifest: none
    accepts: Annotated[list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_*?]+\.[A-Za-z0-9_*?]+$", max_length=100)]],
                       Field(max_length=64)] = []
    output: _Output = _Output()

    @field_validator("network", mode="before")
    @classmethod
    def _hosts_listed(cls, network: object) -> object:
        if network is True:
            raise ValueError('a reducer lists the hosts it reaches: {"hosts": ["data.example.org:443"]}')
        return None if network is False else network

    @field_validator("argv")
    @classmethod
    def _only_known_fields(cls, argv: list[str]) -> list[str]:
        for part in argv:
            try:
                fields = [(name, spec, conv) for _, name, spec, conv in Formatter().parse(part) if name is not None]
            except ValueError as exc:
                raise ValueError(f"{part!r}: {exc}") from None
            if any(name not in _FIELDS or spec or conv for name, spec, conv in fields):
                raise ValueError(f"{part!r}: argv fields are {', '.join(sorted('{' + f + '}' for f in _FIELDS))}, "
                                 "with no format spec")
        return argv

    @field_validator("env")
    @classmethod
    def _no_secrets(cls, env: dict[str, str]) -> dict[str, str]:
        secret = [k for k in env if any(word in k.upper() for word in _SECRET_WORDS)]
        if secret:
            raise ValueError(f"a reducer gets no secrets; remove {secret}")
        return env


def parse(data: bytes, here: Path, where: str) -> Reducer:
    """A reducer from a manifest's bytes, its program in ``here``; ValueError naming
    ``where`` and the field that is wrong."""
    try:
        raw = _Manifest.model_validate_json(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'manifest'}: {e['msg']}"
                             for e in exc.errors())
        raise ValueError(f"{where}: {problems}") from None
    return Reducer(name=raw.name, argv=tuple(raw.argv), here=here, description=raw.description,
                   outputs=tuple(raw.outputs), timeout_s=raw.timeout_s, input_format=raw.input_format,
                   limits=Limits(**raw.limits.model_dump()), env=tuple(sorted(raw.env.items())),
                   network=tuple(raw.network.hosts) if raw.network else (), accepts=tuple(raw.accepts),
                   unit=raw.output.unit, colormap=raw.output.colormap)


def load(path: Path) -> Reducer:
    """A reducer from its manifest file; ValueError naming the file and the field that is wrong."""
    return parse(path.read_bytes(), path.parent, str(path))


@lru_cache(maxsize=8)
def catalog(extra_dirs: str = "") -> dict[str, Reducer]:
    """The reducers shipped in ``reducers/`` and those in the folders ``extra_dirs`` names
    (os.pathsep-separated: BAGPIPE_REDUCERS_PATH)."""
    found: dict[str, Reducer] = {}
    folders = [BUILTIN_DIR, *(Path(d) for d in extra_dirs.split(":") if d)]
    for folder in folders:
        for manifest in sorted(folder.glob("*/reducer.json")):
            try:
                reducer = load(manifest)
            except (OSError, ValueError) as exc:  # one broken manifest does not hide the others
                log.error("reducer not loaded: %s", exc)
                continue
            found[reducer.name] = reducer
    return found
