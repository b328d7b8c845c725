"""The fault plan of one run of the fault-injection scenario (``tests.harness.fault_run``):
the SDK's per-request hooks name every storage call the run's components make by what it
does — who calls, the method, the table, queue or container, the kind of row or blob, the
statuses a write sets — and number the calls of each name in the order they come, so that a
point (``name#n``) found in one run is hit again in the next, wherever the calls around it
have moved. A plan fails one or more points — refused before it is sent, its answer dropped
after it applied, or its caller's process crashed there."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from azure.core.exceptions import ServiceRequestError, ServiceResponseError

from pipeline.storage import clients as clients_module
from pipeline.storage import names

KINDS = ("refuse", "drop", "crash")


class Crash(BaseException):
    """The component's process ended here (an injected kill): nothing of it runs on."""


@dataclass
class Plan:
    """Names the run's storage requests; injects the faults ``faults`` (point → kind)."""

    faults: dict[str, str] = field(default_factory=dict)
    component: str = "driver"  # who is calling now (the driver runs one component at a time)
    calls: list[str] = field(default_factory=list)  # each call's point, in order
    hits: list[str] = field(default_factory=list)  # the points faulted, as "kind point"
    dead: set[str] = field(default_factory=set)  # components crashed and not yet restarted
    paused: bool = False  # the driver's own calls: not named, never faulted
    lock: threading.Lock = field(default_factory=threading.Lock)
    _seen: Counter[str] = field(default_factory=Counter)

    def on_request(self, request: Any) -> None:
        if self.paused:
            return
        if self.component in self.dead:
            raise Crash(self.component)
        if request.context.get("bagpipe_refused"):  # the SDK's retry of a refused request
            raise ServiceRequestError("injected: storage unreachable")
        name = f"{self.component} {describe(request.http_request)}"
        with self.lock:
            self._seen[name] += 1
            point = f"{name}#{self._seen[name]}"
            self.calls.append(point)
        kind = self.faults.get(point)
        if kind == "refuse":
            self.hits.append(f"refuse {point}")
            request.context["bagpipe_refused"] = True
            raise ServiceRequestError("injected: storage unreachable")
        if kind:
            request.context["bagpipe_fault"] = (kind, point)

    def on_response(self, response: Any) -> None:
        fault = None if self.paused else response.context.get("bagpipe_fault")
        if fault is None:
            return
        del response.context["bagpipe_fault"]  # once: the SDK's retry is a call of its own
        kind, point = fault
        self.hits.append(f"{kind} {point}")
        if kind == "drop":
            raise ServiceResponseError("injected: the answer was lost")
        self.dead.add(self.component)
        raise Crash(self.component)


_NAMESPACED = re.compile(r"^t[0-9a-f]{10}-?")
_STATUS = re.compile(r'"Status":\s*"(\w+)"')
_ROW_KEYS = re.compile(r"""RowKey='([^']*)'|"RowKey":\s*"([^"]*)\"""")
_INDEXES = re.compile(r"""PartitionKey='(~[a-z]+)|"PartitionKey":\s*"(~[a-z]+)""")
_COMMON = {"PartitionKey", "RowKey", "UpdatedAt", "LastWrite"}
_ROW_KINDS = ((names.ATTEMPT_PREFIX, "attempt"), (names.DEADLINE_PREFIX, "deadline"),
              (names.DISPATCH_PREFIX, "dispatch"), (names.FOLDED_ROW, "folded"), (names.COUNTER_PREFIX, "rollup"),
              (names.FAILURE_PREFIX, "failure"), (names.TILES_ROW, "plan"))


def row_kind(key: str) -> str:
    """The kind of row a RowKey names (a task, an attempt, an index entry, a rollup …)."""
    for prefix, kind in _ROW_KINDS:
        if key.startswith(prefix):
            return kind
    if key.isdigit():
        return "task"
    return {names.JOB_ROW: "job", names.STATUS_ROW: "status"}.get(key, "row")


def _blob_kind(path: str) -> str:
    if path.startswith(names.MARKER_PREFIX):
        return "marker"
    for mark, kind in (("manifest.json", "manifest"), ("stac.json", "stac"), (".overviews/", "overview"),
                       ("/overview/", "overview"), (".packs/", "pack"), ("/logs/", "log")):
        if mark in f"/{path}":
            return kind
    return "blob"


def describe(request: Any) -> str:
    """A storage request as what it does — ``METHOD resource[{kinds}] [statuses written]`` —
    without the run's namespace, keys or ids: the same operation reads the same in every
    run."""
    parts = urlsplit(request.url)
    path = unquote(parts.path).split("/")[2:]  # past the account
    resource = _NAMESPACED.sub("", path[0]) if path else ""
    query = parse_qs(parts.query)
    body = request.body if isinstance(request.body, (str, bytes)) else b""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    kinds: set[str] = set()
    if "(" in resource:  # a table: a row by its keys, or a query
        table, _, keys = resource.partition("(")
        kinds |= {row_kind(a or b) for a, b in _ROW_KEYS.findall(unquote(keys))}
        kinds |= {(a or b).lstrip("~") for a, b in _INDEXES.findall(unquote(keys) + text)}  # a job index's entry
        if table == "jobs" and request.method in ("PATCH", "PUT", "MERGE") and text.startswith("{"):
            fields = sorted(k for k in json.loads(text) if k not in _COMMON and "@" not in k)
            table += f"({','.join(fields)})"  # which write of a job row: a hold, a lease, its mail, its end
        for where in query.get("$filter", []):
            kinds |= {row_kind(a) for a in re.findall(r"RowKey \w+ '([^']*)'", where)}
            kinds |= {kind for prefix, kind in _ROW_KINDS if f"'{prefix}" in where}
        resource = re.sub(r"tasks-\d+", "tasks-N", table)
        kinds.discard("row")
    elif resource == "$batch":
        kinds |= {row_kind(a or b) for a, b in _ROW_KEYS.findall(text)}
    else:
        resource = re.sub(r"tasks-\d+", "tasks-N", resource)
        if len(path) > 1 and path[1] == "messages":
            resource += "/messages" + ("/id" if len(path) > 2 else "") + ("?peek" if "peekonly" in query else "")
        elif len(path) > 1:
            resource += f"/{_blob_kind('/'.join(path[1:]))}" + "".join(f"?{c}" for c in query.get("comp", []))
    written = sorted(set(_STATUS.findall(text)))
    return f"{request.method} {resource}" + (f"{{{','.join(sorted(kinds))}}}" if kinds else "") + (
        f" [{','.join(written)}]" if written else "")


@contextmanager
def hooked(plan: Plan) -> Iterator[None]:
    """Every client built inside names its calls through ``plan``."""
    clients_module.HOOKS.update(raw_request_hook=plan.on_request, raw_response_hook=plan.on_response)
    try:
        yield
    finally:
        clients_module.HOOKS.clear()
