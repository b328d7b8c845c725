"""The fault plan of one run of the fault-injection scenario (``bench.fault_run``): the
SDK's per-request hooks number every storage call the run's components make, name each as
an operation that reads the same in every run, and fail one of them — refused before it is
sent, its answer dropped after it applied, or its caller's process crashed there."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from azure.core.exceptions import ServiceRequestError, ServiceResponseError

from pipeline.storage import clients as clients_module

KINDS = ("refuse", "drop", "crash")


class Crash(BaseException):
    """The component's process ended here (an injected kill): nothing of it runs on."""


@dataclass
class Plan:
    """Numbers the run's storage requests; injects one fault."""

    k: int = 0  # the call to fault (0: none)
    kind: str = ""
    # or the first call of this operation, wherever it comes (calls made in parallel, as the
    # finisher's reads are, do not come in the same order in every run)
    operation: str = ""
    component: str = "driver"  # who is calling now (the driver runs one component at a time)
    calls: list[str] = field(default_factory=list)  # what each call was, in order
    hit: str = ""  # the call faulted
    dead: set[str] = field(default_factory=set)  # components crashed and not yet restarted
    paused: bool = False  # the driver's own calls: not numbered, never faulted
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_request(self, request: Any) -> None:
        if self.paused:
            return
        if self.component in self.dead:
            raise Crash(self.component)
        if request.context.get("bagpipe_refused"):
            raise ServiceRequestError("injected: storage unreachable")
        with self.lock:
            self.calls.append(f"{self.component} {describe(request.http_request)}")
            number = len(self.calls)
            if self.operation and not self.k and self.calls[-1].endswith(self.operation):
                self.k = number
        request.context["bagpipe_call"] = number
        if number == self.k and self.kind == "refuse":
            self.hit = self.calls[-1]
            request.context["bagpipe_refused"] = True
            raise ServiceRequestError("injected: storage unreachable")

    def on_response(self, response: Any) -> None:
        if self.paused or response.context.get("bagpipe_call") != self.k or self.hit:
            return
        self.hit = self.calls[self.k - 1]
        if self.kind == "drop":
            raise ServiceResponseError("injected: the answer was lost")
        if self.kind == "crash":
            self.dead.add(self.component)
            raise Crash(self.component)


_NAMESPACED = re.compile(r"^t[0-9a-f]{10}-?")
_STATUS = re.compile(r'"Status":\s*"(\w+)"')


def describe(request: Any) -> str:
    """A storage request as ``METHOD resource [statuses written]``, without the run's
    namespace or keys: the same operation reads the same in every run."""
    parts = urlsplit(request.url)
    path = unquote(parts.path).split("/")[2:]  # past the account
    resource = _NAMESPACED.sub("", path[0]) if path else ""
    resource = re.sub(r"\(.*\)", "()", re.sub(r"tasks-\d+", "tasks-N", resource))
    if len(path) > 1 and path[1] == "messages":
        resource += "/messages" + ("/id" if len(path) > 2 else "")
    elif len(path) > 1:
        resource += "/blob"
    body = request.body if isinstance(request.body, (str, bytes)) else b""
    written = sorted(set(_STATUS.findall(body.decode(errors="replace") if isinstance(body, bytes) else body)))
    return f"{request.method} {resource}" + (f" [{','.join(written)}]" if written else "")


@contextmanager
def hooked(plan: Plan) -> Iterator[None]:
    """Every client built inside numbers its calls through ``plan``."""
    clients_module.HOOKS.update(raw_request_hook=plan.on_request, raw_response_hook=plan.on_response)
    try:
        yield
    finally:
        clients_module.HOOKS.clear()
