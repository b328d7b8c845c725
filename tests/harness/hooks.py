"""Storage calls counted or watched through the SDK's per-request hooks
(``pipeline.storage.clients.HOOKS``), for the tests and the benchmarks that measure reads."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pipeline.storage import clients as clients_module


@contextmanager
def counting_reads() -> Iterator[list[int]]:
    """Entities the storage answers while the block runs, counted through the SDK's
    per-request hooks: a point read is one (a miss none), a query as many as its pages hold."""
    reads: list[int] = []

    def hook(response: Any) -> None:
        if response.http_request.method != "GET":
            return
        try:
            body = json.loads(response.http_response.text())
        except ValueError:
            return
        if isinstance(body, dict):
            reads.append(len(body["value"]) if "value" in body else int("odata.error" not in body))

    with response_hook(hook):
        yield reads


@contextmanager
def response_hook(hook: Callable[[Any], None]) -> Iterator[None]:
    """Every client built inside calls ``hook`` with each response (the SDK's
    ``raw_response_hook``)."""
    clients_module.HOOKS["raw_response_hook"] = hook
    try:
        yield
    finally:
        clients_module.HOOKS.pop("raw_response_hook", None)


@contextmanager
def request_hook(hook: Callable[[Any], None]) -> Iterator[None]:
    """Every client built inside calls ``hook`` with each request before it is sent (the
    SDK's ``raw_request_hook``)."""
    clients_module.HOOKS["raw_request_hook"] = hook
    try:
        yield
    finally:
        clients_module.HOOKS.pop("raw_request_hook", None)
